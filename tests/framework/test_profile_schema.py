"""Profiles have a schema (checks/schema/profile.schema.json): every key with its type and unit,
every default written once (in checks/profiles/generic.yaml), unknown keys and wrong types are
load errors naming the file and the key, and the code looks up only keys the schema knows,
without a second default of its own."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from checks import profiles
from checks.node import node_cli

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"[a-z0-9_]+(\.[a-z0-9_\-]+)+")


def schema() -> dict:
    return json.loads(profiles.SCHEMA.read_text())


def schema_node(dotted: str) -> dict | None:
    node = schema()
    for part in dotted.split("."):
        props = node.get("properties") or {}
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def profile_lookups() -> list[tuple[str, int, str, ast.expr | None]]:
    """(file, line, dotted key, code default) of every `.get("a.b")` / `.require("a.b")` call."""
    found = []
    for path in [*(ROOT / "checks").rglob("*.py"), *(ROOT / "trainer").rglob("*.py")]:
        if "docgen" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("get", "require") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and DOTTED.fullmatch(node.args[0].value)):
                default = node.args[1] if len(node.args) > 1 else None
                found.append((str(path.relative_to(ROOT)), node.lineno, node.args[0].value, default))
    return found


@pytest.mark.parametrize("name", profiles.available())
def test_every_shipped_profile_validates(name: str) -> None:
    """Validated here, explicitly: at run time a profile whose text the digest table lists
    (checks/schema/profile-digests.json) is not validated again, so this is where it is."""
    import yaml

    profiles.validate(yaml.safe_load((profiles.PROFILE_DIR / f"{name}.yaml").read_text()),
                      f"checks/profiles/{name}.yaml")
    profiles.load(name)


def test_the_digest_table_is_the_shipped_profiles() -> None:
    import hashlib

    table = json.loads(profiles.DIGESTS.read_text())["sha256"]
    assert table == {n: hashlib.sha256((profiles.PROFILE_DIR / f"{n}.yaml").read_bytes()).hexdigest()
                     for n in profiles.available()}, "run: python -m checks.docgen.profile_digests --write"


def test_a_profile_edited_in_place_is_validated_again(tmp_path, monkeypatch) -> None:
    """A text the table does not list (an operator's edit of an installed profile) is validated on
    every load, as before the table: a typo is still a load error naming the file and the key."""
    import shutil

    for path in profiles.PROFILE_DIR.glob("*.yaml"):
        shutil.copy(path, tmp_path / path.name)
    edited = tmp_path / "h100-sxm.yaml"
    edited.write_text(edited.read_text() + "ecc: {volatile_uncorected_max: 0}\n")
    monkeypatch.setattr(profiles, "PROFILE_DIR", tmp_path)
    profiles._parse.cache_clear()
    try:
        with pytest.raises(profiles.ProfileError, match=r"unknown key ecc\.volatile_uncorected_max"):
            profiles.load("h100-sxm")
        profiles.load("a100-80gb")  # unchanged texts still load
    finally:
        profiles._parse.cache_clear()


def test_a_typo_is_a_load_error_naming_file_and_key() -> None:
    with pytest.raises(profiles.ProfileError, match=r"x\.yaml: unknown key ecc\.volatile_uncorected_max"):
        profiles.validate({"ecc": {"volatile_uncorected_max": 0}}, "x.yaml")


def test_a_wrong_type_is_a_load_error_naming_file_and_key() -> None:
    with pytest.raises(profiles.ProfileError,
                       match=r"x\.yaml: ecc\.required: 'yes' is not of type 'boolean'"):
        profiles.validate({"ecc": {"required": "yes"}}, "x.yaml")
    with pytest.raises(profiles.ProfileError, match=r"x\.yaml: pcie\.min_gen: .* not of type 'number'"):
        profiles.validate({"pcie": {"min_gen": "3"}}, "x.yaml")


def test_a_broken_shipped_profile_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("generic", "h100-sxm"):
        (folder / f"{name}.yaml").write_text((ROOT / "checks/profiles" / f"{name}.yaml").read_text())
    broken = folder / "h100-sxm.yaml"
    broken.write_text(broken.read_text().replace("mem_bw_gbs: 1905", "mem_bw_gbps: 1905"))
    monkeypatch.setattr(profiles, "PROFILE_DIR", folder)
    rc = node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--profile", "h100-sxm", "--level", "quick",
                        "--no-json", "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "h100-sxm.yaml: unknown key thresholds.mem_bw_gbps" in err[0]


def test_every_schema_leaf_has_a_type_and_numbers_have_units_where_the_name_says() -> None:
    def walk(node: dict, path: str) -> list[str]:
        bad = [] if "type" in node else [path]
        for key, child in (node.get("properties") or {}).items():
            bad += walk(child, f"{path}.{key}" if path else key)
        return bad
    assert not walk(schema(), "")
    for suffix, unit in (("_bytes", "bytes"), ("_gbs", "GB/s"), ("_s", "s"), ("_tflops", "TFLOP/s")):
        for key in profile_lookups():
            node = schema_node(key[2])
            if key[2].endswith(suffix) and node and "number" in node.get("type", ""):
                assert node.get("x-unit") == unit, key


def test_generic_holds_a_default_for_every_key_the_code_reads_without_one() -> None:
    generic = profiles.load("generic")
    unknown = [f"{f}:{n} {k}" for f, n, k, _ in profile_lookups() if schema_node(k) is None]
    assert not unknown, f"the code reads profile keys the schema does not know: {unknown}"
    twice = [f"{f}:{n} {k} (code {ast.unparse(d)}, generic.yaml {generic.get(k)!r})"
             for f, n, k, d in profile_lookups() if d is not None and generic.get(k) is not None]
    assert not twice, ("defaults written twice, in the code and in generic.yaml (keep generic.yaml's): "
                       f"{twice}")
