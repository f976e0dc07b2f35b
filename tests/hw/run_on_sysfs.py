"""Run `python -m checks` on this machine with the PCI bus read from another sysfs tree.

    python tests/hw/run_on_sysfs.py SYS_PCI_DIR [python -m checks arguments...]

Everything else (NVML through whatever libnvidia-ml.so.1 the loader finds, /proc, torch) is
this machine's. Used by the real-library test to show an H100 on the bus of a host whose
kernel has no NVIDIA driver.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print("usage: run_on_sysfs.py SYS_PCI_DIR [checks arguments...]", file=sys.stderr)
        return 2
    root = Path(args[0])
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return 2
    from checks.hw.base import Backend
    from checks.hw.linux import LinuxBackend
    from checks.node import node_cli as cli

    scenario_backend = cli.make_backend

    def make_backend(simulate: str | None) -> Backend:
        return scenario_backend(simulate) if simulate else LinuxBackend(sys_pci=root)

    cli.make_backend = make_backend
    return cli.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
