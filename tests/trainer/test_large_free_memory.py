"""The throughput job's `large` size is fitted into the ranks' free GPU memory, not their total
(no GPU here: torch.cuda's memory queries replaced, one fake rank 0 that sees two ranks)."""

from __future__ import annotations

import types

import torch

from trainer import sizes
from trainer.config import TrainConfig
from trainer.jobs import throughput

GIB = 2 ** 30


class _Env:
    """Rank 0 of two; the other rank reports `other_free` bytes free."""
    device = torch.device("cuda", 0)
    is_cuda = True

    def __init__(self, other_free: int) -> None:
        self.other_free = other_free

    def gather(self, obj):
        return [obj, self.other_free]

    def broadcast(self, obj):
        return obj


def test_large_is_sized_from_free_memory(monkeypatch):
    # An 80 GiB GPU of which another process holds 60 GiB.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=80 * GIB))
    size = throughput.size_for(_Env(other_free=30 * GIB), TrainConfig(size="large"))
    want = sizes.large_gpt(20 * GIB)   # the smallest free memory of the ranks
    assert (size.layers, size.width, size.batch) == (want.layers, want.width, want.batch)
    assert size.layers < sizes.large_gpt(80 * GIB).layers


def test_gpt_is_built_on_the_target_device():
    """Parameters are created on the device asked for (meta stands in for a GPU: nothing is
    allocated or initialised on the CPU first), and on the CPU the build is the seeded Gpt(s)."""
    s = throughput.CPU_SIZE
    on_meta = throughput.build_gpt(s, torch.device("meta"), seed=5)
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    torch.manual_seed(5)
    reference = throughput.Gpt(s)
    built = throughput.build_gpt(s, torch.device("cpu"), seed=5)
    for (name, a), (_, b) in zip(reference.state_dict().items(), built.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
