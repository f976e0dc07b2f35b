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
Heartbeat phases (for NODECERT_INJECT): "init", "check OP K", "sweep sizing", "sweep OP BYTES"; corrupt
injections name the op ("corrupt:1@all_to_all").

How far the sweep goes: every op to --max-bytes, then all-reduce on to --floor-bytes (the size
the profile's floor is published at). A size is left out when a verified op of that size does
not fit the GPU memory the fullest rank has free (busbw.max_verified_bytes; --free-bytes bounds
it further, and alone on CPU), or when rank 0 expects it to end past --deadline or to take longer
than --step-max-s between two heartbeats; the result's `cut` says which op stopped where and why.
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

    def _periodic(self, start: int, count: int) -> torch.Tensor:
        """(i mod PERIOD) for i in start..start+count, as float32 built from one period: one
        buffer of the message's size, where int64 indices would need two more of twice its size
        (a 16 GiB all-reduce would not fit an 80 GB GPU)."""
        phase = start % PERIOD
        period = torch.arange(PERIOD, device=self.device, dtype=torch.float32)
        return period.repeat(-(-(phase + count) // PERIOD))[phase:phase + count]

    def pattern(self, src: int, k: int, start: int, count: int) -> torch.Tensor:
        """What rank `src` contributes at iteration k for elements start..start+count."""
        return self._periodic(start, count).add_((src + 1) * _scale(k))

    def reduced(self, k: int, start: int, count: int) -> torch.Tensor:
        """The exact sum of every rank's pattern (integers below 2**24: exact in float32)."""
        n = self.n
        return self._periodic(start, count).mul_(n).add_(_scale(k) * n * (n + 1) // 2)

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


class Pace:
    """When the sweep stops for time. Rank 0 alone decides, from its own clock (ranks on other
    hosts may disagree on the time), and every rank learns it in the all-reduce that already
    sums each size's figures: so all ranks run the same sizes.

    The next size is expected to take as long as the last one did (its wall time, timing and
    verification) times the ratio of their sizes; it is skipped when that would end past
    `deadline` (time.time() seconds) or take longer than `step_max_s` (a heartbeat comes once a
    size: a longer step looks like a hang to the launcher)."""

    def __init__(self, deadline: float | None = None, step_max_s: float | None = None) -> None:
        self.deadline = deadline
        self.step_max_s = step_max_s
        self.last: tuple[int, float] | None = None  # (bytes, wall seconds) of the last size
        self.stopped: str | None = None

    def veto(self, size: int) -> str | None:
        """Why `size` should not be run (rank 0's view), or None."""
        if self.last is None or (self.deadline is None and self.step_max_s is None):
            return None
        expect = self.last[1] * size / max(self.last[0], 1)
        if self.step_max_s is not None and expect > self.step_max_s:
            return (f"{busbw.human_bytes(size)} would take about {expect:.0f} s, longer than the "
                    f"{self.step_max_s:g} s a step may go without a heartbeat")
        left = None if self.deadline is None else self.deadline - time.time()
        if left is not None and expect > left:
            return (f"{busbw.human_bytes(size)} would take about {expect:.0f} s, with "
                    f"{max(left, 0):.0f} s left before the launch's deadline")
        return None


def sweep(c: Collectives, rank: Rank, op: str, sizes: list[int], warmup: int,
          iters: int, pace: Pace | None = None) -> list[dict[str, Any]]:
    """Time and verify `op` at each size; with `pace`, stop where it says (pace.stopped)."""
    rows: list[dict[str, Any]] = []
    corrupt = rank.should_corrupt(op)
    if pace is not None and pace.last is not None and sizes:  # the first size, from the last run
        first = pace.veto(sizes[0]) if c.me == 0 else None
        if _flag(float(first is not None), c.device, dist.ReduceOp.MAX):
            pace.stopped = first or "rank 0 expected the next size to run out of time"
            return rows
    for k, size in enumerate(sizes):
        count = busbw.elements_for(op, size, c.n)
        rank.beat(f"sweep {op} {count * 4}")
        t0 = time.perf_counter()
        seconds = c.timed(op, count, warmup, iters)
        wrong, _errors, _ = c.verify(op, k, count, corrupt)
        stop = None
        if pace is not None:
            pace.last = (count * 4, time.perf_counter() - t0)
            stop = pace.veto(sizes[k + 1]) if c.me == 0 and k + 1 < len(sizes) else None
        total = torch.tensor([seconds, float(wrong), float(stop is not None)], device=c.device,
                             dtype=torch.float64)
        dist.all_reduce(total)
        rows.append(busbw.complete_row(op, {
            "bytes": count * 4, "count": count, "time_us": total[0].item() / c.n * 1e6,
            "wrong": int(total[1].item())}, c.n))
        if pace is not None and total[2].item():
            # every rank records it; rank 0's text is the one reported
            pace.stopped = stop or "rank 0 expected the next size to run out of time"
            break
    return rows


def free_memory(c: Collectives, bound: int | None) -> int | None:
    """The least GPU memory free on any rank (bytes), after the checks' buffers went back to
    the driver, bounded by `bound` (the caller's --free-bytes); on CPU only that bound."""
    if c.device.type != "cuda":
        return bound
    torch.cuda.empty_cache()
    free = float(torch.cuda.mem_get_info(c.device)[0])
    least = torch.tensor([min(free, float(bound)) if bound else free], device=c.device,
                         dtype=torch.float64)  # float32 would round tens of GB by KiBs
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return int(least.item())


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
    p.add_argument("--floor-bytes", type=int, default=0,
                   help="all-reduce goes on past --max-bytes to this size (the floor's size)")
    p.add_argument("--free-bytes", type=int, default=0,
                   help="size the sweep as if at most this much memory were free per rank")
    p.add_argument("--deadline", type=float, default=0.0,
                   help="time.time() by which rank 0 wants the sweep done (0: none)")
    p.add_argument("--step-max-s", type=float, default=0.0,
                   help="longest a size may take between two heartbeats (0: no limit)")
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
        rank.beat("sweep sizing")
        free = free_memory(c, args.free_bytes or None)
        pace = Pace(args.deadline or None, args.step_max_s or None)
        curves: dict[str, list[dict[str, Any]]] = {}
        more: dict[str, list[int]] = {}
        cut: dict[str, str] = {}
        for op in ops:
            sizes, more[op] = busbw.op_sizes(op, args.min_bytes, args.max_bytes, args.factor,
                                             args.floor_bytes or None)
            sizes, why = busbw.memory_cut(op, sizes, free)
            curves[op] = sweep(c, rank, op, sizes, args.warmup, args.iters, pace)
            reason = why or pace.stopped
            if reason:
                cut[op] = reason
                pace.stopped = None
        # then all-reduce on to the floor's size, with the time the other ops left
        for op, sizes in more.items():
            if not sizes or op in cut:
                continue
            fitting, why = busbw.memory_cut(op, sizes, free)
            curves[op] += sweep(c, rank, op, fitting, args.warmup, args.iters, pace)
            reason = why or pace.stopped
            if reason:
                cut[op] = reason
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
                      fsdp_checked=fsdp, free_bytes=free, cut=cut,
                      asked_bytes={op: max([args.max_bytes, *more.get(op, [])]) for op in ops},
                      phase_s={"init": round(t1 - t0, 3),
                                                  "correctness": round(t2 - t1, 3),
                                                  "sweep": round(t3 - t2, 3)})
    return result


if __name__ == "__main__":
    sys.exit(run_rank(body))
