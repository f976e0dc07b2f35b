"""`make gpu-proof` / python -m checks.node.gpu_proof: one line and exit 2 without NVIDIA GPUs; the
whole proof rehearsed from an 8-GPU scenario (every phase its own process, the proof's own
process free of torch, every GPU check run, inside its deadline, the bundle written); a phase
that overruns is stopped with its process tree; the bundle never follows a planted link."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from checks.hw.base import NvmlUnavailable
from checks.node import gpu_proof, proof_peak
from checks.supervise import procs

# --import-mode=importlib puts no test directory on sys.path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_env import user_env

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = "h100-sxm-8x-healthy"


def _no_nvml(_hw):
    raise NvmlUnavailable("library_missing", "NVML init failed: NVML Shared Library Not Found")


def test_main_without_nvidia_gpu_is_one_line_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", _no_nvml)
    assert gpu_proof.main([str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no NVIDIA GPU on this host")
    assert not (tmp_path / "b").exists()


def test_main_with_zero_gpus_is_exit_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda hw: (0, {}))
    assert gpu_proof.main([str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip() == "error: no NVIDIA GPU on this host: NVML counts 0 devices"


def test_an_unknown_scenario_is_one_line_exit_2(tmp_path, capsys):
    assert gpu_proof.main([str(tmp_path / "b"), "--simulate", "no-such-scenario"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has an NVIDIA GPU")
def test_make_gpu_proof_on_this_host_exits_2_in_one_line():
    # VENV given as a path: the Makefile then installs nothing (the venv may be shared). As a
    # user's shell runs it: nothing an enclosing `make test` exported (ARGS="--junitxml ..." went
    # to gpu-proof's own command line).
    r = subprocess.run(["make", "-s", "--no-print-directory", "gpu-proof", f"VENV={Path(sys.prefix)}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=user_env())
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("make")]
    assert len(lines) == 1 and lines[0].startswith("error: no NVIDIA GPU on this host"), r.stderr
    assert r.stdout == ""


@pytest.mark.timeout(400)
def test_the_whole_proof_rehearsed_from_an_8_gpu_scenario(tmp_path):
    """The proof end to end on this CPU host: every phase a process of its own (its log, its exit
    code), the proof's own process never imports torch (a check run forked after CUDA was
    initialised could not use the GPUs), every GPU check of the suite in the report (no budget
    plan dropped one, none blocked), inside the deadline, and the bundle with all of it."""
    bundle = tmp_path / "proof"
    probe = ("import sys; from checks.node import gpu_proof; "
             f"rc = gpu_proof.main([{str(bundle)!r}, '--simulate', {SCENARIO!r}, '--deadline', '6m']); "
             "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                       timeout=390)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "NO-TORCH"
    phases = json.loads((bundle / "phases.json").read_text())
    rows = {p["phase"]: p for p in phases["phases"]}
    assert list(rows) == ["record", "checks", "collectives-peak", "trainer-large"]
    for name, row in rows.items():
        assert row["ok"] and row["exit_code"] == 0 and not row["timed_out"], row
        assert row["command"][:1] == ["-m"] and (bundle / row["log"]).is_file(), name
    assert phases["deadline_s"] == 360 and phases["total_wall_s"] < 360
    report = json.loads((bundle / "report.json").read_text())
    by_id = {c["id"]: c for c in report["checks"]}
    from checks.node import registry

    assert set(by_id) == {c.id for c in registry.select("burn-in")}  # every check, burn-in too
    assert "budget" not in report["options"] and report["options"]["deadline_s"] > 0
    for gpu_check in ("gpu-matmul", "gpu-membw", "p2p-bandwidth", "nccl-allreduce",
                      "dataloader-workers", "burn-in"):
        assert by_id[gpu_check]["status"] in ("PASS", "WARN"), by_id[gpu_check]
    assert not [c for c in report["checks"]
                if any(r["message"].startswith(("blocked by", "not run")) for r in c["results"])]
    peak = json.loads((bundle / "collectives-peak.json").read_text())
    assert set(peak["peaks"]) == set(proof_peak.OPS) and peak["backend"] == "gloo"
    assert peak["sized"]["max_bytes_for_memory"] == 8 << 30  # 80 GB free holds 4 x 8 GiB
    trainer = json.loads((bundle / "trainer-large.json").read_text())
    assert trainer  # the trainer's own --json output
    env = json.loads((bundle / "environment.json").read_text())
    assert env["simulated_from"] == SCENARIO and env["nvidia_driver"] == "550.90.07"
    tarball = tmp_path / "proof.tar.gz"
    assert stat.S_IMODE(tarball.stat().st_mode) == 0o600
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o700
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    assert {"proof/recording.yaml", "proof/report.json", "proof/collectives-peak.json",
            "proof/trainer-large.json", "proof/phases.json", "proof/environment.json",
            "proof/logs/checks.log"} <= names


def _phase(name: str, code: str, estimate: float = 1.0, ok=frozenset({0})) -> gpu_proof.Phase:
    return gpu_proof.Phase(name, estimate, lambda cap: ["-c", code], None, ok)


def _fast(monkeypatch) -> None:
    monkeypatch.setattr(gpu_proof, "BUNDLE_RESERVE_S", 1.0)
    monkeypatch.setattr(gpu_proof, "MIN_PHASE_S", 1.0)
    monkeypatch.setattr(gpu_proof, "UNWIND_S", 1.0)


@pytest.mark.timeout(60)
def test_a_phase_that_overruns_is_stopped_with_its_tree_and_the_next_phases_go_on(monkeypatch, tmp_path):
    """The total is a deadline: the phase that hangs (with a child in a session of its own, as
    torchrun's ranks are) is killed at its cap and reported timed out; the next phase runs in the
    time left; one with no time left is reported not run. The proof is then not proven."""
    _fast(monkeypatch)
    pids = tmp_path / "pids"
    hang = ("import subprocess, sys, time; "
            "c = subprocess.Popen(['sleep', '600'], start_new_session=True); "
            f"open({str(pids)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    # Caps out of the 9 s left (deadline 10 s less the 1 s reserve): "hangs" gets what the three
    # later estimates leave (6 s), "next" its 1 s, "hangs-too" the rest but 1 s, "late" nothing.
    todo = [_phase("hangs", hang), _phase("next", "pass"),
            _phase("hangs-too", "import time; time.sleep(600)"), _phase("late", "pass")]
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda hw: (2, {}))
    bundle = tmp_path / "b"
    rc = gpu_proof.main([str(bundle), "--simulate", SCENARIO, "--deadline", "10s"],
                        todo=lambda out, gpus, hw, sim: todo)
    assert rc == 1
    rows = {p["phase"]: p for p in json.loads((bundle / "phases.json").read_text())["phases"]}
    assert rows["hangs"]["timed_out"] and rows["hangs"]["exit_code"] is None
    assert rows["hangs"]["stopped"] == "stopped" and 6 <= rows["hangs"]["wall_s"] < 8
    assert rows["next"]["ok"] and rows["next"]["exit_code"] == 0
    assert rows["hangs-too"]["timed_out"]
    assert rows["late"]["not_run"].startswith("the proof's deadline (10 s) left")
    assert not procs.alive(int(pids.read_text()))


def test_the_trainer_skipping_every_job_is_not_a_failed_phase(monkeypatch, tmp_path):
    """On one GPU the trainer SKIPs what needs two (exit 77, each job with its reason): the proof
    records it and is still proven; any other non-zero exit is a failure."""
    _fast(monkeypatch)
    monkeypatch.setattr(gpu_proof, "nvidia_gpus", lambda hw: (1, {}))
    from checks.hw.fixture import FixtureBackend

    hw = FixtureBackend.from_file(SCENARIO)
    trainer = next(p for p in gpu_proof.phases(tmp_path, 1, hw, SCENARIO) if p.name == "trainer-large")
    assert gpu_proof.TRAINER_ALL_SKIPPED in trainer.ok
    skipped = [_phase("trainer-large", "raise SystemExit(77)", ok=trainer.ok)]
    assert gpu_proof.main([str(tmp_path / "a"), "--simulate", SCENARIO, "--deadline", "60s"],
                          todo=lambda *a: skipped) == 0
    failed = [_phase("trainer-large", "raise SystemExit(1)", ok=trainer.ok)]
    assert gpu_proof.main([str(tmp_path / "b"), "--simulate", SCENARIO, "--deadline", "60s"],
                          todo=lambda *a: failed) == 1


def test_the_bundle_never_follows_a_planted_link_nor_reuses_a_path(monkeypatch, tmp_path, capsys):
    _fast(monkeypatch)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "b.tar.gz").symlink_to(victim)
    assert gpu_proof.main([str(tmp_path / "b"), "--simulate", SCENARIO, "--deadline", "60s"],
                          todo=lambda *a: [_phase("one", "pass")]) == 0
    assert victim.read_text() == "precious\n"
    tarball = tmp_path / "b.tar.gz"
    assert not tarball.is_symlink() and stat.S_IMODE(tarball.stat().st_mode) == 0o600
    # An existing path, a link to a directory included, is refused before anything runs.
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "linked")
    for taken in (tmp_path / "b", tmp_path / "linked"):
        assert gpu_proof.main([str(taken), "--simulate", SCENARIO]) == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: cannot create {taken}")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_the_default_bundle_name_is_not_predictable():
    a, b = gpu_proof._default_dir(), gpu_proof._default_dir()
    assert a != b and a.name.startswith("gpu-proof-")


@pytest.mark.parametrize("estimates,left", [([30, 700, 90, 200], 1000.0), ([30, 700, 90, 200], 300.0),
                                            ([1, 1, 1], 5.0)])
def test_phase_caps_never_exceed_what_is_left_and_keep_a_fair_share(estimates, left):
    todo = [_phase(f"p{i}", "pass", e) for i, e in enumerate(estimates)]
    remaining = left
    for i in range(len(todo)):
        cap = gpu_proof.cap_for(todo, i, remaining)
        share = remaining * estimates[i] / sum(estimates[i:])
        assert share - 1e-9 <= cap <= remaining
        if sum(estimates[i:]) <= remaining:  # room for every estimate: each gets at least its own
            assert cap >= estimates[i]
        remaining -= estimates[i] if cap >= estimates[i] else cap  # the phase used its estimate


def test_the_default_deadline_covers_the_estimates_of_a_healthy_8_gpu_node(tmp_path):
    """Sized so a healthy node finishes: every check at its budget-table cost on 8 GPUs (the
    acceptance launch once, the burn-in minute), the peak sweep, the trainer's large jobs."""
    from checks.hw.fixture import FixtureBackend

    hw = FixtureBackend.from_file(SCENARIO)
    plan = gpu_proof.phases(tmp_path, 8, hw, None)
    by_name = {p.name: p for p in plan}
    assert by_name["checks"].estimate_s >= gpu_proof.checks_estimate(8) >= 600
    assert by_name["trainer-large"].estimate_s > gpu_proof.TRAINER_START_S  # the throughput job priced
    checks_argv = by_name["checks"].argv(500.0)
    assert checks_argv[checks_argv.index("--deadline") + 1] == "480s"  # inside its cap
    assert "--budget" not in checks_argv and "burn-in" in checks_argv


@pytest.mark.parametrize("free,expected", [
    ([85_520_809_984] * 8, 8 << 30),      # H100 80 GB idle: the full 8 GiB
    ([42_000_000_000] * 8, 8 << 30),      # A100 40 GB idle: 4 x 8 GiB = 34.4 GB fits
    ([48_000_000_000, 20_000_000_000], 4 << 30),  # one GPU with someone's 28 GB on it
    ([3_000_000], 0),                     # not even 1 MiB x 4
])
def test_the_peak_sweep_is_sized_from_the_least_free_gpu(free, expected):
    assert proof_peak.largest_message(free) == expected


def test_the_peak_sweep_counts_the_gpus_cuda_visible_devices_leaves(monkeypatch):
    from checks.hw.fixture import FixtureBackend

    hw = FixtureBackend.from_file(SCENARIO)
    assert proof_peak.usable_gpus(hw) == list(range(8))
    monkeypatch.setattr(hw, "environ", lambda: {"CUDA_VISIBLE_DEVICES": "2,5"})
    assert proof_peak.usable_gpus(hw) == [2, 5]
    monkeypatch.setattr(hw, "environ", lambda: {"CUDA_VISIBLE_DEVICES": "3"})
    doc, code = proof_peak.measure(hw, simulated=True, timeout_s=30)
    assert code == 0 and doc["skipped"].startswith("1 usable GPU")


def test_the_peak_sweep_fails_on_a_wrong_element(monkeypatch):
    from checks.hw.fixture import FixtureBackend
    from checks.hw.measure import collective_run

    rows = [{"bytes": 1 << 20, "busbw_gbs": 1.0, "wrong": 0},
            {"bytes": 2 << 20, "busbw_gbs": 2.0, "wrong": 3}]
    monkeypatch.setattr(collective_run, "run", lambda **kw: {
        "ok": True, "errors": [], "ops": {op: rows for op in kw["ops"]}})
    monkeypatch.setattr(proof_peak, "free_memory", lambda hw, gpus, simulated: [80 << 30] * len(gpus))
    doc, code = proof_peak.measure(FixtureBackend.from_file(SCENARIO), simulated=False, timeout_s=30)
    assert code == 1 and doc["backend"] == "nccl" and doc["world_size"] == 8
    assert doc["peaks"]["all_reduce"] == {"busbw_gbs": 2.0, "at_bytes": 2 << 20}
