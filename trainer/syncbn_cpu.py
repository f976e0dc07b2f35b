"""A small synchronized BatchNorm for CPU process groups (gloo), for the acceptance harness.

torch's nn.SyncBatchNorm trains only on GPU (its stats kernels have no CPU backend). This module
computes the batch statistics over every rank with autograd-aware all-reduces
(torch.distributed._functional_collectives backpropagates them), so the backward also sums the
gradient terms of the statistics over the ranks, as nn.SyncBatchNorm's backward does. Uneven
per-rank batch sizes are handled by reducing the element count with the sums. Two passes (mean,
then the centred sum of squares) keep fp32 cancellation out of the variance.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def _all_reduce_sum(t: torch.Tensor, group: Any) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(t, "sum", group))


class GlooSyncBatchNorm(_BatchNorm):
    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, group: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input, got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training and self.track_running_stats:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                            self.bias, False, 0.0, self.eps)
        if self.momentum is None:
            raise ValueError("cumulative moving average (momentum=None) is not supported")
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        count = torch.full((1,), x.numel() // c, dtype=x.dtype, device=x.device)
        sums = _all_reduce_sum(torch.cat([x.sum(dims), count]), self.group)
        total = sums[c]
        mean = sums[:c] / total
        centred = x - mean.view(shape)
        var = _all_reduce_sum((centred * centred).sum(dims), self.group) / total  # biased
        if self.track_running_stats and self.running_mean is not None:
            assert self.running_var is not None and self.num_batches_tracked is not None
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                # The running variance is unbiased over the GLOBAL element count.
                unbiased = var * total / (total - 1)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
                self.num_batches_tracked.add_(1)
        out = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def convert(module: nn.Module, group: Any) -> nn.Module:
    """Like nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm*D becomes GlooSyncBatchNorm
    with the same parameters and buffers."""
    if isinstance(module, _BatchNorm):
        like = module.running_mean if module.running_mean is not None else module.weight
        new = GlooSyncBatchNorm(module.num_features, module.eps, module.momentum or 0.1,
                                module.affine, module.track_running_stats, group)
        # Match device and dtype BEFORE loading: load_state_dict would round float64 to float32.
        new.to(device=like.device, dtype=like.dtype)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        module.add_module(name, convert(child, group))
    return module
