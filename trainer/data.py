"""Synthetic, learnable, seeded datasets and the sampler arithmetic the references rebuild.

The seeds' `DataLoader(torch.randn(32, 10))` yields bare tensors, so `for data, target in loader`
cannot work; these datasets return (input, target) pairs where the target is a fixed function of
the input (a random "teacher"), so the loss really goes down.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset


class TeacherDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """`n` inputs of shape `in_shape` ~ N(mean, std), targets tanh(flatten(x) @ W) + small noise."""

    def __init__(self, n: int, in_shape: tuple[int, ...], d_out: int, seed: int,
                 dtype: torch.dtype = torch.float32, mean: float = 0.0, std: float = 1.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = (torch.randn(n, *in_shape, generator=g, dtype=torch.float64) * std + mean)
        d_in = math.prod(in_shape)
        teacher = torch.randn(d_in, d_out, generator=g, dtype=torch.float64) / math.sqrt(d_in)
        noise = 0.01 * torch.randn(n, d_out, generator=g, dtype=torch.float64)
        self.y = torch.tanh((self.x.flatten(1) - mean) / std @ teacher) + noise
        self.x, self.y = self.x.to(dtype), self.y.to(dtype)

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def sampler_size(n: int, replicas: int, drop_last: bool = True) -> int:
    """Samples per replica of DistributedSampler (its documented arithmetic)."""
    if drop_last and n % replicas:
        return math.ceil((n - replicas) / replicas)
    return math.ceil(n / replicas)


def epoch_indices(n: int, replicas: int, seed: int, epoch: int) -> list[list[int]]:
    """Each replica's indices for one epoch of DistributedSampler(shuffle=True, drop_last=True),
    rebuilt independently: permutation seeded with seed + epoch, truncated, then strided."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    total = sampler_size(n, replicas) * replicas
    perm = perm[:total]
    return [perm[r:total:replicas] for r in range(replicas)]


def global_batches(n: int, replicas: int, batch: int, seed: int, steps: int) -> list[list[int]]:
    """Indices of the global batch (all replicas' step-k batches, in rank order) for each step."""
    out: list[list[int]] = []
    epoch = 0
    while len(out) < steps:
        per_replica = epoch_indices(n, replicas, seed, epoch)
        for s in range(len(per_replica[0]) // batch):
            if len(out) == steps:
                break
            out.append([i for idx in per_replica for i in idx[s * batch:(s + 1) * batch]])
        epoch += 1
    return out


def dataset_size(replicas: int, batch: int, steps_per_epoch: int) -> int:
    """One sample more than the replicas can share evenly, so padding (drop_last=False) would
    repeat samples and show up in the comparison."""
    return steps_per_epoch * replicas * batch + 1
