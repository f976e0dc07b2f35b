"""Every node trains (issue 12 part A), without launching ranks: where the ranks go (made-up GPU
counts), the usage errors, the single and localize verdicts and their negative controls, the
acceptance plan on scenarios (GPUs torch cannot use, fewer GPUs than --expect-gpus), and the
process-group hygiene and flight-recorder plumbing. Fast; no process group."""

from __future__ import annotations

import copy
import os
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from checks import profiles
from checks.hw.base import PciDevice
from checks.hw.fixture import FixtureBackend, load_scenario
from checks.node.context import Context, Options
from checks.node.suite import acceptance
from trainer import launcher
from trainer import trainer_cli as cli
from trainer.config import TrainConfig
from trainer.distenv import DistEnv
from trainer.jobs import hybrid, pipeline, single
from trainer.placement import (
    CPU_RANKS,
    SHARED_RANKS,
    Placement,
    choose_nproc,
    hides_every_gpu,
    place,
    why_torch_cannot_use_gpus,
)

ROOT = Path(__file__).resolve().parents[2]


# --- where the ranks go -------------------------------------------------------------------------

@pytest.mark.parametrize(("preference", "local_rank", "local_world", "gpus", "expected"), [
    ("auto", 0, 4, 0, Placement("cpu", "gloo")),               # CPU host
    ("auto", 3, 8, 8, Placement("cuda:3", "nccl")),            # one rank per GPU
    ("cpu", 1, 2, 8, Placement("cpu", "gloo")),                # --device cpu on a GPU host
    ("auto", 3, 4, 1, Placement("cuda:0", "gloo", True)),      # one-GPU host: ranks share it
    ("cuda", 2, 4, 2, Placement("cuda:0", "gloo", True)),      # --share-gpu, 4 ranks on 2 GPUs
])
def test_placement(preference: str, local_rank: int, local_world: int, gpus: int,
                   expected: Placement) -> None:
    assert place(preference, local_rank, local_world, gpus) == expected


def test_gloo_on_a_shared_gpu_has_no_send_recv() -> None:
    assert not Placement("cuda:0", "gloo", True).p2p
    assert Placement("cuda:0", "nccl").p2p and Placement("cpu", "gloo").p2p


@pytest.mark.parametrize(("requested", "preference", "gpus", "share", "expected"), [
    (None, "auto", 0, False, (CPU_RANKS, False)),
    (None, "auto", 8, False, (8, False)),
    (None, "auto", 1, False, (SHARED_RANKS, True)),   # a one-GPU host still runs DDP on CUDA
    (None, "cpu", 8, False, (CPU_RANKS, False)),      # --device cpu honoured for the rank count
    (6, "cpu", 2, False, (6, False)),
    (2, "auto", 8, False, (2, False)),
    (4, "auto", 2, True, (4, True)),
])
def test_rank_count(requested: int | None, preference: str, gpus: int, share: bool,
                    expected: tuple[int, bool]) -> None:
    assert choose_nproc(requested, preference, gpus, share) == expected


@pytest.mark.parametrize(("requested", "preference", "gpus", "needle"), [
    (3, "auto", 2, "--nproc 3 is more than the 2 GPU(s) torch sees"),
    (2, "auto", 1, "--share-gpu"),
    (None, "cuda", 0, "torch sees no CUDA device"),
    (0, "auto", 0, "--nproc must be >= 1"),
])
def test_rank_count_usage_errors(requested: int | None, preference: str, gpus: int,
                                 needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        choose_nproc(requested, preference, gpus)


@pytest.mark.parametrize(("value", "bus", "hidden"), [
    (None, 8, False), ("NoDevFiles", 8, True), ("", 8, True), ("-1", 8, True),
    ("0,1", 8, False), ("1", 1, True), ("GPU-6f1b0d6a", 8, False), ("foo,0", 8, True),
])
def test_cuda_visible_devices_that_hide_every_gpu(value: str | None, bus: int,
                                                  hidden: bool) -> None:
    assert hides_every_gpu(value, bus) is hidden


def test_why_torch_cannot_use_the_gpus() -> None:
    from checks.hw.base import TorchInfo

    broken = TorchInfo(version="2.5.1+cu124", cuda="12.4", error="CUDA error 802: system not yet "
                       "initialized")
    assert why_torch_cannot_use_gpus(broken, {}) == \
        "torch cannot use CUDA: CUDA error 802: system not yet initialized"
    unavailable = TorchInfo(version="2.5.1+cu124", cuda="12.4")
    assert why_torch_cannot_use_gpus(unavailable, {"CUDA_VISIBLE_DEVICES": "0"}, 8) == \
        "torch.cuda.is_available() is False (torch 2.5.1+cu124, CUDA 12.4, CUDA_VISIBLE_DEVICES='0')"


def test_cli_nproc_above_gpu_count_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launcher, "cuda_count", lambda: 1)
    assert cli.main(["ddp", "--nproc", "3"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --nproc 3 is more than the 1 GPU(s)")


def test_cli_device_cuda_without_cuda_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    assert cli.main(["single", "--device", "cuda"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.strip() == "error: --device cuda: torch sees no CUDA device"


def _nvidia_gpu(address: str) -> PciDevice:
    return PciDevice(address=address, vendor=0x10DE, device=0x2335, class_code=0x030200)


def test_cli_refuses_to_train_on_the_cpu_when_torch_cannot_use_the_gpus(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU-only torch of this machine on a host with an H200 on the bus: exit 1, no CPU
    run passed off as the node's acceptance."""
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    from checks.hw.linux import LinuxBackend

    monkeypatch.setattr(LinuxBackend, "pci_devices", lambda self: [_nvidia_gpu("0000:18:00.0")])
    assert cli.main(["single"]) == cli.EXIT_FAIL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "1 NVIDIA GPU(s) on the PCI bus but torch cannot use any" in err[0]
    assert "CPU-only build" in err[0] and "--device cpu" in err[0]
    assert cli._unusable_gpus("cpu") is None  # asked for the CPU on purpose


# --- single: every device against float64 --------------------------------------------------------

def test_tolerance_formula() -> None:
    # 2.5 x 2^-24 x S x sqrt(n k): grows with the square root of the sum length and of the steps
    assert single.tolerance(64, 20, 1.0) == pytest.approx(2.5 * 2 ** -24 * (64 * 20) ** 0.5)
    assert single.tolerance(256, 20, 1.0) == pytest.approx(2 * single.tolerance(64, 20, 1.0))
    assert single.tolerance(64, 80, 2.0) == pytest.approx(4 * single.tolerance(64, 20, 1.0))
    assert single.longest_sum(64, 32) == 64 and single.longest_sum(16, 128) == 128


def test_single_cpu_passes_well_inside_the_bound() -> None:
    report = single.run_local(TrainConfig(device="cpu"))
    assert report.status == "PASS", report.message
    (c,) = report.comparisons
    tol = report.details["tolerance"]
    assert c.atol == tol["atol"] and c.max_abs > 0  # fp32 really differs from float64
    assert c.max_abs < tol["atol"] / 5  # measured ~6e-8 against 1.7e-6
    assert report.details["devices"][0]["device"] == "cpu"


@pytest.mark.parametrize(("cfg", "corrupt"), [
    (TrainConfig(device="cpu", controls=["tf32"]), None),           # TF32 matmuls
    (TrainConfig(device="cpu"), lambda device: device.type == "cpu"),  # one flipped bit
])
def test_single_negative_controls_fail(cfg: TrainConfig, corrupt: object) -> None:
    report = single.run_local(cfg, corrupt)
    assert report.status == "FAIL"
    assert report.message.startswith("1 of 1 device(s) differ from the float64 reference: cpu ")
    assert report.comparisons[0].max_abs > 5 * report.details["tolerance"]["atol"]


def test_single_names_the_gpu_that_differs() -> None:
    """Three 'GPUs' (CPU runs standing in), one with a flipped bit: only that one is named,
    with its model, PCI address and UUID."""
    cfg = TrainConfig(device="cpu")
    initial, data, batch = single.problem(cfg)
    expected, _ = single._reference(cfg)
    runs = []
    for i in range(3):
        params, losses, rate = single.train(initial, data, cfg, batch, torch.device("cpu"),
                                            torch.float32, corrupt=i == 2)
        ident = {"device": f"cuda:{i}", "host": "node7", "name": "NVIDIA H200",
                 "pci": f"00000000:{0x18 + i:02x}:00.0", "uuid": f"GPU-0000-{i}"}
        runs.append({"identity": ident, "params": params, "losses": losses, "samples_per_s": rate})
    report = single.judge(runs, expected, cfg, batch)
    assert report.status == "FAIL"
    assert "1 of 3 device(s)" in report.message
    assert "cuda:2 on node7 (NVIDIA H200, pci 00000000:1a:00.0, uuid GPU-0000-2)" in report.message
    assert "cuda:0" not in report.message and "cuda:1" not in report.message


def _env(device: str, local_rank: int, placement: Placement, world: int = 4) -> DistEnv:
    return DistEnv(rank=local_rank, world_size=world, local_rank=local_rank, backend=placement.backend,
                   device=torch.device(device), ctl=None, reporter=None, placement=placement)


@pytest.mark.parametrize(("device", "local_rank", "gpus", "shared", "trains"), [
    ("cpu", 0, 0, False, ["cpu"]),                 # CPU host: rank 0 trains the CPU
    ("cpu", 1, 0, False, []),
    ("cuda:0", 0, 1, True, ["cuda:0", "cpu"]),     # one-GPU host: the first rank on the GPU
    ("cuda:0", 2, 1, True, []),                    # its sharers train nothing twice
    ("cuda:3", 3, 8, False, ["cuda:3"]),           # one rank per GPU
])
def test_single_splits_the_devices_over_the_ranks(monkeypatch: pytest.MonkeyPatch, device: str,
                                                  local_rank: int, gpus: int, shared: bool,
                                                  trains: list[str]) -> None:
    monkeypatch.setattr(single, "cuda_count", lambda: gpus)
    placement = Placement(device, "gloo" if shared or device == "cpu" else "nccl", shared)
    assert [str(d) for d in single._devices_of(_env(device, local_rank, placement))] == trains


@pytest.mark.parametrize("job", [pipeline, hybrid])
def test_pipelined_jobs_skip_with_the_reason_when_ranks_share_a_gpu(job: object) -> None:
    env = _env("cuda:0", 0, Placement("cuda:0", "gloo", shared=True))
    report = job.run(env, TrainConfig())  # type: ignore[attr-defined]
    assert report.status == "SKIP"
    assert "gloo, which cannot send/recv CUDA tensors" in report.message


# --- the acceptance plan, decided on scenarios ----------------------------------------------------

def _ctx(scenario: dict, **options: object) -> Context:
    return Context(FixtureBackend(scenario), profiles.load("generic"), Options(**options))  # type: ignore[arg-type]


def _h100(env: dict[str, str] | None = None, gpus: int | None = None, **torch_spec: object) -> dict:
    data = copy.deepcopy(load_scenario("h100-sxm-8x-healthy"))
    if env is not None:
        data["host"]["env"] = env
    if gpus is not None:
        data["gpus"] = data["gpus"][:gpus]
    data["torch"].update(torch_spec)
    return data


@pytest.mark.parametrize(("scenario", "why"), [
    (_h100({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}), "CUDA_VISIBLE_DEVICES='NoDevFiles' hides"),
    (_h100({"CUDA_VISIBLE_DEVICES": ""}), "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    (_h100({"CUDA_VISIBLE_DEVICES": "-1"}), "CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
    (_h100({"CUDA_VISIBLE_DEVICES": "8"}), "CUDA_VISIBLE_DEVICES='8' hides every GPU"),
    (_h100(version="2.13.0+cpu", cuda=None, cuda_available=False), "2.13.0+cpu is a CPU-only"),
])
def test_gpus_torch_cannot_use_fail_every_acceptance_check(scenario: dict, why: str) -> None:
    ctx = _ctx(scenario)
    for job in acceptance.JOBS:
        result = acceptance._job_check(ctx, job)
        assert result.status == "FAIL", (job, result.message)
        assert result.message.startswith("8 NVIDIA GPU(s) on the PCI bus but torch cannot use any")
        assert why in result.message and "would run on the CPU" in result.message
    assert ctx not in acceptance._cache  # nothing launched


def test_fewer_usable_gpus_than_expected_fail_the_multi_gpu_jobs() -> None:
    ctx = _ctx(_h100({"CUDA_VISIBLE_DEVICES": "0,1"}), expect_gpus=8)
    plan = acceptance.plan(ctx)
    multi = [j for j in acceptance.JOBS if j not in acceptance.PER_DEVICE]
    assert sorted(plan.verdicts) == sorted(multi)
    for job in multi:
        result = acceptance._job_check(ctx, job)
        assert result.status == "FAIL"
        assert result.message.startswith("--expect-gpus 8 but torch can use 2 GPU(s) "
                                         "(CUDA_VISIBLE_DEVICES='0,1')")
    assert plan.jobs == ["single", "localize"] and plan.nproc == 2  # still judged per GPU


def test_one_gpu_host_runs_one_rank_and_skips_the_multi_gpu_jobs() -> None:
    """Issue 44: two ranks sharing the GPU over gloo proved nothing about the node; the stage
    plans as the trainer does (plan_ranks). More in tests/trainer/test_acceptance_one_gpu.py."""
    plan = acceptance.plan(_ctx(_h100(gpus=1)))
    assert (plan.nproc, plan.shared) == (1, False)
    assert plan.jobs == ["single", "throughput"]
    for job in ("dp", "ddp", "syncbn", "localize", "pipeline"):
        assert plan.verdicts[job].status == "SKIP"
        assert plan.verdicts[job].message == "needs 2 GPUs, this host has 1"


def test_nproc_above_the_gpu_count_skips_with_the_reason() -> None:
    ctx = _ctx(_h100(), nproc=16)
    result = acceptance._job_check(ctx, "ddp")
    assert result.status == "SKIP" and "--nproc 16 is more than the 8 GPU(s)" in result.message


def test_healthy_simulated_nodes_skip_without_claiming_a_verdict() -> None:
    for scenario in (_h100(), load_scenario("cpu-only-healthy")):
        ctx = _ctx(scenario)
        for job in ("single", "localize", "ddp"):
            assert acceptance._job_check(ctx, job).message == acceptance.SIMULATED


# --- process-group hygiene, flight recorder -----------------------------------------------------

def test_jobs_create_groups_only_through_the_env() -> None:
    """env.new_group gives every group the launch's timeout (and the device under NCCL)."""
    offenders = [p.name for p in (ROOT / "trainer" / "jobs").glob("*.py")
                 if re.search(r"\bdist\.new_(sub)?group\(", p.read_text())]
    assert offenders == []


def test_flight_recorder_env_and_hang_message_name_the_dump_path(tmp_path: Path) -> None:
    env = launcher.flight_recorder_env(tmp_path)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == str(launcher.TRACE_BUFFER)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl-trace-rank-")
    assert "none written at " + str(tmp_path / "nccl-trace-rank-<rank>") in \
        launcher.flight_recorder_note(tmp_path)
    (tmp_path / "nccl-trace-rank-1").write_bytes(b"x")
    assert "(1 file(s)" in launcher.flight_recorder_note(tmp_path)


def test_a_hung_launch_asks_each_ranks_pipe_for_a_dump(tmp_path: Path) -> None:
    """What NCCL's monitor thread does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: a FIFO per rank;
    anything written to it makes that rank write its dump."""
    pipe = tmp_path / f"{launcher.PIPE_PREFIX}0.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # as the rank's monitor holds it open

    def monitor() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if os.read(reader, 1):
                    (tmp_path / f"{launcher.DUMP_PREFIX}0").write_bytes(b"trace")
                    return
            except BlockingIOError:
                pass
            time.sleep(0.05)

    thread = threading.Thread(target=monitor, daemon=True)
    thread.start()
    try:
        assert launcher.request_dumps(tmp_path) == [tmp_path / f"{launcher.DUMP_PREFIX}0"]
    finally:
        thread.join(10)
        os.close(reader)
    assert launcher.request_dumps(tmp_path / "nothing-here") == []  # gloo: returns at once
