"""`make gpu-proof` / python -m checks.node.gpu_proof: one line and exit 2 without NVIDIA GPUs; the
bundle's layout with the phases replaced (no GPU here)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from checks.hw.base import NvmlUnavailable
from checks.node import gpu_proof

ROOT = Path(__file__).resolve().parents[2]


def _no_nvml():
    raise NvmlUnavailable("library_missing", "NVML init failed: NVML Shared Library Not Found")


def test_main_without_nvidia_gpu_is_one_line_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", _no_nvml)
    assert gpu_proof.main([str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no NVIDIA GPU on this host")
    assert not (tmp_path / "b").exists()


def test_main_with_zero_gpus_is_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda: (0, {}))
    assert gpu_proof.main([str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == "error: no NVIDIA GPU on this host: NVML counts 0 devices"


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has an NVIDIA GPU")
def test_make_gpu_proof_on_this_host_exits_2_in_one_line():
    # VENV given as a path: the Makefile then installs nothing (the venv may be shared).
    r = subprocess.run(["make", "-s", "--no-print-directory", "gpu-proof", f"VENV={Path(sys.prefix)}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("make")]
    assert len(lines) == 1 and lines[0].startswith("error: no NVIDIA GPU on this host"), r.stderr
    assert r.stdout == ""


def test_bundle_layout_and_exit_code(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda: (2, {"driver": "580.95.05",
                                                              "cuda_driver": 13000}))

    def fake_phases(out: Path, gpus: int):
        def record() -> int:
            (out / "recording.yaml").write_text("gpus: []\n")
            return 0

        def broken() -> int:
            raise RuntimeError("CUDA error: out of memory")

        return [("record", record), ("checks", lambda: 1), ("throughput", broken)]

    bundle = tmp_path / "bundle"
    assert gpu_proof.main([str(bundle)], todo=fake_phases) == 1   # a phase failed: not proven
    phases = json.loads((bundle / "phases.json").read_text())
    assert [(p["phase"], p["exit_code"]) for p in phases["phases"]] == \
        [("record", 0), ("checks", 1), ("throughput", None)]
    assert phases["phases"][2]["error"] == "RuntimeError: CUDA error: out of memory"
    assert all(p["wall_s"] >= 0 for p in phases["phases"]) and phases["total_wall_s"] >= 0
    env = json.loads((bundle / "environment.json").read_text())
    assert env["nvidia_driver"] == "580.95.05" and env["cuda_driver_version"] == 13000
    assert {"torch", "torch_cuda", "python", "kernel", "host"} <= env.keys()
    with tarfile.open(tmp_path / "bundle.tar.gz") as tar:
        assert {"bundle/recording.yaml", "bundle/phases.json", "bundle/environment.json"} <= \
            set(tar.getnames())


def test_bundle_all_phases_passed_is_exit_0(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda: (1, {}))
    assert gpu_proof.main([str(tmp_path / "b")], todo=lambda out, gpus: [("checks", lambda: 0)]) == 0


def test_existing_bundle_dir_is_refused(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda: (1, {}))
    assert gpu_proof.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: cannot create ")


def test_phases_name_every_gpu_path(tmp_path):
    names = [name for name, _ in gpu_proof.phases(tmp_path, 8)]
    assert names == ["record", "checks", "collectives-peak", "trainer-small", "trainer-large",
                     "throughput"]


def _curve(op: str, peak_at: int) -> list[dict]:
    """A sweep 1 MiB .. 8 GiB whose busbw rises until `peak_at` bytes, then flattens a little."""
    rows, size = [], 1 << 20
    while size <= 8 << 30:
        bw = 100.0 * min(size, peak_at) / peak_at - (0.5 if size > peak_at else 0.0)
        rows.append({"bytes": size, "busbw_gbs": bw, "algbw_gbs": bw, "time_us": 1.0, "wrong": 0})
        size *= 2
    return rows


def test_collectives_peak_sweeps_every_op_past_the_nvls_peak(monkeypatch, tmp_path):
    """The peak phase asks the launcher for one rank per GPU, every op including all-to-all, up to
    8 GiB (the check's own sweep stops at 256 MiB), and writes each op's peak and its size."""
    from checks.hw.measure import collective_run

    asked = {}

    def fake_run(**kw):
        asked.update(kw)
        return {"ok": True, "summary": "8 ranks finished", "errors": [], "table": "",
                "ops": {op: _curve(op, 4 << 30) for op in kw["ops"]}}

    monkeypatch.setattr(collective_run, "run", fake_run)
    assert gpu_proof.collectives_peak(tmp_path, 8) == 0
    assert asked["nproc"] == 8 and asked["backend"] == "nccl"
    assert set(asked["ops"]) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                 "broadcast"}
    assert asked["sweep"]["max_bytes"] >= 8 << 30 > 256 << 20
    written = json.loads((tmp_path / "collectives-peak.json").read_text())
    assert written["peaks"]["all_to_all"] == {"busbw_gbs": 100.0, "at_bytes": 4 << 30}
    assert len(written["curves"]["all_reduce"]) == 14  # 1 MiB .. 8 GiB


def test_collectives_peak_fails_on_wrong_data_and_skips_one_gpu(monkeypatch, tmp_path):
    from checks.hw.measure import collective_run

    bad = _curve("all_reduce", 1 << 30)
    bad[3]["wrong"] = 2
    monkeypatch.setattr(collective_run, "run", lambda **kw: {
        "ok": True, "errors": [], "ops": {op: bad for op in kw["ops"]}})
    assert gpu_proof.collectives_peak(tmp_path, 4) == 1
    monkeypatch.setattr(collective_run, "run", lambda **kw: pytest.fail("one GPU: no launch"))
    assert gpu_proof.collectives_peak(tmp_path, 1) == 0
    assert "skipped" in json.loads((tmp_path / "collectives-peak.json").read_text())


def test_the_phase_caps_fit_the_eight_minute_goal(tmp_path, monkeypatch):
    """Every long phase is bounded, and the bounds add up to less than the goal: a node where
    every phase runs out still ends the proof inside 8 minutes. The caps reach the CLIs."""
    caps = gpu_proof.CHECKS_BUDGET_S + gpu_proof.PEAK_TIMEOUT_S + sum(gpu_proof.TRAINER_TIMEOUT_S.values())
    assert caps <= gpu_proof.PROOF_TARGET_S - 10 and gpu_proof.PROOF_TARGET_S == 480
    seen: dict[str, list[str]] = {}
    from checks.node import node_cli
    from trainer import trainer_cli

    monkeypatch.setattr(trainer_cli, "main", lambda argv: seen.setdefault(argv[-1], argv) and 0)
    monkeypatch.setattr(node_cli, "main", lambda argv: seen.setdefault("checks", argv) and 0)
    todo = dict(gpu_proof.phases(tmp_path))
    assert set(gpu_proof.TRAINER_TIMEOUT_S) <= set(todo)
    for name, cap in gpu_proof.TRAINER_TIMEOUT_S.items():
        todo[name]()
        argv = seen[str(tmp_path / f"{name}.json")]
        assert argv[argv.index("--timeout") + 1] == str(cap), name
    todo["checks"]()
    assert f"{gpu_proof.CHECKS_BUDGET_S}s" in seen["checks"]
