"""A site's own policy over the shipped profiles: `/etc/nodecert/site.yaml` (docs/checks.md,
"Tuning for your site").

The thresholds a run judges with come in layers: generic (checks/profiles/generic.yaml) → the GPU
model's profile (checks/profiles/<model>.yaml, which extends generic) → the site file, which the
operator owns and the package never overwrites. The site file holds only what a site may decide:

    profile:              # over every model's profile: the keys of checks/schema/profile.schema.json
      ecc: {sbe_warn_count: 50}
    models:               # over one model's profile, after `profile`
      h100-sxm:
        thresholds: {allreduce_busbw_gbs: 440}
        collective: {floor_bytes: 17179869184}
    skip: [bmc-sensors]   # checks this site never runs (ids or tags, as --skip)

It is validated against the profiles' own schema (an unknown key, a wrong type, a floor without
the size it is judged at) and refused when it changes what a model *is* rather than what the
site accepts (IDENTITY: how a model is matched, its memory, peaks, GPU count): one `error:` line,
exit 2, before any check runs. The run records the file, its SHA-256 and the keys it changed
(`site` in the report), so a fleet sees which nodes ran under which policy.

Which file: `--site FILE`, else $NODECERT_SITE (a name that does not exist is an error: a typo
must not mean "no policy"), else DEFAULT when it exists. A scenario run (--simulate) reads only a
file named with --site or $NODECERT_SITE: the machine's own policy is not the scenario's.

`python -m checks.site FILE` validates a file and prints what it changes (exit 0), or one
`error:` line (exit 2): the pytorch role runs it before a new file replaces the old one.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT = "/etc/nodecert/site.yaml"
ENV = "NODECERT_SITE"
SECTIONS = ("profile", "models", "skip")
# What a model is, not what a site accepts: changing these would judge one GPU as another.
IDENTITY = ("match", "extends", "name", "description", "memory_gib", "peaks", "gpus_per_node",
            "compute_capability")
MAX_BYTES = 1 << 20


class SiteError(Exception):
    """A site file that cannot be used (one-line message)."""


@dataclass
class Site:
    path: str
    sha256: str
    profile: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    skip: list[str] = field(default_factory=list)

    def overlay(self, model: str) -> dict[str, Any]:
        """What this site changes in `model`'s profile: `profile`, then `models.<model>`."""
        from checks.profiles import merge

        return merge(self.profile, self.models.get(model, {}))

    def record(self, model: str) -> dict[str, Any]:
        """The report's `site`: the file, its digest, the keys it changed for this model."""
        return {"file": self.path, "sha256": self.sha256,
                "changed": sorted(dotted_keys(self.overlay(model))), "skip": list(self.skip)}


def dotted_keys(node: Any, where: str = "") -> list[str]:
    """The leaves of a mapping as dotted keys (`ecc.sbe_warn_count`); a list is one leaf."""
    if not isinstance(node, dict) or not node:
        return [where] if where else []
    out: list[str] = []
    for key, value in node.items():
        out += dotted_keys(value, f"{where}.{key}" if where else str(key))
    return out


def _check_overlay(data: Any, where: str) -> dict[str, Any]:
    from checks import profiles

    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SiteError(f"{where}: must be a mapping of profile keys")
    fixed = [k for k in IDENTITY if k in data]
    if fixed:
        raise SiteError(f"{where}: {', '.join(fixed)} describe(s) the GPU model, not the site's "
                        "policy: a site file may not change them (use --profile to judge as "
                        "another model)")
    bad = profiles.not_finite(data)
    if bad:
        raise SiteError(f"{where}.{bad}: not a finite number")
    try:
        profiles.validate(data, where)
    except profiles.ProfileError as exc:
        raise SiteError(str(exc)) from None
    return data


def parse(text: str, path: str) -> Site:
    """A site file's text, checked: SiteError (one line) when it cannot be used."""
    from checks import profiles, safeyaml

    try:
        data = safeyaml.load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise SiteError(f"{path}: cannot parse: {' '.join(str(exc).split())}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SiteError(f"{path}: top level must be a mapping with {', '.join(SECTIONS)}")
    unknown = sorted(str(k) for k in data if k not in SECTIONS)
    if unknown:
        raise SiteError(f"{path}: unknown key {', '.join(unknown)} (a site file has "
                        f"{', '.join(SECTIONS)}: docs/checks.md, 'Tuning for your site')")
    models = data.get("models") or {}
    if not isinstance(models, dict):
        raise SiteError(f"{path}: models must map a profile name to its keys")
    known = set(profiles.available())
    for name in models:
        if name not in known:
            raise SiteError(f"{path}: models.{name}: no such profile (available: "
                            f"{', '.join(sorted(known))})")
    skip = data.get("skip") or []
    if not isinstance(skip, list) or not all(isinstance(s, str) and s for s in skip):
        raise SiteError(f"{path}: skip must be a list of check ids or tags")
    return Site(path=path, sha256=hashlib.sha256(text.encode()).hexdigest(),
                profile=_check_overlay(data.get("profile"), f"{path}: profile"),
                models={str(n): _check_overlay(v, f"{path}: models.{n}") for n, v in models.items()},
                skip=[str(s) for s in skip])


def read(path: str) -> Site:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SiteError(f"cannot read site file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise SiteError(f"{path}: larger than {MAX_BYTES} bytes: not a site file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SiteError(f"{path}: not UTF-8 text") from None
    return parse(text, path)


def locate(option: str | None, *, simulated: bool, environ: Any = os.environ) -> str | None:
    """The site file this run reads (see the module docstring), or None."""
    if option:
        return option
    named = environ.get(ENV)
    if named:
        if not os.path.exists(named):
            raise SiteError(f"{ENV}={named}: no such file")
        return str(named)
    if simulated:
        return None
    return DEFAULT if os.path.exists(DEFAULT) else None


def load(option: str | None, *, simulated: bool) -> Site | None:
    path = locate(option, simulated=simulated)
    return read(path) if path else None


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m checks.site FILE (validate a site file; docs/checks.md)",
              file=sys.stderr)
        return 2
    try:
        site = read(args[0])
    except SiteError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    changed = dotted_keys(site.profile)
    for name, over in sorted(site.models.items()):
        changed += [f"models.{name}.{k}" for k in dotted_keys(over)]
    print(f"{site.path}: valid; changes {', '.join(changed) or 'no threshold'}"
          f"{'; skips ' + ', '.join(site.skip) if site.skip else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
