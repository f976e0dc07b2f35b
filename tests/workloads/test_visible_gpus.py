"""Which GPUs a launch uses: CUDA_VISIBLE_DEVICES as NVML indices, GPU- and MIG- UUIDs, or
values that hide every GPU, resolved once (workload_plan.launch_gpus / visible_gpus) and used
by the compute-mode planning, so a GPU the variable hides neither blocks nor counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checks.hw.fixture import FixtureBackend
from checks.hw.scenario_file import load_scenario
from checks.node import workload_plan as plan

UUID = "GPU-6f1b0d6a-0000-4000-8000-00000000000"  # h100-sxm-8x-healthy's GPU N: UUID + "N"
MIG = "MIG-feee0c61-26ec-5616-bb59-b6d777cc4f34"  # node-cvd-mig-uuid's instance (pytorch#95784)


def _nvml(name: str, env: dict[str, str] | None = None,
          overrides: dict[int, dict[str, Any]] | None = None) -> Any:
    scenario = load_scenario(name)
    if overrides:
        scenario["gpus"] = [{**g, **overrides.get(i, {})} for i, g in enumerate(scenario["gpus"])]
    return FixtureBackend(scenario).nvml()


@pytest.mark.parametrize(("cvd", "expected"), [
    (None, (0, 1, 2, 3, 4, 5, 6, 7)),
    ("3,5", (3, 5)),
    ("5,3", (5, 3)),  # CUDA's order is the variable's
    (f"{UUID}6,{UUID}1", (6, 1)),
    (f"{UUID[:12]}", (0,)),  # a UUID prefix, as CUDA takes it
    ("2,GPU-ffffffff,4", (2,)),  # CUDA stops at the first entry it cannot resolve
    ("", ()), ("-1", ()), ("NoDevFiles", ()),
])
def test_launch_gpus_resolves_indices_and_uuids(cvd: str | None, expected: tuple[int, ...]
                                                ) -> None:
    nvml = _nvml("h100-sxm-8x-healthy")
    assert plan.launch_gpus(nvml, cvd) == expected
    assert len(plan.launch_gpus(nvml, cvd)) == len(expected)  # the rank count


def test_a_mig_instance_is_one_gpu_named_by_its_parent() -> None:
    nvml = _nvml("h100-sxm-8x-healthy", overrides={3: {"mig_mode": True, "mig_instances": [MIG]}})
    assert plan.launch_gpus(nvml, MIG) == (3,)
    # an instance NVML cannot place still counts once
    assert plan.launch_gpus(_nvml("h100-sxm-8x-healthy"), MIG) == (-1,)


def test_a_lost_gpu_is_not_launched_on() -> None:
    nvml = _nvml("h100-sxm-8x-healthy", overrides={1: {"lost": True}})
    assert plan.launch_gpus(nvml, None) == (0, 2, 3, 4, 5, 6, 7)


def test_prohibited_gpu_hidden_by_uuid_does_not_block_the_collective(run_cli: Any,
                                                                     tmp_path: Path) -> None:
    """GPU 2 is PROHIBITED; CUDA_VISIBLE_DEVICES names GPUs 3 and 4 by UUID. The planning read
    every NVML GPU and SKIPped the all-reduce for a GPU the launch never touches."""
    scenario = tmp_path / "cvd-uuid.yaml"
    scenario.write_text("extends: workload-compute-prohibited\n"
                        f"host:\n  env: {{CUDA_VISIBLE_DEVICES: '{UUID}3,{UUID}4'}}\n")
    _, report = run_cli("--simulate", str(scenario), "--only", "nccl-allreduce")
    (check,) = [c for c in report["checks"] if c["id"] == "nccl-allreduce"]
    assert check["status"] == "PASS", check["results"][0]["message"]


def test_prohibited_gpu_selected_by_uuid_still_blocks(run_cli: Any, tmp_path: Path) -> None:
    scenario = tmp_path / "cvd-uuid.yaml"
    scenario.write_text("extends: workload-compute-prohibited\n"
                        f"host:\n  env: {{CUDA_VISIBLE_DEVICES: '{UUID}2,{UUID}4'}}\n")
    _, report = run_cli("--simulate", str(scenario), "--only", "nccl-allreduce")
    (check,) = [c for c in report["checks"] if c["id"] == "nccl-allreduce"]
    assert check["status"] == "SKIP" and "PROHIBITED on GPU2" in check["results"][0]["message"]
