"""GPU measurements run in a child process (the supervisor keeps no CUDA context): the real
child machinery, exercised on the CPU: results come back, failures are one-line errors, a
child past its deadline is killed."""

from __future__ import annotations

import io
import json
import time

import pytest

from checks.hw.base import HardwareError, NotSupported
from checks.hw.measure import isolate, isolate_child

pytestmark = pytest.mark.slow


def test_result_comes_back_from_the_child() -> None:
    rows = isolate.run_child("matmul", {"device": "cpu", "dtypes": ["fp32"], "n": 64,
                                        "min_time_s": 0.01}, timeout_s=120)
    (row,) = rows
    assert row["device"] == "cpu" and row["tflops"]["fp32"] > 0


def test_a_failing_measurement_is_a_one_line_hardware_error() -> None:
    with pytest.raises(HardwareError) as info:
        isolate.run_child("membw", {"device": "cpu", "nbytes": 1024, "no_such_option": 1},
                          timeout_s=120)
    assert "TypeError" in str(info.value) and "no_such_option" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_child_past_its_deadline_is_killed() -> None:
    t0 = time.monotonic()
    with pytest.raises(HardwareError, match=r"did not finish within 6 s; its process group "
                                            r"was killed"):
        isolate.run_child("burn_in", {"device": "cpu", "duration_s": 120, "n": 32,
                                      "dtype": "fp32"}, timeout_s=6)
    assert time.monotonic() - t0 < 30


def test_unknown_measurement_and_bad_input_in_the_child(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
    assert isolate_child.main(["no_such_workload", "-"]) == 1
    assert json.loads(capsys.readouterr().out) == {
        "error": "unknown workload 'no_such_workload'", "kind": "not_supported"}
    monkeypatch.setattr("sys.stdin", io.StringIO("[1, 2]"))
    assert isolate_child.main(["matmul", "-"]) == 1
    assert "parameters must be a JSON object" in capsys.readouterr().out
    assert isolate_child.main(["matmul"]) == 2
    assert "usage:" in capsys.readouterr().err


def test_not_supported_in_the_child_stays_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotSupported, match="unknown workload"):
        isolate.run_child("no_such_workload", {}, timeout_s=120)
