"""Burn-in and the P2P copy check, on CPU tensors: what is timed and what is compared."""

from __future__ import annotations

import time

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
