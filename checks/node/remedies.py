"""What to do about a fault that several checks see, written once: a lost GPU is named by
gpu-count (NVML answers GPU_IS_LOST, or the GPU is on the bus and not in NVML), by every per-GPU
check that could not measure it, and by xid-events (XID 79); all of them give this remedy.

NVIDIA's XID catalog gives XID 79 (GPU has fallen off the bus) the immediate action RESTART_BM:
a GPU that left the PCIe bus cannot be reset from the driver, the node must reboot."""

from __future__ import annotations

GPU_LOST = ("the GPU left the PCIe bus (NVML answers GPU_IS_LOST, XID 79): drain and reboot the "
            "node (a GPU reset cannot reach a GPU that is off the bus), check the pcie-aer result "
            "for its slot, then re-verify; if it recurs, reseat or RMA it (quote its serial)")
