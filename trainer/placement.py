"""Where the ranks run: how many per node, which device each takes, which backend joins them.

Pure functions of (what was asked, what torch sees), so the choice is tested on a CPU-only machine
with made-up device counts, and the supervisor, the rank program and the acceptance checks all
decide the same way.

- One GPU per rank when there are enough GPUs: NCCL.
- One visible GPU: one rank, the jobs that need more GPUs SKIP (plan_ranks: the trainer's
  supervisor; choose_nproc alone still shares the GPU between 2 ranks by default).
- More ranks than GPUs (only when asked for with `share`, or by choose_nproc's default on a
  one-GPU host): the ranks share the GPUs and talk over gloo, which moves CUDA tensors for
  broadcast, all-reduce and all-gather but not for send/recv (torch's backend table), so the
  pipelined jobs cannot run there.
- The CPU (`--device cpu`, or no GPU): gloo, CPU_RANKS ranks unless told otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CPU_RANKS = 4  # hybrid needs 2 stages x 2 replicas; every job spans the whole world
# Ranks sharing the GPU of a one-GPU host: two exercise DDP, SyncBN and localize on CUDA; more
# would not let hybrid run (it needs send/recv, which gloo cannot do on CUDA tensors).
SHARED_RANKS = 2
# CUDA_VISIBLE_DEVICES values that hide every GPU: Slurm sets NoDevFiles for a job step given no
# GPU (Kaldi's utils/parallel/slurm.pl unsets it for that reason), "" and -1 are the usual ways
# to hide all devices. An index past the GPU count hides everything from that entry on
# (thuml/Autoformer#25: CUDA_VISIBLE_DEVICES=1 on a one-GPU host, torch trained on the CPU).
HIDING_VALUES = ("", "-1", "NoDevFiles")


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda:N"
    backend: str  # "nccl" | "gloo"
    shared: bool = False  # several ranks on one GPU (gloo on CUDA tensors)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def p2p(self) -> bool:
        """Can the backend send/recv tensors on this device? (gloo: CPU tensors only)"""
        return self.backend == "nccl" or not self.is_cuda

    def describe(self) -> str:
        if self.shared:
            return f"{self.device} shared with other ranks over gloo"
        return f"{self.device} over {self.backend}"


def place(preference: str, local_rank: int, local_world: int, cuda_count: int) -> Placement:
    """The device and backend of one rank. `cuda_count`: devices torch sees on this node."""
    if preference == "cpu" or (preference == "auto" and cuda_count == 0):
        return Placement("cpu", "gloo")
    if cuda_count == 0:
        raise ValueError("--device cuda: torch sees no CUDA device")
    if local_world <= cuda_count:
        return Placement(f"cuda:{local_rank}", "nccl")
    # NCCL refuses two ranks on one device ("Duplicate GPU detected"): share over gloo.
    return Placement(f"cuda:{local_rank % cuda_count}", "gloo", shared=True)


def choose_nproc(requested: int | None, preference: str, cuda_count: int,
                 share: bool = False, exclusive: bool = False) -> tuple[int, bool]:
    """(ranks per node, ranks share GPUs). Raises ValueError with a one-line reason for a rank
    count the node cannot give: more ranks than GPUs without `share` (or with it, on GPUs in
    compute mode EXCLUSIVE_PROCESS: `exclusive`, which admit one process each), or CUDA asked of
    a node whose torch sees none. A one-GPU host runs one rank when its GPU is exclusive."""
    if requested is not None and requested < 1:
        raise ValueError(f"--nproc must be >= 1, not {requested}")
    if preference == "cpu" or (preference == "auto" and cuda_count == 0):
        return requested or CPU_RANKS, False
    if cuda_count == 0:
        raise ValueError("--device cuda: torch sees no CUDA device")
    if requested is None:
        if cuda_count >= 2 or exclusive:
            return cuda_count, False
        return SHARED_RANKS, True  # a one-GPU host still exercises the CUDA paths
    if requested > cuda_count and not share:
        raise ValueError(f"--nproc {requested} is more than the {cuda_count} GPU(s) torch sees: "
                         f"use --nproc {cuda_count} or fewer, --share-gpu (ranks share GPUs over "
                         "gloo) or --device cpu")
    if requested > cuda_count and exclusive:
        raise ValueError(f"--nproc {requested} is more than the {cuda_count} GPU(s) torch sees, "
                         "and ranks cannot share a GPU in compute mode EXCLUSIVE_PROCESS (one "
                         f"process per GPU): use --nproc {cuda_count} or fewer, or --device cpu")
    return requested, requested > cuda_count


@dataclass(frozen=True)
class RankPlan:
    """What a supervised launch runs: `nproc` ranks per node (sharing GPUs when `shared`), and the
    jobs decided without launching, with their SKIP reasons."""
    nproc: int
    shared: bool
    skips: dict[str, str]


# GPUs a job needs on a CUDA host (2 unless listed): `single` trains every GPU of its rank in turn
# and `throughput` measures whatever world it gets; `hybrid` is 2 pipeline stages x 2 replicas;
# `dp` is DataParallel over 2 or more GPUs inside one process. Every other job compares, shards
# or splits across ranks, one per GPU. Kept here, with the placement it decides, and not in
# trainer.jobs, whose modules import the rank side (trainer.distenv), which imports this module.
MIN_GPUS = {"single": 1, "throughput": 1, "hybrid": 4}


def min_gpus(name: str) -> int:
    return MIN_GPUS.get(name, 2)


def one_gpu_reason(job: str) -> str:
    return f"needs {min_gpus(job)} GPUs, this host has 1"


def plan_ranks(jobs: list[str], requested: int | None, preference: str, cuda_count: int, *,
               share: bool = False, exclusive: bool = False, nnodes: int = 1) -> RankPlan:
    """The supervisor's decision (`python -m trainer`, trainer.launcher.run_jobs without nproc).

    A CUDA host with one visible GPU (a one-GPU machine, a MIG slice, CUDA_VISIBLE_DEVICES
    naming one GPU) runs one rank on it; every job that needs more GPUs (min_gpus)
    is SKIP "needs 2 GPUs, this host has 1" without a launch. Two ranks sharing the GPU over gloo
    would pass DDP, FSDP or a checkpoint and prove nothing about the node; `--nproc 2
    --share-gpu` still asks for that on purpose. In a multi-node launch a one-GPU node is one
    rank of the world and nothing is skipped. Otherwise choose_nproc (ValueError for a count the
    node cannot give); the CPU keeps its CPU_RANKS ranks over gloo."""
    on_cpu = preference == "cpu" or (preference == "auto" and cuda_count == 0)
    if not on_cpu and cuda_count == 1 and requested in (None, 1):
        if nnodes > 1:
            return RankPlan(1, False, {})
        return RankPlan(1, False, {j: one_gpu_reason(j) for j in jobs if min_gpus(j) > 1})
    nproc, shared = choose_nproc(requested, preference, cuda_count, share, exclusive)
    return RankPlan(nproc, shared, {})


def hides_every_gpu(cuda_visible_devices: str | None, bus_gpus: int | None = None) -> bool:
    """True when CUDA_VISIBLE_DEVICES leaves torch no device: NoDevFiles, empty, -1, or a first
    entry CUDA cannot use (CUDA ignores everything from the first invalid entry on), such as an
    index >= `bus_gpus`."""
    if cuda_visible_devices is None:
        return False
    value = cuda_visible_devices.strip()
    if value in HIDING_VALUES:
        return True
    first = value.split(",")[0].strip()
    if first.isdigit():
        return bus_gpus is not None and int(first) >= bus_gpus
    return not first.startswith(("GPU-", "MIG-"))


def why_torch_cannot_use_gpus(info: Any, environ: Mapping[str, str],
                              bus_gpus: int | None = None) -> str:
    """Why torch sees no GPU on a host that has some on the PCI bus (`info`: a TorchInfo)."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if getattr(info, "error", None):
        return f"torch cannot use CUDA: {info.error}"
    if getattr(info, "cuda", None) is None:
        return f"torch {info.version} is a CPU-only build"
    if hides_every_gpu(cvd, bus_gpus):
        return f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU"
    return (f"torch.cuda.is_available() is False (torch {info.version}, CUDA {info.cuda}"
            + (f", CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else "") + ")")
