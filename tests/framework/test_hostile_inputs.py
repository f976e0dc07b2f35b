"""Scenario and profile YAML, and the options of `python -m checks` and `python -m trainer`: a
wrong type, a YAML alias bomb, a profile name that is a path, NaN where a number is wanted are each
one error line naming the file and key, exit 2; never a traceback, never a hang."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from checks import profiles, safeyaml
from checks.node import expectations, node_cli
from trainer.trainer_cli import main as trainer_main


def _bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["description: alias bomb", "extends: h100-sxm-8x-healthy",
             "x0: &x0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    with pytest.raises(safeyaml.AliasBomb, match="aliases expand to more than"):
        safeyaml.load(_bomb())


def test_ordinary_anchors_and_merge_keys_still_load() -> None:
    assert safeyaml.load("a: &gpu {name: H100}\nb: *gpu\nc: {<<: *gpu, index: 1}\n") == {
        "a": {"name": "H100"}, "b": {"name": "H100"}, "c": {"name": "H100", "index": 1}}


def _simulate(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = node_cli.main(["--simulate", str(path), "--level", "quick", "--no-json", "-q"])
    return code, capsys.readouterr().err.strip().splitlines()


def test_a_scenario_alias_bomb_is_one_line_exit_2(tmp_path, capsys) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    code, err = _simulate(path, capsys)
    assert code == 2 and len(err) == 1 and str(path) in err[0] and "aliases expand" in err[0]


TYPE_ERRORS = {
    "host.env": {"host": {"env": ["NCCL_DEBUG=INFO"]}},
    "host.os_release": {"host": {"os_release": "ubuntu"}},
    "host.kernel_log": {"host": {"kernel_log": "NVRM: Xid 79"}},
    "host.numa_nodes": {"host": {"numa_nodes": [0, 1]}},
    "host.services": {"host": {"services": ["nvidia-fabricmanager"]}},
    "host.imex_nodes": {"host": {"imex_nodes": 5}},
    "host.cpu_count": {"host": {"cpu_count": "many"}},
    "driver.version": {"driver": {"version": 550}},
    "driver.cuda_version": {"driver": {"cuda_version": "twelve"}},
    "torch.device_count": {"torch": {"device_count": "two"}},
    "gpu_defaults.link": {"gpu_defaults": {"link": "x16"}},
    "gpu_defaults.pci_device_id": {"gpu_defaults": {"pci_device_id": "abc"}},
    "gpu_defaults.name": {"gpu_defaults": {"name": 5}},
    "nvswitches": {"nvswitches": 4},
    "gpus": {"gpus": 5},
    "'rdma'": {"rdma": "mlx5_0"},
    "gpu_overrides": {"gpu_overrides": [1]},
    "'extends'": {"extends": 5},
}


@pytest.mark.parametrize("key", TYPE_ERRORS)
def test_a_scenario_type_error_names_file_and_key(tmp_path, capsys, key) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump({"description": "test: a wrong type", "extends": "h100-sxm-8x-healthy",
                                    **TYPE_ERRORS[key]}))
    code, err = _simulate(path, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {path}") and key in err[0], err


@pytest.mark.parametrize("name", ["../../../tmp/evil", "/etc/passwd", "h100-sxm/../generic", "a b"])
def test_a_profile_name_is_never_a_path(name, capsys) -> None:
    assert node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--profile", name, "--no-json", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown profile" in err[0]


@pytest.mark.parametrize(("text", "message"), [
    ("thresholds: {matmul_bf16_tflops: .nan}\n", "thresholds.matmul_bf16_tflops: not a finite number"),
    ("straggler_pct: .inf\n", "straggler_pct: not a finite number"),
    (_bomb(), "aliases expand"),
    ("thresholds: [unclosed\n", "cannot parse"),
])
def test_a_bad_profile_file_is_a_profile_error(tmp_path, monkeypatch, text, message) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(profiles, "PROFILE_DIR", tmp_path)
    with pytest.raises(profiles.ProfileError, match=message.replace(".", r"\.")):
        profiles.load("bad")


@pytest.mark.parametrize("argv", [
    ["--steps", "0"], ["--lr", "nan"], ["--timeout", "inf"], ["--stall", "-1"], ["--nnodes", "0"],
    ["--node-rank", "-1"], ["--rtol", "nan"], ["--batch-size", "x"], ["--nproc", "0"],
    ["--hidden", "1e9"],
])
def test_trainer_options_are_validated_before_anything_starts(argv, capsys) -> None:
    assert trainer_main(["ddp", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"error: argument {argv[0]}: " in err.strip().splitlines()[-1]


def test_one_large_string_aliased_many_times_is_refused() -> None:
    # 3 001 nodes, under the node bound, but 3 000 x 100 kB of characters once written out
    text = "big: &s " + "x" * 100_000 + "\nmany: [" + ", ".join(["*s"] * 3000) + "]\n"
    with pytest.raises(safeyaml.AliasBomb, match=r"more than \d+ characters"):
        safeyaml.load(text)


def test_deep_nesting_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(safeyaml.AliasBomb, match="nested deeper than"):
        safeyaml.load("[" * 5000 + "]" * 5000)
    assert safeyaml.load("[" * 20 + "]" * 20) is not None


@pytest.mark.parametrize(("text", "reason"), [
    ("gpus: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than"),
    ("gpus: &s " + "x" * 30_000 + "\ncuda: [" + ", ".join(["*s"] * 300) + "]\n", "characters"),
    (_bomb().replace("x0:", "gpus:").replace("*x0", "*x0"), "aliases expand to more than")],
    ids=["deep", "aliased-string", "alias-bomb"])
def test_a_hostile_expect_yaml_is_one_line(text, reason, tmp_path) -> None:
    path = tmp_path / "expect.yaml"
    path.write_text(text)
    with pytest.raises(expectations.ExpectationsError) as info:
        expectations.load(path)
    message = str(info.value)
    assert reason in message and "\n" not in message and message.startswith(str(path)), message


NONSENSE_GPUS = {
    # NVML's counters are unsigned: no GPU reports a negative one.
    "gpus[3].ecc_volatile_uncorrected must be a non-negative count":
        {"gpu_overrides": {3: {"ecc_volatile_uncorrected": -1}}},
    "gpus[0].retired_pages_dbe must be a non-negative count":
        {"gpu_defaults": {"retired_pages_dbe": -5}},
    # Two GPUs with one UUID: reports, drains and history key a GPU on its UUID.
    "gpus[1] has the UUID of gpus[0]":
        {"gpu_overrides": {0: {"uuid": "GPU-11111111-2222-3333-4444-555555555555"},
                           1: {"uuid": "GPU-11111111-2222-3333-4444-555555555555"}}},
}


@pytest.mark.parametrize("reason", NONSENSE_GPUS)
def test_a_scenario_no_gpu_could_report_is_one_line_exit_2(tmp_path, capsys, reason) -> None:
    path = tmp_path / "nonsense.yaml"
    path.write_text(yaml.safe_dump({"description": "test: values no GPU reports",
                                    "extends": "h100-sxm-8x-healthy", **NONSENSE_GPUS[reason]}))
    code, err = _simulate(path, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {path}") and reason in err[0], err
