"""Single-process pieces of trainer/: sampler arithmetic, comparisons, config, CLI usage, the
acceptance checks' skips. Fast; no process group."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DistributedSampler

from checks import profiles
from checks.hw.fixture import FixtureBackend
from checks.node.context import Context, Options
from checks.node.suite import acceptance
from trainer import trainer_cli as cli
from trainer.config import CONTROLS, TrainConfig
from trainer.data import TeacherDataset, dataset_size, epoch_indices, global_batches
from trainer.report import FAIL, PASS, JobReport, compare, identical


@pytest.mark.parametrize("replicas", [2, 3, 4])
def test_rebuilt_indices_match_distributed_sampler(replicas: int) -> None:
    n = dataset_size(replicas, 8, 5)
    assert n % replicas  # uneven on purpose: padding would show
    for epoch in range(3):
        expected = epoch_indices(n, replicas, seed=7, epoch=epoch)
        for rank in range(replicas):
            sampler = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=True,
                                         seed=7, drop_last=True)
            sampler.set_epoch(epoch)
            assert list(sampler) == expected[rank]


def test_global_batches_span_epochs_and_never_repeat_within_one() -> None:
    n = dataset_size(2, 8, 5)
    batches = global_batches(n, 2, 8, seed=1, steps=12)
    assert len(batches) == 12 and all(len(b) == 16 for b in batches)
    first_epoch = [i for b in batches[:5] for i in b]
    assert len(set(first_epoch)) == len(first_epoch)
    assert batches[5] != batches[0]  # epoch 1 reshuffled (what a missing set_epoch breaks)


def test_dataset_yields_input_target_pairs_and_is_seeded() -> None:
    a, b = TeacherDataset(10, (4,), 2, seed=3), TeacherDataset(10, (4,), 2, seed=3)
    x, y = a[0]
    assert x.shape == (4,) and y.shape == (2,)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


def test_compare_uses_allclose_semantics_and_names_the_worst_tensor() -> None:
    exp = {"w": torch.ones(3), "b": torch.zeros(2)}
    near = {"w": torch.ones(3) + 5e-6, "b": torch.zeros(2)}
    far = {"w": torch.ones(3), "b": torch.tensor([0.0, 1e-3])}
    assert compare("p", near, exp, rtol=1e-5, atol=1e-6).ok
    bad = compare("p", far, exp, rtol=1e-5, atol=1e-6)
    assert not bad.ok and bad.worst == "b" and bad.max_abs == pytest.approx(1e-3)
    assert not compare("p", {"w": torch.full((3,), float("nan")), "b": torch.zeros(2)}, exp,
                       1.0, 1.0).ok
    assert not compare("p", {"w": torch.ones(3)}, exp, 1e-5, 1e-6).ok


def test_identical_is_exact() -> None:
    a = {"w": torch.ones(2)}
    assert identical("r", [a, {"w": torch.ones(2)}]).ok
    drift = identical("r", [a, {"w": torch.ones(2)}, {"w": torch.tensor([1.0, 1.0 + 1e-7])}])
    assert not drift.ok and "replica 2" in drift.worst


def test_job_report_verdict_and_round_trip() -> None:
    good = compare("p", {"w": torch.ones(1)}, {"w": torch.ones(1)}, 1e-5, 1e-6)
    bad = compare("q", {"w": torch.ones(1)}, {"w": torch.zeros(1)}, 1e-5, 1e-6)
    assert JobReport.judge("ddp", [good], "fine").status == PASS
    report = JobReport.judge("ddp", [good, bad], "fine", figures={"ddp_samples_per_s": 1.0})
    assert report.status == FAIL and report.message.startswith("q:")
    assert JobReport.from_dict(report.to_dict()) == report


def test_config_validation() -> None:
    TrainConfig(controls=list(CONTROLS)).validate()
    for bad in (TrainConfig(steps=0), TrainConfig(dtype="float16"), TrainConfig(controls=["x"])):
        with pytest.raises(ValueError):
            bad.validate()
    assert TrainConfig(dtype="float64").tolerances() == (1e-9, 1e-12)
    assert TrainConfig.from_dict(TrainConfig(steps=3).to_dict()).steps == 3


@pytest.mark.parametrize("argv", [["nope"], ["ddp", "--steps", "0"], ["ddp", "--control", "x"],
                                  ["ddp", "--control", "local-bn"], ["ddp", "--dtype", "int8"]])
def test_cli_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err and len(err[-1]) < 300


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="host has >= 2 GPUs")
def test_dp_skips_without_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dp"]) == cli.EXIT_SKIP
    assert "needs >= 2 CUDA devices" in capsys.readouterr().out


def _context(scenario: str | None = None, **options: object) -> Context:
    if scenario:
        hw = FixtureBackend.from_file(scenario)
    else:
        from checks.hw.linux import LinuxBackend

        hw = LinuxBackend()
    return Context(hw, profiles.load("generic"), Options(**options))  # type: ignore[arg-type]


@pytest.mark.parametrize("job", acceptance.JOBS)
def test_acceptance_checks_skip_on_simulated_hardware(job: str) -> None:
    result = acceptance._job_check(_context("h100-sxm-8x-healthy"), job)
    assert result.status == "SKIP"
    assert result.message == "simulated hardware: training jobs need the real machine"


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="host has >= 2 GPUs")
def test_acceptance_dp_skips_on_this_host_without_launching() -> None:
    ctx = _context()
    result = acceptance._job_check(ctx, "dp")
    # No GPU: DataParallel's own reason; one GPU: the one-GPU rule (trainer.placement).
    assert result.status == "SKIP" and ("needs ≥ 2 CUDA devices" in result.message
                                        or result.message == "needs 2 GPUs, this host has 1")
    assert ctx not in acceptance._cache


def test_acceptance_checks_are_registered() -> None:
    from checks.node import registry

    registry.load_all()
    codes = {cid: registry.REGISTRY[cid] for cid in (f"train-{j}" for j in acceptance.JOBS)}
    assert {j: c.code for j, c in zip(acceptance.JOBS, codes.values(), strict=True)} == {
        "dp": "ACC001", "ddp": "ACC002", "pipeline": "ACC003", "hybrid": "ACC004",
        "syncbn": "ACC005", "single": "ACC006", "localize": "ACC007", "fsdp": "ACC008",
        "tp": "ACC009", "bf16": "ACC010", "compile": "ACC011", "accum": "ACC012",
        "loader": "ACC013", "ckpt": "ACC014", "throughput": "ACC015"}
    assert all(c.level == "standard" and c.stage == "acceptance" for c in codes.values())


# --- observing that a named feature ran (no process group) -----------------------------------

def test_dtype_probe_sees_autocast_bf16_and_its_absence() -> None:
    from trainer.jobs import common
    from trainer.models import mlp

    model = mlp(8)
    x = torch.randn(4, 16)
    probe = common.DtypeProbe(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    on = probe.remove()
    assert on == {"outputs": ["bfloat16"], "weights": ["float32"], "calls": 3}
    probe = common.DtypeProbe(model)
    model(x)  # autocast left off
    off = probe.remove()
    assert off["outputs"] == ["float32"]
    assert common.saw_only("autocast", [on, on], "outputs", "bfloat16").ok
    bad = common.saw_only("autocast", [on, off], "outputs", "bfloat16")
    assert not bad.ok and bad.worst == "rank 1 saw float32, not bfloat16"
    none = common.saw_only("autocast", [{"outputs": [], "weights": [], "calls": 0}], "outputs",
                           "bfloat16")
    assert not none.ok and "no forward" in none.worst


def test_workers_used_needs_every_worker_on_every_rank() -> None:
    from trainer.jobs.loader import workers_used

    assert workers_used([[0, 1], [0, 1]], 2).ok
    main_process = workers_used([[-1], [-1]], 2)
    assert not main_process.ok and "rank 0 got batches from worker id(s) [-1]" in main_process.worst
    assert not workers_used([[0, 1], [0]], 2).ok  # one rank's second worker never delivered
    assert not workers_used([[], []], 0).ok  # no workers cannot pass


def test_worker_tagged_dataset_names_the_worker_that_read_each_sample() -> None:
    from torch.utils.data import DataLoader

    from trainer.jobs.loader import WorkerTagged

    data = WorkerTagged(TeacherDataset(8, (16,), 4, seed=1))
    assert {int(i) for _, _, w in DataLoader(data, batch_size=2) for i in w} == {-1}
    ids = {int(i) for _, _, w in DataLoader(data, batch_size=2, num_workers=2) for i in w}
    assert ids == {0, 1}


def test_dataparallel_on_a_cpu_host_is_observed_as_one_device() -> None:
    """On a host without 2 GPUs DataParallel is a pass-through: the replica probe sees the one
    device it ran on, and the observation FAILs where the numbers alone would pass."""
    from torch import nn

    from trainer.jobs.dp import ReplicaProbe, replicas_ran
    from trainer.models import mlp

    base = mlp(8)
    probe = ReplicaProbe(base)
    nn.DataParallel(base)(torch.randn(4, 16))
    devices = probe.remove()
    assert devices == ["cpu"]
    bad = replicas_ran(devices, 2)
    assert not bad.ok and bad.worst == "forward ran on cpu, not on each of cuda:0, cuda:1"
    assert replicas_ran(["cuda:1", "cuda:0"], 2).ok
    assert not replicas_ran(["cuda:0"], 2).ok


@pytest.mark.parametrize(("before", "after", "ok"), [
    (5.693, 5.168, True),    # measured: 8 CPU steps at lr 1e-3
    (5.693, 5.693, False),   # learning rate 0
    (5.693, 5.60, False),    # 1.6 %: below LEARN_MIN_DROP
    (5.693, float("nan"), False),
    (float("inf"), 1.0, False),
])
def test_throughput_learning_rule(before: float, after: float, ok: bool) -> None:
    from trainer.jobs import throughput

    assert throughput.LEARN_MIN_DROP == 0.02
    assert throughput.learned(before, after) is ok


def test_acceptance_test_controls_come_from_the_environment_for_launched_jobs_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(acceptance.ENV_CONTROLS, "bf16-no-autocast,,loader-no-workers,bogus")
    assert acceptance.test_controls(["bf16", "ddp"]) == ["bf16-no-autocast"]
    monkeypatch.delenv(acceptance.ENV_CONTROLS)
    assert acceptance.test_controls(["bf16"]) == []


# --- the size setting ------------------------------------------------------------------------

def test_size_auto_is_small_on_the_cpu_and_large_on_a_gpu() -> None:
    from trainer import sizes

    cpu, gpu = TrainConfig().sized(False), TrainConfig().sized(True)
    assert (cpu.size, cpu.hidden) == ("small", 64)
    assert (gpu.size, gpu.hidden) == ("large", sizes.MLP_LARGE_HIDDEN)
    assert TrainConfig(hidden=128).sized(True).hidden == 128  # an explicit width is kept
    assert TrainConfig(size="small").sized(True).hidden == 64
    with pytest.raises(ValueError, match="size must be one of auto, small, large"):
        TrainConfig(size="huge").validate()


def test_large_mlp_carries_hundreds_of_mb_of_gradients_per_step() -> None:
    from trainer import sizes

    assert 2e8 < sizes.mlp_gradient_bytes(sizes.MLP_LARGE_HIDDEN) < 1e9
    assert sizes.mlp_gradient_bytes(64) < 1e5  # the small size: the toy the tests need


@pytest.mark.parametrize("name", [n for n in profiles.available()
                                  if profiles.load(n).get("memory_gib")])
def test_large_throughput_model_fits_every_profile_and_moves_real_sizes(name: str) -> None:
    from trainer import sizes

    memory = float(profiles.load(name).get("memory_gib")) * 2 ** 30
    shape = sizes.large_gpt(memory)
    assert 1 <= shape.layers <= sizes.MAX_LAYERS
    assert shape.memory_bytes() <= sizes.MEMORY_FRACTION * memory
    assert 4 * shape.params() > 5e8  # hundreds of MB of fp32 gradients per step, at least


def test_gpt_shape_counts_agree_with_the_torch_model() -> None:
    from trainer.jobs import throughput
    from trainer.sizes import GptShape

    shape = GptShape(vocab=50, context=8, width=16, layers=2, heads=2, batch=1)
    model = throughput.Gpt(throughput.GptSize(50, 8, 16, 2, 2, 1, 0, 1))
    assert shape.params() == sum(p.numel() for p in model.parameters())
    assert shape.flops_per_token() == throughput.flops_per_token(
        model, throughput.GptSize(50, 8, 16, 2, 2, 1, 0, 1))


def test_docs_list_each_profiles_large_size_as_generated() -> None:
    from pathlib import Path

    from trainer import sizes

    docs = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text()
    assert sizes.profile_table() in docs, "regenerate: python -c 'from trainer import sizes; " \
                                          "print(sizes.profile_table())'"


def test_mfu_floors_cite_a_source_and_sit_below_it() -> None:
    """Every profile's train_mfu: a fraction, with a bf16 peak to divide by, and at most half of
    the public figure its comment quotes."""
    import re
    from pathlib import Path

    for path in sorted(Path(profiles.__file__).parent.glob("profiles/*.yaml")):
        p = profiles.load(path.stem)
        floor = p.get("thresholds.train_mfu")
        if floor is None:
            continue
        quoted = re.findall(r"MFU ([0-9.]+) %", path.read_text())
        assert p.get("peaks.bf16_tflops") and quoted, path.name
        assert 0 < float(floor) <= float(quoted[0]) / 100 / 2, path.name


def test_size_large_without_a_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ddp", "--size", "large", "--device", "cpu"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--size large is sized from the GPU's memory" in err


def test_bands_keep_their_calibrated_width_at_the_large_size() -> None:
    from trainer.jobs import common

    large = TrainConfig(size="large").sized(True)
    assert large.hidden == 8192 and common.band_hidden(large) == common.BAND_HIDDEN == 64
    assert common.band_hidden(TrainConfig(hidden=32).sized(False)) == 32


@pytest.mark.parametrize(("layers", "batch"), [(1, 1), (2, 2)])
def test_the_memory_estimate_matches_the_jobs_traced_training_step(layers: int, batch: int) -> None:
    """The formula that sizes `large` (20 bytes per parameter, 34 x width bytes per token and
    layer, the logits) against the throughput job's own model, AdamW and bf16 autocast traced on
    fake tensors at the large width and context: within 10 % (the profiles' shapes: 1-3 % over,
    benchmarks/large_memory.py). A change to the model or the training step that the estimate
    does not follow fails here."""
    from trainer import sizes
    from trainer.jobs import throughput

    shape = sizes.GptShape(sizes.LARGE_VOCAB, sizes.LARGE_CONTEXT, sizes.LARGE_WIDTH, layers,
                           sizes.LARGE_HEADS, batch)
    traced = throughput.traced_memory_bytes(shape)
    assert 0.9 * traced <= shape.memory_bytes() <= 1.1 * traced, (traced, shape.memory_bytes())
