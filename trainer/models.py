"""Small deterministic models (no dropout: per-rank dropout masks would differ)."""

from __future__ import annotations

import torch
from torch import nn

D_IN, D_OUT = 16, 4
IMAGE = (3, 6, 6)  # SyncBN job input: channels, height, width


def mlp_blocks(n_blocks: int, hidden: int, d_in: int = D_IN, d_out: int = D_OUT) -> list[nn.Module]:
    """n_blocks blocks: Linear+Tanh, ..., last one a plain Linear. One block per pipeline stage."""
    widths = [d_in] + [hidden] * (n_blocks - 1) + [d_out]
    blocks: list[nn.Module] = []
    for i in range(n_blocks):
        layers: list[nn.Module] = [nn.Linear(widths[i], widths[i + 1])]
        if i < n_blocks - 1:
            layers.append(nn.Tanh())
        blocks.append(nn.Sequential(*layers))
    return blocks


def mlp(hidden: int, n_blocks: int = 3) -> nn.Sequential:
    return nn.Sequential(*mlp_blocks(n_blocks, hidden))


def conv_bn_net(channels: int = 8) -> nn.Sequential:
    """Conv -> BatchNorm -> ReLU -> global average pool -> Linear."""
    return nn.Sequential(nn.Conv2d(IMAGE[0], channels, 3, padding=1), nn.BatchNorm2d(channels),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(channels, D_OUT))


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name, detached copies on the CPU (for gathering and comparing)."""
    state: dict[str, torch.Tensor] = dict(module.named_parameters())
    state.update(dict(module.named_buffers()))
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def unwrap_names(state: dict[str, torch.Tensor], prefix: str = "module.") -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items()}
