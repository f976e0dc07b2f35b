"""The environment variables a report or a recording keeps: an allow-list of the names NCCL,
torch, CUDA and the container toolkit document (checks/schema/recorded-env.yaml, each entry with
its source), values of secret-looking names or values masked. Read by the report (node side) and
by the measurement launchers (hardware layer), so it imports nothing of either."""

from __future__ import annotations

import functools
import os
import re

from checks import resources

ENV_ALLOWLIST_PATH = resources.data("schema", "recorded-env.yaml")
MASKED = "<masked>"
# A name that looks like it holds a secret: its value is never written, whatever the allow-list.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|PRIVATE|COOKIE|"
                         r"SESSION|SIGNATURE|CERT|(?:^|_)PASS(?:_|$)|(?:^|_)PWD(?:_|$)", re.IGNORECASE)
# A value that carries a secret whatever its name: URL credentials (scheme://user:pass@host; the
# password may hold `/`, `:` or `?` unencoded, so anything up to the last `@` counts), a query
# parameter named like a secret (?token=..., &X-Amz-Signature=...), NVIDIA API keys (nvapi-...),
# the prefixed tokens of the services a training node pulls from (GitHub ghp_/gho_/ghu_/ghs_/ghr_
# and github_pat_, GitLab glpat-, Hugging Face hf_, Slack xox?-, AWS access key ids AKIA...), and
# an HTTP Authorization header or its Bearer/Basic credentials, which carry no `=`.
SECRET_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:\S*@|\bnvapi-|"
                          r"[?&;][^=\s&;#]*(?:KEY|TOKEN|SECRET|PASS|PWD|SIG|AUTH|CREDENTIAL|SESSION)"
                          r"[^=\s&;#]*=|"
                          r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|glpat-[\w-]{20,}|"
                          r"hf_[A-Za-z0-9]{20,}|xox[abprs]-[\w-]{10,}|AKIA[0-9A-Z]{16})|"
                          r"\bAuthorization\s*:|\b(?:Bearer|Basic)\s+[\w.~+/=-]{8,}", re.IGNORECASE)


@functools.cache
def env_allowlist() -> tuple[tuple[str, ...], frozenset[str]]:
    """(prefixes, names) of checks/schema/recorded-env.yaml."""
    import yaml

    entries = yaml.safe_load(ENV_ALLOWLIST_PATH.read_text())
    prefixes = tuple(e["prefix"] for e in entries if "prefix" in e)
    names = frozenset(e["name"] for e in entries if "name" in e)
    return prefixes, names


def env_recorded(name: str) -> bool:
    prefixes, names = env_allowlist()
    return name in names or name.startswith(prefixes)


def env_value(name: str, value: str) -> str:
    """The value as written into a report: masked when the name or the value looks like a
    secret; bytes the environment could not decode (lone surrogates) as \\xNN."""
    if SECRET_NAME.search(name) or SECRET_VALUE.search(value):
        return MASKED
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def recorded_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables of `environ` (default: this process's), secrets masked."""
    environ = dict(os.environ if environ is None else environ)
    return {k: env_value(k, str(v)) for k, v in sorted(environ.items()) if env_recorded(k)}
