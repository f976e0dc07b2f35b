"""row-remap (GPU004) through the real NVML layer (checks/hw/nvml.py over pynvml over the fake C
library): nvmlDeviceGetRemappedRows' four answers (correctable rows, uncorrectable rows, pending,
failure occurred) give the verdicts of NVIDIA's memory error management guide, as
tests/framework/test_row_remap.py checks them on the fixture backend."""

from __future__ import annotations

from typing import Any

import pytest
import test_nvml_cli as nvml_cli
from fakenvml import FakeNvmlLibrary

quick_run = nvml_cli.quick_run  # the fixture, shared with the NVML CLI tests


@pytest.mark.parametrize("rows,status", [
    ((2, 0, 1, 0), "WARN"),   # pending for correctable errors only: reset at the next idle window
    ((0, 4, 1, 0), "FAIL"),   # pending with uncorrectable remaps: reset the GPU
    ((0, 9, 0, 1), "FAIL"),   # remapping failure: RMA
    ((5, 0, 0, 0), "PASS")])
def test_remapped_rows_from_nvml(quick_run: Any, rows: tuple[int, int, int, int],
                                 status: str) -> None:
    _code, verdicts, _ = quick_run(FakeNvmlLibrary([nvml_cli.h100(0), nvml_cli.h100(1, remapped_rows=rows)],
                                                   driver=nvml_cli.DRIVER))
    got = {pci: (s, m) for s, pci, m in verdicts["row-remap"]}
    assert got[nvml_cli.ADDRESSES[0]][0] == "PASS"
    assert got[nvml_cli.ADDRESSES[1]][0] == status, got
