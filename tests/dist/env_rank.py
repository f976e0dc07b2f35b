"""A rank program for the forkrun tests: reports what a rank of one host sees."""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "TORCHELASTIC_USE_AGENT_STORE")

if __name__ == "__main__":
    dist.init_process_group("gloo")
    seen = {k: os.environ.get(k) for k in KEYS}
    seen["comm"] = Path("/proc/self/comm").read_text().strip()
    seen["preloaded"] = "json" in sys.modules and "tests_preload_marker" in sys.modules
    seen["ppid"] = os.getppid()
    out = dist.get_rank()
    dist.barrier()
    dist.destroy_process_group()
    Path(sys.argv[1], f"rank-{out}.json").write_text(json.dumps(seen))
    sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 and out == 1 else 0)
