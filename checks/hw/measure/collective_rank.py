"""Rank program of the collective check: exact correctness, then an nccl-tests-style sweep.

One rank per GPU with NCCL, or N CPU processes with gloo. Started and supervised by
`checks.hw.measure.collective_run.run` through `checks.supervise.launch`; by hand:

    python -m torch.distributed.run --nproc-per-node=2 -m checks.hw.measure.collective_rank \
        --min-bytes 8 --max-bytes 4194304 --warmup 2 --iters 5 --check-iters 5

Correctness uses rank-dependent integer patterns whose sums are exact in fp32, so any wrong
element is a real error, not rounding: rank r sends (r + 1) * s(k) + (i mod 251) at iteration k.
Besides the four swept collectives, two are checked exactly (not swept), because real training
depends on them: all-to-all (mixture-of-experts token routing; rank r's block j must arrive as
block r on rank j) and the float8 all-gather of float8 FSDP (e4m3 values sent as their bytes,
as torchao's float8 all-gather does; small integers, exact in e4m3). With --fsdp-elems N,
reduce-scatter and all-gather are checked once more at N elements (FSDP's message sizes).
Heartbeat phases (for NODECERT_INJECT): "init", "check OP K", "sweep OP BYTES"; corrupt
injections name the op ("corrupt:1@all_to_all").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from checks.hw.measure import busbw, cudatime
from checks.supervise.rank import Rank, run_rank

PERIOD = 251  # index pattern period; with s(k) <= 7 values stay < 2**24 for ~2000 ranks
MAX_ERRORS = 4
# torch 2.13 renamed the tensor-in/tensor-out collectives; older releases only have the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


EXACT_OPS = ("all_to_all", "all_gather_float8")
FLOAT8_MIN_CC = (8, 9)  # Ada/Hopper: the first GPUs with float8 tensor cores


def float8_unsupported(device: torch.device) -> str | None:
    """Why the float8 all-gather does not apply here, or None."""
    if not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no float8 dtypes"
    if device.type == "cuda":
        cc = torch.cuda.get_device_capability(device)
        if cc < FLOAT8_MIN_CC:
            return (f"GPU compute capability {cc[0]}.{cc[1]} has no float8 tensor cores "
                    "(float8 training needs 8.9 or later)")
    return None


def _scale(k: int) -> int:
    return 1 + k % 7


class Collectives:
    """The four collectives with known-answer patterns, for one rank."""

    def __init__(self, rank: Rank, device: torch.device) -> None:
        self.r = rank
        self.n = rank.world_size
        self.me = rank.rank
        self.device = device

    def _idx(self, start: int, count: int) -> torch.Tensor:
        return torch.arange(start, start + count, device=self.device, dtype=torch.int64)

    def pattern(self, src: int, k: int, start: int, count: int) -> torch.Tensor:
        """What rank `src` contributes at iteration k for elements start..start+count."""
        return ((src + 1) * _scale(k) + self._idx(start, count) % PERIOD).to(torch.float32)

    def reduced(self, k: int, start: int, count: int) -> torch.Tensor:
        """The exact sum of every rank's pattern."""
        n = self.n
        return (_scale(k) * n * (n + 1) // 2 + n * (self._idx(start, count) % PERIOD)).to(
            torch.float32)

    def _input(self, op: str, src: int, k: int, count: int, corrupt: bool) -> torch.Tensor:
        x = self.pattern(src, k, 0, count)
        if corrupt:
            x[min(5, count - 1)] += 1.0  # one element off by one: the smallest detectable fault
        return x

    def verify(self, op: str, k: int, count: int, corrupt: bool) -> tuple[int, list[dict[str, Any]],
                                                                         torch.Tensor | None]:
        """Run `op` once on a known pattern of `count` elements (whole buffer).

        Returns (wrong element count, errors, this rank's input for diagnosis).
        """
        n, me = self.n, self.me
        if op == "all_reduce":
            sent = self._input(op, me, k, count, corrupt)
            x = sent.clone()
            dist.all_reduce(x)
            return (*self._compare(op, k, x, self.reduced(k, 0, count), None), sent)
        if op == "reduce_scatter":
            chunk = count // n
            sent = self._input(op, me, k, chunk * n, corrupt)
            out = torch.empty(chunk, device=self.device)
            _REDUCE_SCATTER(out, sent)
            wrong, errors = self._compare(op, k, out, self.reduced(k, me * chunk, chunk), None,
                                          offset=me * chunk)
            return wrong, errors, sent
        if op == "all_gather":
            chunk = count // n
            out = torch.full((chunk * n,), -1.0, device=self.device)
            _ALL_GATHER(out, self._input(op, me, k, chunk, corrupt))
            wrong, errors = 0, []
            for src in range(n):
                w, e = self._compare(op, k, out[src * chunk:(src + 1) * chunk],
                                     self.pattern(src, k, 0, chunk), src)
                wrong, errors = wrong + w, errors + e
            return wrong, errors[:MAX_ERRORS], None
        if op == "all_to_all":
            # rank me's block j goes to rank j: rank me receives block me of every src
            chunk = count // n
            sent = self._input(op, me, k, chunk * n, corrupt)
            out = torch.full((chunk * n,), -1.0, device=self.device)
            dist.all_to_all_single(out, sent)
            wrong, errors = 0, []
            for src in range(n):
                w, e = self._compare(op, k, out[src * chunk:(src + 1) * chunk],
                                     self.pattern(src, k, me * chunk, chunk), src,
                                     offset=src * chunk)
                wrong, errors = wrong + w, errors + e
            return wrong, errors[:MAX_ERRORS], None
        if op == "all_gather_float8":
            chunk = count // n
            mine = self._float8(self._small(me, k, chunk, corrupt))
            out = torch.zeros(chunk * n, dtype=torch.uint8, device=self.device)
            _ALL_GATHER(out, mine.view(torch.uint8))
            got = out.view(torch.float8_e4m3fn).to(torch.float32)
            wrong, errors = 0, []
            for src in range(n):
                w, e = self._compare(op, k, got[src * chunk:(src + 1) * chunk],
                                     self._small(src, k, chunk, False), src)
                wrong, errors = wrong + w, errors + e
            return wrong, errors[:MAX_ERRORS], None
        if op == "broadcast":
            root = k % n
            x = (self._input(op, me, k, count, corrupt) if me == root
                 else torch.full((count,), -1.0, device=self.device))
            dist.broadcast(x, src=root)
            return (*self._compare(op, k, x, self.pattern(root, k, 0, count), root), None)
        raise ValueError(f"unknown collective {op!r}")

    def _small(self, src: int, k: int, count: int, corrupt: bool) -> torch.Tensor:
        """Rank src's float8 pattern: integers 0..15, exact in e4m3 (3 mantissa bits)."""
        x = (((src + 1) * _scale(k) + self._idx(0, count)) % 16).to(torch.float32)
        if corrupt:
            x[min(5, count - 1)] = (x[min(5, count - 1)] + 1) % 16
        return x

    @staticmethod
    def _float8(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float8_e4m3fn)

    def _compare(self, op: str, k: int, got: torch.Tensor, expected: torch.Tensor,
                 source: int | None, offset: int = 0) -> tuple[int, list[dict[str, Any]]]:
        bad = got != expected
        wrong = int(bad.sum().item())
        if not wrong:
            return 0, []
        i = int(bad.nonzero()[0].item())
        return wrong, [{"op": op, "rank": self.me, "iteration": k, "wrong": wrong,
                        "index": i + offset, "got": got[i].item(), "expected": expected[i].item(),
                        "source": source}]

    def blame_contributions(self, k: int, sent: torch.Tensor) -> list[int]:
        """After a wrong sum: gather every rank's input and name those that differ from their
        pattern (a corrupt sender) -- empty when the inputs were right and the transport or the
        reduction broke."""
        everyone = torch.empty(sent.numel() * self.n, device=self.device)
        _ALL_GATHER(everyone, sent)
        parts = everyone.view(self.n, -1)
        return [src for src in range(self.n)
                if not torch.equal(parts[src], self.pattern(src, k, 0, sent.numel()))]

    def timed(self, op: str, count: int, warmup: int, iters: int) -> float:
        """Seconds per operation on zero-filled buffers (contents do not change the cost)."""
        n, dev = self.n, self.device
        if op == "all_reduce":
            buf = torch.zeros(count, device=dev)
            fn: Callable[[], Any] = lambda: dist.all_reduce(buf)  # noqa: E731
        elif op == "all_gather":
            src, out = torch.zeros(count // n, device=dev), torch.zeros(count, device=dev)
            fn = lambda: _ALL_GATHER(out, src)  # noqa: E731
        elif op == "reduce_scatter":
            src, out = torch.zeros(count, device=dev), torch.zeros(count // n, device=dev)
            fn = lambda: _REDUCE_SCATTER(out, src)  # noqa: E731
        elif op == "all_to_all":
            src, out = torch.zeros(count, device=dev), torch.zeros(count, device=dev)
            fn = lambda: dist.all_to_all_single(out, src)  # noqa: E731
        else:
            buf = torch.zeros(count, device=dev)
            fn = lambda: dist.broadcast(buf, src=0)  # noqa: E731
        for _ in range(warmup):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            with cudatime.span(dev) as pair:  # on the rank's GPU's stream (cudatime)
                for _ in range(iters):
                    fn()
            pair[1].synchronize()
            return cudatime.elapsed_s([pair], dev) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters


def _flag(value: float, device: torch.device, op: Any) -> float:
    t = torch.tensor([float(value)], device=device)
    dist.all_reduce(t, op=op)
    return float(t.item())


def correctness(c: Collectives, rank: Rank, op: str, iters: int, count: int) -> list[dict[str, Any]]:
    """`iters` iterations of `op`; stops at the first iteration where any rank saw an error."""
    corrupt = rank.should_corrupt(op)
    for k in range(iters):
        rank.beat(f"check {op} {k}")
        _wrong, errors, sent = c.verify(op, k, count, corrupt)
        if _flag(len(errors), c.device, dist.ReduceOp.MAX) == 0:
            continue
        if sent is not None:
            senders = c.blame_contributions(k, sent)
            for e in errors:
                e["senders_wrong"] = senders
        return errors
    return []


def sweep(c: Collectives, rank: Rank, op: str, sizes: list[int], warmup: int,
          iters: int) -> list[dict[str, Any]]:
    rows = []
    corrupt = rank.should_corrupt(op)
    for k, size in enumerate(sizes):
        count = busbw.elements_for(op, size, c.n)
        rank.beat(f"sweep {op} {count * 4}")
        seconds = c.timed(op, count, warmup, iters)
        wrong, _errors, _ = c.verify(op, k, count, corrupt)
        total = torch.tensor([seconds, float(wrong)], device=c.device, dtype=torch.float64)
        dist.all_reduce(total)
        rows.append(busbw.complete_row(op, {
            "bytes": count * 4, "count": count, "time_us": total[0].item() / c.n * 1e6,
            "wrong": int(total[1].item())}, c.n))
    return rows


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="collective_rank")
    p.add_argument("--ops", default=",".join(busbw.OPS))
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=4 << 20)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--check-iters", type=int, default=5)
    p.add_argument("--check-elems", type=int, default=(1 << 16) + 3)
    p.add_argument("--exact-ops", default=",".join(EXACT_OPS),
                   help="collectives checked exactly but not swept")
    p.add_argument("--fsdp-elems", type=int, default=0,
                   help="also check reduce-scatter and all-gather once at this many elements")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--pg-timeout-s", type=float, default=300.0)
    return p.parse_args(argv)


def _init(rank: Rank, backend: str, timeout_s: float) -> torch.device:
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if backend != "nccl":
        dist.init_process_group(backend, timeout=timeout)
        return torch.device("cpu")
    device = torch.device("cuda", rank.local_rank)
    torch.cuda.set_device(device)
    try:  # binding the device makes NCCL initialise eagerly (torch >= 2.3)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    except TypeError:
        dist.init_process_group("nccl", timeout=timeout)
    return device


def body(rank: Rank, argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ops = [o for o in args.ops.split(",") if o]
    rank.beat("init")
    t0 = time.perf_counter()
    device = _init(rank, args.backend, args.pg_timeout_s)
    backend = dist.get_backend()
    try:
        c = Collectives(rank, device)
        errors: list[dict[str, Any]] = []
        count = max(args.check_elems, c.n)
        t1 = time.perf_counter()
        for op in ops:
            errors += correctness(c, rank, op, args.check_iters, count)
        exact, skipped = [], {}
        for op in [o for o in args.exact_ops.split(",") if o and o not in ops]:
            why = float8_unsupported(device) if op == "all_gather_float8" else None
            if why:
                skipped[op] = why
                continue
            errors += correctness(c, rank, op, args.check_iters, count)
            exact.append(op)
        fsdp: dict[str, int] = {}
        if args.fsdp_elems:
            fsdp_count = max(args.fsdp_elems // c.n * c.n, c.n)
            for op in ("reduce_scatter", "all_gather"):
                errors += correctness(c, rank, op, 1, fsdp_count)
                fsdp[op] = fsdp_count
        t2 = time.perf_counter()
        sizes = busbw.sweep_sizes(args.min_bytes, args.max_bytes, args.factor)
        curves = {op: sweep(c, rank, op, sizes, args.warmup, args.iters) for op in ops}
        t3 = time.perf_counter()
    finally:
        dist.destroy_process_group()
    if errors:
        for e in errors:
            rank.log(f"WRONG {e['op']} iteration {e['iteration']}: {e['wrong']} element(s), first "
                     f"at index {e['index']}: got {e['got']:g}, expected {e['expected']:g}")
    else:
        rank.log(f"OK: {', '.join(ops + exact)} exact over {args.check_iters} iterations "
                 f"of {count} elements on {device}")
    result: dict[str, Any] = {"rank": rank.rank, "device": str(device), "errors": errors}
    if rank.local_rank == 0:  # the first rank of each node reports (one node: rank 0)
        tables = [busbw.format_table(op, rows, nranks=c.n, backend=backend)
                  for op, rows in curves.items()]
        if rank.rank == 0:
            print("\n\n".join(tables), flush=True)
        result.update(backend=backend, world_size=c.n, dtype="float32", ops=curves,
                      table="\n\n".join(tables), check_iters=args.check_iters,
                      check_elems=count, exact_ops=exact, exact_skipped=skipped,
                      fsdp_checked=fsdp, phase_s={"init": round(t1 - t0, 3),
                                                  "correctness": round(t2 - t1, 3),
                                                  "sweep": round(t3 - t2, 3)})
    return result


if __name__ == "__main__":
    sys.exit(run_rank(body))
