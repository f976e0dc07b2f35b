"""Path class of a GPU pair, from what the hardware layer reports (pure; tested on fixtures).

A copy GPU i -> GPU j takes one of four kinds of path, and healthy bandwidths differ by class,
so the P2P straggler rule compares a pair only with pairs of its own class:

- `nvlink`: both GPUs have active NVLinks and the system has NVSwitches (on the PCI bus, named
  by the model's profile, or NVML's remote device type of both GPUs' links says "switch": on HGX
  B200/B300 and GB200 trays the switches are not on the host's PCI bus), or a link of one GPU
  names the other as its remote end (an NVLink bridge pair: NVML's remote PCI info); or, whatever
  the links say, the driver answers NVLink peer-to-peer for the pair (nvmlDeviceGetP2PStatus with
  NVML_P2P_CAPS_INDEX_NVLINK), or both GPUs completed registration in the same NVLink fabric
  clique (nvmlDeviceGetGpuFabricInfo: state completed, status success, same cluster UUID and
  clique id). The last two name what the pair should be even with every link down, so a pair
  that fell back to PCIe is judged against its NVLink floor;
- `pcie-switch`: their PCI paths share a bridge below the root port (one PCIe switch; nvidia-smi
  topo prints PIX/PXB);
- `same-socket`: same NUMA node, different switches or root ports (NODE/PHB);
- `cross-socket`: different NUMA nodes: the copy crosses the CPUs' interconnect (SYS).

`unclassified` when the hardware layer says too little (no PCI path and no NUMA node).
"""

from __future__ import annotations

from dataclasses import dataclass

NVLINK, SWITCH, SOCKET, CROSS, UNKNOWN = (
    "nvlink", "pcie-switch", "same-socket", "cross-socket", "unclassified")
CLASSES = (NVLINK, SWITCH, SOCKET, CROSS, UNKNOWN)


@dataclass(frozen=True)
class GpuPlace:
    """Where one GPU sits: what the class of its pairs is derived from."""

    pci: str | None
    pci_path: tuple[str, ...] = ()  # bridges from the root port down (PciDevice.pci_path)
    numa_node: int | None = None  # None: not read; -1: sysfs says no NUMA affinity
    nvlinks_active: int = 0
    # Remote PCI address of each active link, when the hardware layer gives it ("remote_pci").
    nvlink_remotes: tuple[str, ...] = ()
    # An active link whose remote device type is an NVSwitch (NVML_NVLINK_DEVICE_TYPE_SWITCH).
    nvlink_to_switch: bool = False
    # Bus ids the driver answers NVLink peer-to-peer for (the "nvlink_p2p_peers" GPU field).
    nvlink_p2p: tuple[str, ...] = ()
    # "cluster-uuid/clique-id" of a completed, successful fabric registration, else None.
    fabric_clique: str | None = None

    def links_to(self, other: GpuPlace) -> int:
        return sum(1 for r in self.nvlink_remotes if other.pci and r == other.pci.lower())


def shares_switch(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """True when the two paths have a common bridge below the root port (path[0])."""
    common = 0
    for x, y in zip(a, b, strict=False):
        if x.lower() != y.lower():
            break
        common += 1
    return common >= 2


def _nvlink_peers(a: GpuPlace, b: GpuPlace) -> bool:
    """The driver's own word that the two GPUs are NVLink peers."""
    if a.fabric_clique is not None and a.fabric_clique == b.fabric_clique:
        return True
    return bool((b.pci and b.pci.lower() in a.nvlink_p2p)
                or (a.pci and a.pci.lower() in b.nvlink_p2p))


def pair_class(a: GpuPlace, b: GpuPlace, *, nvswitch: bool) -> str:
    if _nvlink_peers(a, b):
        return NVLINK
    if a.nvlinks_active and b.nvlinks_active:
        if nvswitch or (a.nvlink_to_switch and b.nvlink_to_switch):
            return NVLINK
        if a.links_to(b) or b.links_to(a):
            return NVLINK
    if a.pci_path and b.pci_path and shares_switch(a.pci_path, b.pci_path):
        return SWITCH
    if a.numa_node is None or b.numa_node is None:
        return UNKNOWN
    # -1 on both: the kernel reports no NUMA affinity (one memory node): one socket.
    return SOCKET if a.numa_node == b.numa_node else CROSS


def nvlinks_between(a: GpuPlace, b: GpuPlace, *, nvswitch: bool) -> int:
    """How many NVLinks carry a copy between two NVLink-class GPUs: through switches (on the
    bus, by the profile, by the links' remote type, or one fabric clique) every active link of
    the narrower GPU; directly, the links that name the peer (NVML's remote PCI info). A direct
    pair known only from the driver's P2P status: the GPU's active links shared evenly among
    its NVLink peers (an H100 NVL bridge pair: all 12 to the one peer; HGX H100 4-GPU: 18 links,
    6 to each of 3 peers). 0 when nothing says."""
    through_switch = nvswitch or (a.nvlink_to_switch and b.nvlink_to_switch) or (
        a.fabric_clique is not None and a.fabric_clique == b.fabric_clique)
    if through_switch:
        return min(a.nvlinks_active, b.nvlinks_active)
    direct = max(a.links_to(b), b.links_to(a))
    if direct:
        return direct
    shares = [g.nvlinks_active // len(g.nvlink_p2p) for g in (a, b)
              if g.nvlink_p2p and g.nvlinks_active]
    return min(shares, default=0)


def classify(places: list[GpuPlace], *, nvswitch: bool) -> dict[tuple[int, int], str]:
    """Class of every ordered pair (i, j), i != j, of `places` (indices into the list)."""
    n = len(places)
    return {(i, j): pair_class(places[i], places[j], nvswitch=nvswitch)
            for i in range(n) for j in range(n) if i != j}
