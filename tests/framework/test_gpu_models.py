"""A GPU model is one profile: the preflight role's model and platform tables are generated from
checks/profiles/*.yaml (`python -m checks.docgen.preflight_models`), its architecture table
agrees with every profile, and docs/contributing.md's "Adding a GPU model" checklist holds for
every profile.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from checks import profiles
from checks.docgen import preflight_models as models
from checks.hw.scenario_file import load_scenario, merge, shipped

ROOT = Path(__file__).resolve().parents[2]
VARS_TEXT = models.VARS.read_text()
TABLES = yaml.safe_load(VARS_TEXT)
MODELS = [p for p in map(profiles.load, profiles.available()) if p.name != profiles.GENERIC]
# Profiles no shipped scenario selects yet. Exact: a new profile without a scenario fails below,
# and so does a listed one that gains a scenario (then drop it from here).
NO_SCENARIO_YET = {"a10", "b300", "gb300-nvl72", "gh200-144g", "l4", "l40s"}


def test_the_vars_file_is_generated_and_agrees_with_the_profiles(capsys) -> None:
    assert models.main(["--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("profile", MODELS, ids=lambda p: p.name)
def test_every_pci_id_of_every_profile_is_a_model_row(profile: profiles.Profile) -> None:
    """Read back from the file as Ansible reads it, not from the generator's own output."""
    ids = [f"{int(i):04x}" for i in profile.get("match.pci_device_ids") or []]
    assert ids, f"{profile.name}: no match.pci_device_ids (provisioning would not know the model)"
    plain = [n.strip("^$").removeprefix("NVIDIA ") for n in profile.get("match.names")]
    for dev in ids:
        assert TABLES["_preflight_gpu_models"].get(dev) in plain, f"{profile.name}: {dev}"


def test_no_model_row_is_written_twice() -> None:
    """YAML keeps the last of two equal keys: a hand row would silently rename a profile's."""
    block = VARS_TEXT.split("_preflight_gpu_models:\n", 1)[1].split("\n\n", 1)[0]
    keys = re.findall(r'^  "([0-9a-f]{4})":', block, re.MULTILINE)
    assert keys and len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


def test_platform_rules_are_the_blackwell_profiles() -> None:
    rules = {r["name"]: r for r in TABLES["_preflight_platforms"] if "device_ids" in r}
    expected = {
        "hgx-b200": {"device_ids": ["2901"], "min_gpus": 8, "fabric": "nvlink5"},
        "hgx-b300": {"device_ids": ["3182"], "min_gpus": 8, "fabric": "nvlink5"},
        "gb200-nvl72-tray": {"device_ids": ["2941"], "fabric": "imex"},
        "gb300-nvl72-tray": {"device_ids": ["31c2", "31c3"], "fabric": "imex"},
    }
    assert {name: {k: v for k, v in r.items() if k != "name"} for name, r in rules.items()} == expected
    # The generated rules come before the catch-all ones (first match wins).
    names = [r["name"] for r in TABLES["_preflight_platforms"]]
    assert names.index("pcie") > max(names.index(n) for n in expected)


def _with(monkeypatch, name: str, change) -> None:
    """The generator sees profile `name` changed by `change(data)`; the files stay as they are."""
    originals = models.model_profiles()

    def patched() -> list[profiles.Profile]:
        out = []
        for profile in originals:
            data = copy.deepcopy(profile.data)
            if profile.name == name:
                change(data)
            out.append(profiles.Profile(name=profile.name, data=data))
        return out

    monkeypatch.setattr(models, "model_profiles", patched)


@pytest.mark.parametrize(
    ("name", "change", "says"),
    [
        ("b200", lambda d: d["match"]["pci_device_ids"].append(0x2902), "out of date"),
        ("h100-sxm", lambda d: d["match"].update(names=["^NVIDIA H100 SXM5 80GB$"]), "out of date"),
        ("b200", lambda d: d["blackwell"]["fabric"].pop("nvlsm_unit"), "out of date"),
        ("gb200-nvl72", lambda d: d.update(gpus_per_node=8, blackwell={**d["blackwell"], "platform": "hgx"}),
         "without the fabric it needs"),
        ("b200", lambda d: d.update(compute_capability="9.0"), "falls in the Blackwell range"),
        ("b200", lambda d: d["blackwell"].pop("open_module_required"), "kernel_modules open_required"),
        ("h100-sxm", lambda d: d.update(blackwell={"open_module_required": True}), "open_recommended"),
        ("l4", lambda d: d["match"]["pci_device_ids"].append(0x0100), "in 0 _preflight_gpu_architectures"),
        ("l4", lambda d: d.update(compute_capability="13.7"), "has no architecture"),
        ("l4", lambda d: d["match"]["pci_device_ids"].append(0x2330), "in two profiles"),
        ("l4", lambda d: d["match"].update(names=["^NVIDIA L4.*$"]), "not a plain anchored name"),
    ],
)
def test_check_fails_when_a_profile_and_the_table_differ(monkeypatch, capsys, name, change, says) -> None:
    _with(monkeypatch, name, change)
    assert models.main(["--check"]) in (1, 2)
    err = capsys.readouterr().err
    assert says in err and err.startswith("error: ")


def test_write_puts_a_new_id_in_both_tables(monkeypatch, tmp_path) -> None:
    target = tmp_path / "main.yml"
    target.write_text(VARS_TEXT)
    monkeypatch.setattr(models, "VARS", target)
    monkeypatch.setattr(models, "ROOT", tmp_path)
    _with(monkeypatch, "b200", lambda d: d["match"]["pci_device_ids"].append(0x2902))
    assert models.main(["--write"]) == 0
    tables = yaml.safe_load(target.read_text())
    assert tables["_preflight_gpu_models"]["2902"] == "B200"
    assert [r["device_ids"] for r in tables["_preflight_platforms"] if r["name"] == "hgx-b200"] == [
        ["2901", "2902"]]
    assert models.main(["--check"]) == 0
    assert target.read_text().count("# profile-models:begin") == 1


def test_bad_input_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys) -> None:
    assert models.main(["--frobnicate"]) == 2
    assert "usage:" in capsys.readouterr().err
    target = tmp_path / "main.yml"
    target.write_text(VARS_TEXT.replace("# profile-platforms:end", ""))
    monkeypatch.setattr(models, "VARS", target)
    monkeypatch.setattr(models, "ROOT", tmp_path)
    assert models.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "profile-platforms:end" in err and len(err.splitlines()) == 1


def _selected_by_shipped_scenarios() -> set[str]:
    selected = set()
    for scenario in shipped():
        data = load_scenario(scenario)
        gpus = [merge(data.get("gpu_defaults") or {}, g or {}) for g in data.get("gpus") or []]
        ids = [g["pci_device_id"] for g in gpus if isinstance(g.get("pci_device_id"), int)]
        names = [g["name"] for g in gpus if isinstance(g.get("name"), str)]
        selected.add(profiles.detect(ids, names).name)
    return selected


def test_adding_a_gpu_model_checklist_holds_for_every_profile() -> None:
    """docs/contributing.md's checklist: a profile, a shipped scenario that selects it, and the
    generator; the checklist names the commands this test and the one above run."""
    section = (ROOT / "docs" / "contributing.md").read_text().split("### Adding a GPU model", 1)
    assert len(section) == 2, "docs/contributing.md lost its 'Adding a GPU model' checklist"
    checklist = section[1].split("\n#", 1)[0]
    for needed in ("checks/profiles/", "checks/scenarios/", f"python -m {models.PROG} --write",
                   "tests/framework/test_gpu_models.py"):
        assert needed in checklist, f"the checklist no longer says {needed!r}"
    missing = {p.name for p in MODELS} - _selected_by_shipped_scenarios()
    assert missing == NO_SCENARIO_YET, (
        f"profiles no shipped scenario selects: {sorted(missing - NO_SCENARIO_YET)} (add one); "
        f"listed as missing but now covered: {sorted(NO_SCENARIO_YET - missing)} (drop from the list)")
