"""Rails for per-rail cross-host runs: one compute NIC (RDMA device + its network interface) at a
time, so a slow or broken rail is named with its host instead of hiding in a run over all NICs.

A rail is written `NAME=HCA/IFNAME[@GPU]` on the command line (`rail1=mlx5_1/ens2@1`; the HCA
may be `-` on hosts without RDMA devices, where the rail is its interface alone):

    python -m checks.fleet.crosshost_plan --hosts a,b,c,d --mode pairs \\
        --rails rail0=mlx5_0/ens1,rail1=mlx5_1/ens2

Each rail's groups run pinned to that rail: NCCL_IB_HCA="=<hca>" (exact name: plain `mlx5_1`
would also select mlx5_10..mlx5_17), NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME = the interface,
and on GPU hosts one rank on the GPU nearest that NIC (CUDA_VISIBLE_DEVICES, PCI bus order), as
the rails of an HGX node pair GPU k with NIC k. gloo over GLOO_SOCKET_IFNAME is the CPU path of
the same code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

RAIL_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)=(?P<hca>[A-Za-z0-9_.-]+)/"
                       r"(?P<ifname>[A-Za-z0-9_.:-]+)(?:@(?P<gpu>\d+))?$")
NO_HCA = "-"


@dataclass(frozen=True)
class Rail:
    name: str
    hca: str | None  # RDMA device (mlx5_1); None on a host whose rail is a plain interface
    ifname: str  # the NIC's network interface (its netdev)
    gpu: int | None = None  # CUDA ordinal (PCI bus order) of the GPU that uses this rail

    @property
    def label(self) -> str:
        """'rail1 (mlx5_1/ens2)': how reports name the rail."""
        return f"{self.name} ({self.hca or NO_HCA}/{self.ifname})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hca": self.hca, "ifname": self.ifname, "gpu": self.gpu}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Rail:
        gpu = data.get("gpu")
        return cls(str(data["name"]), data.get("hca") or None, str(data["ifname"]),
                   None if gpu is None else int(gpu))


def parse_rails(text: str) -> list[Rail]:
    """'rail0=mlx5_0/ens1,rail1=mlx5_1/ens2@1' -> rails; ValueError naming the bad item."""
    rails: list[Rail] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        match = RAIL_SPEC.match(item)
        if match is None:
            raise ValueError(f"rail {item!r} is not NAME=HCA/IFNAME[@GPU] "
                             "(e.g. rail0=mlx5_0/ens1; HCA '-' for an interface without RDMA)")
        hca = match["hca"]
        rails.append(Rail(match["name"], None if hca == NO_HCA else hca, match["ifname"],
                          int(match["gpu"]) if match["gpu"] else None))
    if not rails:
        raise ValueError("no rail given")
    for attr in ("name", "ifname"):
        seen = [getattr(r, attr) for r in rails]
        dupes = sorted({v for v in seen if seen.count(v) > 1})
        if dupes:
            raise ValueError(f"rails repeat the {attr} {', '.join(dupes)}")
    hcas = [r.hca for r in rails if r.hca]
    if len(set(hcas)) != len(hcas):
        raise ValueError("rails repeat an HCA")
    return rails


def rail_env(rail: Rail, gpu: int | None) -> dict[str, str]:
    """Environment that pins NCCL (and gloo) to one rail."""
    env = {"NCCL_SOCKET_IFNAME": rail.ifname, "GLOO_SOCKET_IFNAME": rail.ifname}
    if rail.hca:
        env["NCCL_IB_HCA"] = f"={rail.hca}"
    if gpu is not None:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return env


def nearest_gpu(hw: Any, hca: str) -> int | None:
    """CUDA ordinal (PCI bus order) of the GPU nearest to an RDMA device by the PCI topology
    (same PCIe switch, else same NUMA node: the rails map of check rdma-rails); None when the
    device or no GPU is found; of equally near GPUs the lowest ordinal."""
    from checks.node.suite.fabric_links import AFFINITY_RANK, affinity

    gpus = sorted((d for d in hw.pci_devices() if d.is_nvidia_gpu), key=lambda d: d.address)
    nics = {d.name: d for d in hw.rdma_devices()}
    if hca not in nics or not gpus:
        return None
    ranked = sorted(range(len(gpus)),
                    key=lambda i: (AFFINITY_RANK[affinity(gpus[i], nics[hca])], i))
    return ranked[0]
