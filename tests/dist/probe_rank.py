"""A minimal rank program for the launcher tests: N all-reduces over gloo with heartbeats."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from checks.supervise.rank import Rank, run_rank


def body(rank: Rank) -> dict:
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    try:
        for i in range(iters):
            rank.beat(f"all_reduce iter {i}")
            t = torch.full((4,), float(rank.rank + 1))
            dist.all_reduce(t)
        return {"sum": t[0].item()}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(run_rank(body))
