"""One configuration: what provisioning installed (/etc/nodecert/expect.yaml, written by the
pytorch role) is what `python -m checks` expects unless its command line says otherwise; a
scenario ignores the file; a broken file is one line and exit 2. The role's template is rendered
with Ansible's own templating here, so the file the role writes is the file the loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from checks.node import expectations, node_cli

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expect.yaml"
    path.write_text(text)
    return path


def test_no_file_means_no_expectations(tmp_path: Path) -> None:
    assert expectations.load(tmp_path / "absent.yaml") == expectations.Expectations()


def test_a_provisioned_node_file(tmp_path: Path) -> None:
    got = expectations.load(write(tmp_path, 'gpus: 8\ngpu_ids: ["10DE:2330"]\ndriver: "580"\ncuda: "12.8"\n'))
    assert (got.gpus, got.gpu_ids, got.driver, got.cuda) == (8, ("10de:2330",), "580", "12.8")


@pytest.mark.parametrize(("text", "message"), [
    ("gpus: eight\n", "gpus must be a whole number"),
    ("gpus: true\n", "gpus must be a whole number"),
    ("driver: latest\n", "driver must look like"),
    ("cuda: 12\n", "cuda must look like"),
    ("gpu: 8\n", "unknown key gpu"),
    ("gpu_ids: 2330\n", "gpu_ids must be a list"),
    ("gpu_ids: []\n", "gpu_ids must be a list"),
    ('gpu_ids: ["2330"]\n', "gpu_ids must look like"),
    ("- 8\n", "must be a mapping"),
    ("gpus: [\n", "cannot read"),
])
def test_a_broken_file_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(expectations.ExpectationsError, match=message) as info:
        expectations.load(write(tmp_path, text))
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)


def _run(monkeypatch, tmp_path: Path, file_text: str | None, *args: str) -> tuple[int, dict]:
    if file_text is None:
        monkeypatch.setenv(expectations.ENV, "")
    else:
        monkeypatch.setenv(expectations.ENV, str(write(tmp_path, file_text)))
    out = tmp_path / "report.json"
    rc = node_cli.main([*args, "--only", "pci-gpus", "--json", str(out), "-q"])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def test_this_node_expects_what_provisioning_installed(monkeypatch, tmp_path: Path) -> None:
    """This machine has no GPU; provisioning said 8: pci-gpus fails, through the real backend."""
    rc, report = _run(monkeypatch, tmp_path, "gpus: 8\n")
    assert rc == 1 and report["options"]["expect_gpus"] == 8
    assert report["options"]["expectations_file"].endswith("expect.yaml")
    [check] = [c for c in report["checks"] if c["id"] == "pci-gpus"]
    assert check["status"] == "FAIL"


def test_the_command_line_wins_over_the_file(monkeypatch, tmp_path: Path) -> None:
    rc, report = _run(monkeypatch, tmp_path, "gpus: 8\n", "--expect-gpus", "0")
    assert report["options"].get("expect_gpus") == 0 and rc == 0


def test_a_scenario_ignores_the_file(monkeypatch, tmp_path: Path) -> None:
    rc, report = _run(monkeypatch, tmp_path, "gpus: 2\n", "--simulate", "h100-sxm-8x-healthy")
    assert rc == 0 and "expectations_file" not in report["options"]


def test_a_broken_file_is_exit_2(monkeypatch, tmp_path: Path, capsys) -> None:
    rc, _ = _run(monkeypatch, tmp_path, "gpus: eight\n")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "gpus must be a whole number" in err[0]


def _render(variables: dict) -> str:
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    tasks = yaml.safe_load((ROOT / "playbooks/roles/pytorch/tasks/verify.yml").read_text())
    [task] = [t for t in tasks if t["name"].startswith("Write what provisioning installed")]
    content = task["ansible.builtin.copy"]["content"]
    try:  # ansible-core 2.19 templates only strings trusted as templates (as a role's are)
        from ansible.template import trust_as_template

        content = trust_as_template(content)
    except ImportError:
        pass
    return str(Templar(loader=DataLoader(), variables=variables).template(content))


H100_SXM = {"device_id": "2330", "model": "H100 SXM5 80GB"}


@pytest.mark.parametrize(("variables", "expected"), [
    ({"nodecert_node": {"gpus": [H100_SXM] * 8}, "nvidia_driver_branch": "580",
      "cuda_toolkit_version": "12.8"},
     (8, ("10de:2330",), "580", "12.8")),
    ({"nodecert_node": {"gpus": [H100_SXM, {"device_id": "2335"}]}, "nvidia_driver_branch": "580",
      "cuda_toolkit_version": "12.8"},
     (2, ("10de:2330", "10de:2335"), "580", "12.8")),
    ({"nodecert_node": {"gpus": []}, "nvidia_driver_branch": "580", "cuda_toolkit_version": "12.8"},
     (None, None, None, "12.8")),
])
def test_the_role_writes_what_the_loader_reads(tmp_path: Path, variables: dict, expected: tuple) -> None:
    got = expectations.load(write(tmp_path, _render(variables)))
    assert (got.gpus, got.gpu_ids, got.driver, got.cuda) == expected


def _gpu_count(monkeypatch, tmp_path: Path, file_text: str, *args: str) -> dict:
    """gpu-count on the healthy HGX H100 scenario with the expectations of a provisioned node
    (the scenario is replayed as this node: NODECERT_EXPECTATIONS is read for it here)."""
    monkeypatch.setattr(node_cli, "_provisioned",
                        lambda _args: expectations.load(write(tmp_path, file_text)))
    out = tmp_path / "report.json"
    node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--only", "gpu-count", *args,
                   "--json", str(out), "-q"])
    [check] = json.loads(out.read_text())["checks"]
    return check


def test_the_model_provisioning_saw_passes(monkeypatch, tmp_path: Path) -> None:
    check = _gpu_count(monkeypatch, tmp_path, 'gpus: 8\ngpu_ids: ["10de:2330"]\n')
    assert check["status"] == "PASS", check


def test_another_model_than_provisioning_saw_fails(monkeypatch, tmp_path: Path) -> None:
    """The expectations of an H200 board (10de:2335) on the H100 scenario's node."""
    check = _gpu_count(monkeypatch, tmp_path, 'gpus: 8\ngpu_ids: ["10de:2335"]\n')
    assert check["status"] == "FAIL", check
    message = check["results"][0]["message"]
    assert "10de:2330 on the bus, expected 10de:2335" in message and "provisioned for" in message


def test_the_command_line_names_the_model(monkeypatch, tmp_path: Path, capsys) -> None:
    check = _gpu_count(monkeypatch, tmp_path, "gpus: 8\n", "--expect-gpu-ids", "10de:2335")
    assert check["status"] == "FAIL"
    capsys.readouterr()
    rc = node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--expect-gpu-ids", "H100", "--list"])
    err = capsys.readouterr().err
    assert rc == 2 and "argument --expect-gpu-ids: gpu_ids must look like" in err
