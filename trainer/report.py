"""What a job reports: comparisons against the reference, figures, and one verdict."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"


@dataclass
class Comparison:
    """`actual` vs `expected` under |a - e| <= atol + rtol * |e| (torch.allclose semantics)."""

    name: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    worst: str = ""  # which tensor held the largest violation (or difference)

    def describe(self) -> str:
        verdict = "within" if self.ok else "OUTSIDE"
        return (f"{self.name}: max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g} {verdict} "
                f"rtol {self.rtol:g} / atol {self.atol:g}" + (f" (worst: {self.worst})" if self.worst
                                                              else ""))


def compare(name: str, actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
            rtol: float, atol: float) -> Comparison:
    """Compare two name->tensor mappings with the same keys; differences computed in float64."""
    if actual.keys() != expected.keys():
        missing = sorted(set(expected) ^ set(actual))
        return Comparison(name, float("inf"), float("inf"), rtol, atol, False,
                          f"tensors differ in name: {missing[:4]}")
    max_abs = max_rel = 0.0
    worst, worst_excess, ok = "", -float("inf"), True
    for key, exp in expected.items():
        act = actual[key].detach().to("cpu", torch.float64)
        exp = exp.detach().to("cpu", torch.float64)
        if act.shape != exp.shape:
            return Comparison(name, float("inf"), float("inf"), rtol, atol, False,
                              f"{key}: shape {tuple(act.shape)} vs {tuple(exp.shape)}")
        diff = (act - exp).abs()
        if diff.numel() == 0:
            continue
        excess = (diff - (atol + rtol * exp.abs())).max().item()
        max_abs = max(max_abs, diff.max().item())
        max_rel = max(max_rel, (diff / exp.abs().clamp_min(1e-12)).max().item())
        ok = ok and excess <= 0 and bool(torch.isfinite(act).all())
        if excess > worst_excess:
            worst, worst_excess = key, excess
    return Comparison(name, max_abs, max_rel, rtol, atol, ok, worst)


def identical(name: str, replicas: list[dict[str, torch.Tensor]]) -> Comparison:
    """Replicas must hold bit-identical tensors (same reduced gradients, same optimizer)."""
    result = Comparison(name, 0.0, 0.0, 0.0, 0.0, True)
    for i, other in enumerate(replicas[1:], start=1):
        c = compare(name, other, replicas[0], 0.0, 0.0)
        if c.max_abs > result.max_abs or not c.ok:
            result = Comparison(name, c.max_abs, c.max_rel, 0.0, 0.0, result.ok and c.ok,
                                f"replica {i} vs replica 0: {c.worst}")
    return result


@dataclass
class JobReport:
    job: str
    status: str
    message: str
    figures: dict[str, float] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def judge(cls, job: str, comparisons: list[Comparison], summary: str, **kw: Any) -> JobReport:
        """PASS when every comparison holds; otherwise FAIL naming the first one that did not."""
        bad = [c for c in comparisons if not c.ok]
        if bad:
            return cls(job, FAIL, bad[0].describe(), comparisons=comparisons, **kw)
        return cls(job, PASS, summary, comparisons=comparisons, **kw)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobReport:
        comps = [Comparison(**c) for c in data.get("comparisons", [])]
        return cls(job=data["job"], status=data["status"], message=data["message"],
                   figures=dict(data.get("figures", {})), comparisons=comps,
                   details=dict(data.get("details", {})))


def throughput(samples: int, seconds: float) -> float:
    return samples / seconds if seconds > 0 else float("nan")
