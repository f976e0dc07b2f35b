"""The throughput job's `large` size is fitted into the ranks' free GPU memory, not their total,
and ranks sharing a GPU split it (no GPU here: torch.cuda's memory queries replaced, one fake
rank 0 that sees two ranks)."""

from __future__ import annotations

import types

import torch

from trainer import sizes
from trainer.config import TrainConfig
from trainer.jobs import throughput

GIB = 2 ** 30


class _Env:
    """Rank 0 of two on cuda:0. The other rank reports what `other(obj)` makes of rank 0's
    report: the same report when both ranks share cuda:0."""
    device = torch.device("cuda", 0)
    is_cuda = True

    def __init__(self, other) -> None:
        self.other = other

    def gather(self, obj):
        return [obj, self.other(obj)]

    def broadcast(self, obj):
        return obj


def test_large_is_sized_from_free_memory(monkeypatch):
    # An 80 GiB GPU of which another process holds 60 GiB.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (20 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=80 * GIB))
    on_gpu1 = _Env(lambda obj: ((obj[0][0], 1), 30 * GIB))   # the other rank: cuda:1, 30 GiB free
    size = throughput.size_for(on_gpu1, TrainConfig(size="large"))
    want = sizes.large_gpt(20 * GIB)   # the smallest free memory of the ranks
    assert (size.layers, size.width, size.batch) == (want.layers, want.width, want.batch)
    assert size.layers < sizes.large_gpt(80 * GIB).layers


def test_ranks_sharing_a_gpu_split_its_free_memory(monkeypatch):
    """Two ranks on one 80 GiB GPU (--share-gpu, --size large): each is sized from 40 GiB, not
    from the whole GPU (two models of half the GPU each would not fit next to each other)."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * GIB, 80 * GIB))
    size = throughput.size_for(_Env(lambda obj: obj), TrainConfig(size="large"))
    want = sizes.large_gpt(40 * GIB)
    assert (size.layers, size.batch) == (want.layers, want.batch)
    assert size.layers < sizes.large_gpt(80 * GIB).layers


def test_rank_shares_divide_each_gpu_among_its_ranks():
    # host a: 2 ranks on GPU 0 (read 80 and 78 GiB free), 1 on GPU 1; host b: 1 rank on GPU 0
    ranks = [(("a", 0), 80 * GIB), (("a", 0), 78 * GIB), (("a", 1), 80 * GIB), (("b", 0), 70 * GIB)]
    assert sizes.rank_shares(ranks) == [39 * GIB, 39 * GIB, 80 * GIB, 70 * GIB]
    assert sizes.rank_shares([(("a", g), 80 * GIB) for g in range(8)]) == [80 * GIB] * 8


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
