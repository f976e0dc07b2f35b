"""Every job's FAIL reaches `python -m checks`'s exit code, and every feature a job names is
observed, not assumed.

One real `python -m checks --only train-*` process (4 gloo ranks, one launch) in which every job
is made to fail: a fault injected through NODECERT_INJECT (single, localize) or a negative control
through NODECERT_TRAIN_CONTROLS (every other job). For the jobs whose feature is left out while the
numbers stay right (autocast off, FSDP's mixed precision dropped, no DataLoader workers, the
compiled code bypassed), the FAIL must come from the job's observation of that feature; the fp32
tolerance must reject gradients all-reduced at fp16 precision; throughput must reject a model
that cannot learn. Each check must be FAIL with its own fault code and the process must exit 1.
`dp` cannot fail on a CPU host (DataParallel needs 2 GPUs): it must SKIP, never PASS; its replica
observation is tested in test_trainer_units.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from checks.node.suite import acceptance
from trainer.config import CONTROL_JOB, TOLERANCES

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

# job -> (how it is broken, the start of the FAIL message: the comparison that caught it; a
# string, or a pattern where the message names a part)
BROKEN = {
    "single": ("inject corrupt:0@single/cpu", "1 of 1 device(s) differ"),
    "localize": ("inject corrupt:1@localize/gradients", "1 of 4 rank(s) compute wrong gradients"),
    "ddp": ("ddp-fp16-allreduce", "parameters vs single-device reference"),
    "pipeline": ("no-scale-grads", "gpipe: parameters vs unsplit model"),
    "hybrid": ("static-graph", re.compile(r"stage \d: replicas identical")),
    "syncbn": ("local-bn", "step 0: output slices"),
    "fsdp": ("fsdp-no-mp", "bf16 mixed precision: FSDP computed with bfloat16 parameters"),
    "tp": ("tp-rank-data", "tensor parallel (4 ranks): parameters vs single-device reference"),
    "bf16": ("bf16-no-autocast", "autocast ran: activations were bfloat16 on every rank"),
    "compile": ("compile-eager", "the compiled code ran every training step on every rank"),
    "accum": ("accum-no-divide", "parameters vs single-device reference"),
    "loader": ("loader-no-workers", "batches produced by 2 DataLoader worker(s) on every rank"),
    "ckpt": ("ckpt-no-optim", "DDP, rank-0 full state dict: resumed vs uninterrupted"),
    "throughput": ("throughput-frozen", "the model did not learn"),
}


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, dict]]:
    work = tmp_path_factory.mktemp("e2e")
    controls = [how for how, _ in BROKEN.values() if not how.startswith("inject")]
    inject = ",".join(how.split()[1] for how, _ in BROKEN.values() if how.startswith("inject"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), acceptance.ENV_CONTROLS: ",".join(controls),
           "NODECERT_INJECT": inject}
    report = work / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "checks", "--only", ",".join(f"train-{j}" for j in acceptance.JOBS),
         "--nproc", "4", "--json", str(report), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert report.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
    return proc.returncode, checks


def test_every_job_is_broken_in_the_run() -> None:
    assert set(BROKEN) == set(acceptance.JOBS) - {"dp"}
    for job, (how, _) in BROKEN.items():
        assert how.startswith("inject") or CONTROL_JOB[how] == job


@pytest.mark.parametrize("job", list(BROKEN))
def test_each_broken_job_fails_its_check_for_the_planted_reason(broken_run: tuple, job: str,
                                                                ) -> None:
    _, checks = broken_run
    check = checks[f"train-{job}"]
    (result,) = check["results"]
    assert check["status"] == "FAIL", (job, result["message"])
    needle = BROKEN[job][1]
    pattern = needle if isinstance(needle, re.Pattern) else re.compile(re.escape(needle))
    assert pattern.match(result["message"]), result["message"]
    assert check["code"] == acceptance_code(job)


def test_a_broken_node_exits_1_and_dp_skips_rather_than_passes(broken_run: tuple) -> None:
    code, checks = broken_run
    assert code == 1
    assert checks["train-dp"]["status"] == "SKIP"
    assert not [i for i, c in checks.items() if c["status"] == "PASS"]


def test_the_launch_was_prepared_at_the_start_of_the_run(broken_run: tuple) -> None:
    """The acceptance launcher was started by the checks' prepare hook before the first check
    (its imports overlap the run), and the one launch ran every job."""
    _, checks = broken_run
    launches = {json.dumps(c["results"][0]["details"]["launch"], sort_keys=True)
                for i, c in checks.items() if i != "train-dp"}
    assert len(launches) == 1, launches
    launch = json.loads(launches.pop())
    assert launch["prepared"] is True and launch["launches"] == 1, launch


def test_fp32_tolerance_rejects_an_all_reduce_at_fp16_precision(broken_run: tuple) -> None:
    """The deviation is the size of fp16 rounding (~3e-5 after 10-20 steps), far below anything a
    loose check would notice: the default fp32 tolerance must be what rejects it."""
    _, checks = broken_run
    (result,) = checks["train-ddp"]["results"]
    params = result["details"]["comparisons"][0]
    assert (params["rtol"], params["atol"]) == TOLERANCES["float32"] == (1e-5, 1e-6)
    assert 5e-6 < params["max_abs"] < 2e-4 and not params["ok"]
    assert result["details"]["comparisons"][1]["ok"]  # replicas still agree with each other
    assert result["details"]["negative_controls"] == ["ddp-fp16-allreduce"]


def test_missing_features_are_named_with_what_was_observed(broken_run: tuple) -> None:
    _, checks = broken_run

    def details(job: str) -> dict:
        return checks[f"train-{job}"]["results"][0]["details"]

    assert all(d["outputs"] == ["float32"] for d in details("bf16")["observed_dtypes_per_rank"])
    assert all(d["weights"] == ["float32"] and d["reduce"] == ["float32"]
               for d in details("fsdp")["mixed_precision_observed_per_rank"])
    assert details("loader")["worker_ids_per_rank"] == [[-1]] * 4
    assert details("compile")["compiled_calls_per_rank"] == [0] * 4
    tp = details("throughput")
    assert tp["probe_loss_after"] == tp["probe_loss_before"]


def acceptance_code(job: str) -> str:
    from checks.node.registry import REGISTRY

    return REGISTRY[f"train-{job}"].code
