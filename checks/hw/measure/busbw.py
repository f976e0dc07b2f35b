"""Collective bandwidth arithmetic and the nccl-tests-style table (pure; no torch).

Conventions follow nccl-tests (doc/PERFORMANCE.md): `bytes` is the size of the whole buffer
(the output of all-gather, the input of reduce-scatter), algbw = bytes / time, and
busbw = algbw * factor, where the factor makes the figure comparable with the hardware's link
bandwidth whatever the number of ranks. GB/s means 1e9 bytes per second.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
# Every op the sweep can time: the check sweeps OPS; gpu-proof's peak sweep adds all-to-all.
SWEPT_OPS = (*OPS, "all_to_all")
REDOP = {"all_reduce": "sum", "reduce_scatter": "sum", "all_gather": "none", "broadcast": "none",
         "all_to_all": "none"}


def bus_factor(op: str, nranks: int) -> float:
    """all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n (nccl-tests
    doc/PERFORMANCE.md: each rank sends all but its own block); broadcast 1."""
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    if op == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (nranks - 1) / nranks
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes min, min*factor, ... up to max (inclusive), like nccl-tests -b/-e/-f."""
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep {min_bytes}..{max_bytes} x{factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def op_sizes(op: str, min_bytes: int, max_bytes: int, factor: int = 2,
             floor_bytes: int | None = None) -> tuple[list[int], list[int]]:
    """(the sweep's sizes for `op`, the sizes all-reduce goes on to past max_bytes).

    Only all-reduce has a floor published at a size (thresholds.allreduce_busbw_gbs at
    collective.floor_bytes): it alone goes on, by the same factor, to floor_bytes, which is
    swept itself even when it is not on the factor's grid."""
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    if op != "all_reduce" or not floor_bytes or floor_bytes <= max_bytes:
        return sizes, []
    more = [s for s in sweep_sizes(min_bytes, floor_bytes, factor) if s > max_bytes]
    if not more or more[-1] != floor_bytes:
        more.append(floor_bytes)
    return sizes, more


# Message-sized buffers one rank holds while it verifies one swept size
# (collective_rank.Collectives.verify): all-reduce keeps its input, the reduced output and the
# reference it is compared with, plus the comparison's mask (1 byte per 4-byte element); the
# other ops hold at most an output, a reference and an input block (all-to-all: input, output,
# reference blocks). The timed loop before it holds fewer (input and output at most).
VERIFY_BUFFERS = {"all_reduce": 3.25, "all_gather": 2.25, "reduce_scatter": 2.25,
                  "broadcast": 2.25, "all_to_all": 2.5}
# Beside those buffers: NCCL's own (its channels' buffers and NVLS registrations, some allocated
# at the first collective of a kind), the CUDA context where free memory is read before it
# exists, and the caching allocator's rounding. Judgement, not a published figure.
VERIFY_HEADROOM_BYTES = 2 << 30


def max_verified_bytes(free_bytes: int, op: str = "all_reduce") -> int:
    """The largest message (bytes, a multiple of 4) one rank can run `op` on and verify with
    `free_bytes` of GPU memory free: free memory (torch.cuda.mem_get_info, NVML v2 `free`), never
    the total. 0 when not even the headroom is free."""
    room = int(free_bytes) - VERIFY_HEADROOM_BYTES
    return max(0, int(room / VERIFY_BUFFERS[op]) // 4 * 4)


def human_bytes(size: float) -> str:
    """1073741824 -> '1 GiB', 268435456 -> '256 MiB', 8000000000 -> '7.45 GiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{int(size)} B"


def memory_cut(op: str, sizes: list[int], free_bytes: int | None) -> tuple[list[int], str | None]:
    """The sizes a verified `op` fits in with `free_bytes` free (the least any rank has), and
    why the others were left out (None when none was)."""
    if free_bytes is None:
        return list(sizes), None
    cap = max_verified_bytes(free_bytes, op)
    kept = [s for s in sizes if s <= cap]
    if len(kept) == len(sizes):
        return kept, None
    return kept, (f"{human_bytes(free_bytes)} of GPU memory free on the fullest GPU holds a "
                  f"verified {op} of at most {human_bytes(cap)} ({VERIFY_BUFFERS[op]:g} "
                  f"message-sized buffers + {human_bytes(VERIFY_HEADROOM_BYTES)}), not "
                  f"{human_bytes(max(sizes))}")


def elements_for(op: str, size_bytes: int, nranks: int, elem_bytes: int = 4) -> int:
    """Element count of the whole buffer: all-gather/reduce-scatter need a multiple of nranks."""
    count = max(1, size_bytes // elem_bytes)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(nranks, count // nranks * nranks)
    return count


def complete_row(op: str, row: Mapping[str, Any], nranks: int) -> dict[str, Any]:
    """Fill time_us/algbw_gbs/busbw_gbs from whichever of them a measurement gives."""
    out = dict(row)
    size = float(out["bytes"])
    factor = bus_factor(op, nranks)
    if out.get("time_us"):
        algbw = size / (float(out["time_us"]) * 1e-6) / 1e9
    elif out.get("algbw_gbs"):
        algbw = float(out["algbw_gbs"])
    elif out.get("busbw_gbs") and factor > 0:
        algbw = float(out["busbw_gbs"]) / factor
    else:
        raise ValueError(f"{op} row for {out['bytes']} B has no time_us, algbw_gbs or busbw_gbs")
    out.setdefault("time_us", size / (algbw * 1e9) * 1e6 if algbw > 0 else None)
    out["algbw_gbs"] = algbw
    out["busbw_gbs"] = algbw * factor
    out.setdefault("wrong", 0)
    return out


def peak_busbw(rows: Iterable[Mapping[str, Any]]) -> float:
    return max((float(r["busbw_gbs"]) for r in rows), default=0.0)


def format_table(op: str, rows: Iterable[Mapping[str, Any]], *, nranks: int, backend: str,
                 dtype: str = "float") -> str:
    """The table nccl-tests prints, one per operation."""
    rows = list(rows)
    lines = [
        f"# nodecert {op}: {nranks} ranks, {backend}, {dtype}; busbw factor "
        f"{bus_factor(op, nranks):.3f} (compare busbw with the link bandwidth)",
        "#",
        f"# {'size':>10} {'count':>12} {'type':>8} {'redop':>6} {'root':>5} {'time':>10} "
        f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"# {'(B)':>10} {'(elements)':>12} {'':>8} {'':>6} {'':>5} {'(us)':>10} "
        f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7}",
    ]
    root = 0 if op == "broadcast" else -1
    for r in rows:
        count = r.get("count", "")
        lines.append(f"  {r['bytes']:>10} {count:>12} {dtype:>8} {REDOP[op]:>6} {root:>5} "
                     f"{r['time_us']:>10.2f} {r['algbw_gbs']:>8.2f} {r['busbw_gbs']:>8.2f} "
                     f"{r.get('wrong', 0):>7}")
    avg = sum(float(r["busbw_gbs"]) for r in rows) / len(rows) if rows else 0.0
    lines += [f"# Out of bounds values : {sum(int(r.get('wrong', 0)) for r in rows)} "
              f"{'OK' if not any(r.get('wrong') for r in rows) else 'FAILED'}",
              f"# Avg bus bandwidth    : {avg:.3f}",
              f"# Peak bus bandwidth   : {peak_busbw(rows):.3f}"]
    return "\n".join(lines)
