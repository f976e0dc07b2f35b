"""The JSON report schema is enforced: real reports validate, broken ones do not."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from checks.report_schema import SCHEMA_VERSION, recorded_environment, schema


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())


def test_real_host_report_validates(run_cli) -> None:
    code, report, _ = run_cli("--level", "quick")
    jsonschema.validate(report, schema())
    assert report["backend"] == "linux" and report["schema_version"] == SCHEMA_VERSION
    assert code == report["exit_code"]


@pytest.mark.parametrize("mutate", [
    lambda r: r.pop("checks"),
    lambda r: r["checks"][0].update(status="OK"),
    lambda r: r["checks"][0].update(id="Bad Id"),
    lambda r: r["checks"][0]["results"].clear(),
    lambda r: r.update(verdict="MAYBE"),
])
def test_broken_reports_are_rejected(run_cli, mutate) -> None:  # type: ignore[no-untyped-def]
    _, report, _ = run_cli("--simulate", "fault-pcie-x8", "--level", "quick")
    broken = copy.deepcopy(report)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema())


def test_nccl_environment_is_recorded() -> None:
    env = recorded_environment({"NCCL_DEBUG": "INFO", "HOME": "/root", "GLOO_SOCKET_IFNAME": "lo"})
    assert env == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO"}
