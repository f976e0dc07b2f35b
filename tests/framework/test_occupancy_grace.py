"""gpu-occupied on a Grace platform: GPU memory in use with no compute process WARNs (the OS can
keep memory a process freed mapped when it manages GPU memory as a NUMA node, without CDMM);
the same memory on an x86 HGX node FAILs; a foreign process FAILs on both."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from checks.hw.scenario_file import load_scenario
from checks.node import node_cli as cli

HELD = 60 << 30  # 60 GiB: above the 5 % fail fraction of either GPU


def _occupied(tmp_path: Path, base: str, **gpu: object) -> list[dict]:
    path = tmp_path / f"{base}-held.yaml"
    path.write_text(yaml.safe_dump({"description": "test: memory held before the jobs",
                                    "extends": str(load_scenario(base)["_path"]),
                                    "gpu_overrides": {0: dict(gpu)}}))
    out = tmp_path / "report.json"
    cli.main(["--simulate", str(path), "--only", "gpu-occupied", "--json", str(out), "--quiet"])
    (check,) = json.loads(out.read_text())["checks"]
    return check["results"]


def test_memory_without_a_process_warns_on_gb200_and_fails_on_hgx_h100(tmp_path: Path) -> None:
    grace = _occupied(tmp_path, "blackwell-gb200-tray-healthy", memory_used_bytes=HELD,
                      compute_processes=[])
    assert grace[0]["status"] == "WARN", grace[0]
    assert "OS can keep memory a process freed mapped" in grace[0]["message"]
    assert "numastat -m" in grace[0]["remedy"]
    hgx = _occupied(tmp_path, "h100-sxm-8x-healthy", memory_used_bytes=HELD, compute_processes=[])
    assert hgx[0]["status"] == "FAIL" and "numastat" not in hgx[0]["remedy"], hgx[0]


def test_a_foreign_process_still_fails_on_gb200(tmp_path: Path) -> None:
    grace = _occupied(tmp_path, "blackwell-gb200-tray-healthy", memory_used_bytes=HELD,
                      compute_processes=[{"pid": 4242, "name": "python3",
                                          "used_memory_bytes": HELD}])
    assert grace[0]["status"] == "FAIL", grace[0]
