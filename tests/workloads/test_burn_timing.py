"""Burn-in and the P2P copy check, on CPU tensors: what is timed and what is compared."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest
import torch

from checks.hw.measure import burn as burn_mod
from checks.hw.measure import compute_run


def test_burn_tflops_times_only_the_matmuls(monkeypatch):
    """A slow bit comparison does not lower the TFLOP/s figure: only the GEMMs are timed."""
    real_bits = burn_mod._bits

    def slow_bits(t):
        time.sleep(0.02)
        return real_bits(t)

    monkeypatch.setattr(burn_mod, "_bits", slow_bits)
    out = burn_mod.burn([torch.device("cpu")], duration_s=0.4, n=32, dtype="fp32")
    row = out["devices"][0]
    loop_mms = row["iterations"] - 1
    assert loop_mms >= 2 and row["mismatched_elements"] == 0
    # Every loop iteration slept >= 2 x 20 ms in the comparison; the matmuls of a 32x32 took far less.
    # TFLOP/s is computed over row["matmul_s"], the GEMMs' own time.
    assert 0 < row["matmul_s"] < 0.5 * out["duration_s"]


def test_p2p_pattern_is_nonzero_and_position_dependent():
    a = compute_run.p2p_pattern(1 << 20, 0, torch.device("cpu"))
    b = compute_run.p2p_pattern(1 << 20, 1, torch.device("cpu"))
    assert bool((a != 0).all()) and bool((b != 0).all())
    assert not torch.equal(a, b)
    assert len(torch.unique(a[:4096])) == 4096  # neighbours differ: a shifted copy is caught
    assert torch.equal(a, compute_run.p2p_pattern(1 << 20, 0, torch.device("cpu")))


def test_p2p_copy_check_covers_the_whole_buffer():
    n = 1 << 20
    dst = compute_run.p2p_pattern(n, 3, torch.device("cpu"))
    assert compute_run.p2p_copy_ok(dst, 3)
    for where in (n - 1, n // 2, 17):
        bad = dst.clone()
        bad[where] += 1
        assert not compute_run.p2p_copy_ok(bad, 3), where
    assert not compute_run.p2p_copy_ok(torch.zeros(n), 3)   # fresh memory is not a copy
    assert not compute_run.p2p_copy_ok(dst, 2)              # another GPU's buffer is not either


# --- GPU timing on a multi-GPU node, with a stand-in for torch.cuda --------------------------
# No GPU here: FakeCuda replaces the pieces of torch.cuda the timing uses (Event, current_stream,
# the device context, synchronize, current_device) with a model that keeps one stream per device
# and one clock. Work queued on a stream finishes `seconds` after the stream is free; an event
# recorded on a stream completes when the work queued before it does. Events recorded on another
# device's stream therefore time that stream, not the work: the bug these tests are about.


class FakeStream:
    def __init__(self, index: int) -> None:
        self.index = index
        self.busy_until = 0.0


class FakeGpuTensor:
    """What the timed code reads of a CUDA tensor: its device."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)


class FakeCuda:
    HOST_OP_S = 1e-6  # each call on the host moves the clock on a little

    def __init__(self, gpus: int) -> None:
        self.now = 0.0
        self.current = 0
        self.streams = [FakeStream(i) for i in range(gpus)]
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.index: int | None = None
                self.t: float | None = None

            def record(self, stream: FakeStream | None = None) -> None:
                stream = stream or fake.current_stream()
                if self.index is not None and self.index != stream.index:
                    raise RuntimeError("Event device does not match recording stream's device")
                self.index, self.t = stream.index, max(fake.now, stream.busy_until)
                fake.tick()

            def synchronize(self) -> None:
                assert self.t is not None, "event never recorded"
                fake.now = max(fake.now, self.t)

            def elapsed_time(self, end: Event) -> float:
                if self.t is None or end.t is None:
                    raise RuntimeError("Both events must be recorded before calculating elapsed time.")
                if self.index != end.index:
                    raise RuntimeError("events on different devices")
                if fake.now < max(self.t, end.t):
                    raise RuntimeError("CUDA error: device not ready")
                return (end.t - self.t) * 1e3

        self.Event = Event

    def tick(self) -> None:
        self.now += self.HOST_OP_S

    def _index(self, device: object = None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        index = torch.device(device).index  # type: ignore[arg-type]
        return self.current if index is None else index

    def current_stream(self, device: object = None) -> FakeStream:
        return self.streams[self._index(device)]

    def current_device(self) -> int:
        return self.current

    def synchronize(self, device: object = None) -> None:
        self.now = max(self.now, self.current_stream(device).busy_until)

    @contextlib.contextmanager
    def device(self, device: object) -> Iterator[None]:
        before, self.current = self.current, self._index(device)
        try:
            yield
        finally:
            self.current = before

    def launch(self, device: torch.device, seconds: float) -> None:
        """An op on `device`'s tensors: queued on that device's current stream."""
        stream = self.current_stream(device)
        stream.busy_until = max(self.now, stream.busy_until) + seconds
        self.tick()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
        for name in ("Event", "current_stream", "current_device", "synchronize", "device"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self


GEMM_S = [0.010, 0.020, 0.010, 0.040]  # GPU 1 at half its peers' speed, GPU 3 at a quarter


def test_burn_times_each_gemm_on_its_own_gpu(monkeypatch):
    """Burn-in's loop on 4 GPUs (its _timed_mm per device, then a synchronize of each device and
    the collection): each GPU's matmul time is its own GEMMs' time, so GPU 0 is not the straggler
    and the others do not read near zero (recording on the current device's stream did both)."""
    cuda = FakeCuda(len(GEMM_S)).install(monkeypatch)
    monkeypatch.setattr(torch, "mm", lambda a, b, out=None: cuda.launch(a.device, GEMM_S[a.device.index]))
    devices = [torch.device("cuda", i) for i in range(len(GEMM_S))]
    state = [{"a": FakeGpuTensor(i), "b": FakeGpuTensor(i), "out": FakeGpuTensor(i), "mm_s": 0.0,
              "events": []} for i in range(len(GEMM_S))]
    rounds = 5
    for k in range(rounds):
        for s in state:
            burn_mod._timed_mm(s)
        if k == 2 or k == rounds - 1:  # burn() collects at each bounded-queue sync and at the end
            for dev in devices:
                torch.cuda.synchronize(dev)
            for s in state:
                burn_mod._collect_events(s)
    assert [s["mm_s"] for s in state] == pytest.approx([rounds * g for g in GEMM_S], abs=1e-4)


def test_best_seconds_times_the_measured_gpu(monkeypatch):
    """compute_run's timing of GPU 2 with GPU 0 current: the events go on GPU 2's stream."""
    cuda = FakeCuda(3).install(monkeypatch)
    monkeypatch.setattr(time, "perf_counter", lambda: cuda.now)
    gpu2 = torch.device("cuda", 2)
    cuda.launch(torch.device("cuda", 0), 5.0)   # GPU 0 busy with something else meanwhile
    seconds = compute_run._best_seconds(lambda: cuda.launch(gpu2, 0.25), gpu2, warmup=1,
                                        repeats=2, min_time_s=0.0)
    assert seconds == pytest.approx(0.25, abs=1e-5)  # the host ticks of the fake


def test_collective_timing_times_the_ranks_gpu(monkeypatch):
    """collective_rank's sweep timing on a rank whose GPU is cuda:1, the current device cuda:0."""
    from checks.hw.measure import collective_rank

    cuda = FakeCuda(2).install(monkeypatch)
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **kw: FakeGpuTensor(device.index)
                        if device is not None and torch.device(device).type == "cuda"
                        else real_zeros(*a, device=device, **kw))
    monkeypatch.setattr(collective_rank.dist, "all_reduce",
                        lambda buf, *a, **kw: cuda.launch(buf.device, 0.003))
    c = collective_rank.Collectives.__new__(collective_rank.Collectives)
    c.n, c.device = 2, torch.device("cuda", 1)
    assert c.timed("all_reduce", 1024, warmup=1, iters=4) == pytest.approx(0.003, abs=1e-5)
