"""The node side of the cross-host stage reads what its rank processes and the launcher hand
back (heartbeats, results, the log tail): bounded and typed like a report, so a rank that wrote
nonsense, or a huge or hostile text, costs one field, never the stage or the node's report. No
torch process is started: the readers are fed directly, the CLI refuses before launching."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from checks.node import crosshost_node as node


@pytest.mark.parametrize("ranks", [None, [], "x", 7, {"0": "crashed"}, {"0": None}, {"0": [1, 2]}])
def test_ranks_that_are_not_mappings_are_recorded_not_a_crash(ranks: Any) -> None:
    view = node._rank_view(ranks)
    json.dumps(view, allow_nan=False)
    if isinstance(ranks, dict):
        assert view == {"0": {"state": "unreadable", "phase": None, "error": None, "host": None,
                              "seq": None, "exitcode": None}}
    else:
        assert view == {}


def test_rank_fields_are_typed_bounded_and_printable() -> None:
    ranks = {0: {"state": "done", "phase": "allreduce", "seq": 12, "exitcode": 0, "host": "a"},
             1: {"state": "x" * 1_000_000, "phase": {"nested": [1]}, "seq": "12", "exitcode": True,
                 "error": "boom\x1b[2J\u202eevil\x00", "host": 3},
             2: {"seq": 10**30, "exitcode": float("nan"), "extra": "dropped"}}
    view = node._rank_view(ranks)
    assert view["0"] == {"state": "done", "phase": "allreduce", "error": None, "host": "a",
                         "seq": 12, "exitcode": 0}
    one = view["1"]
    assert len(one["state"]) == node.MAX_TEXT and one["phase"] is None and one["host"] is None
    assert one["seq"] is None and one["exitcode"] is None  # a string and a bool are no counters
    assert "\x1b" not in one["error"] and "\u202e" not in one["error"] and "\x00" not in one["error"]
    assert "\\x1b" in one["error"] and "\\u202e" in one["error"]
    assert view["2"]["seq"] is None and view["2"]["exitcode"] is None and "extra" not in view["2"]
    json.dumps(view, allow_nan=False)


def test_many_ranks_are_cut_to_the_bound() -> None:
    ranks = {str(r): {"state": "done"} for r in range(200_000)}
    t0 = time.monotonic()
    view = node._rank_view(ranks)
    assert len(view) == node.MAX_RANKS and time.monotonic() - t0 < 5


def test_the_log_tail_is_bounded_and_typed() -> None:
    endpoint = "10.0.0.1:29400"
    needle = "failed to connect to any network address of (10.0.0.1, 29400)"
    assert node.rendezvous_view("x" * 50_000_000 + needle, endpoint) == "unreachable"
    assert node.rendezvous_view(needle + "x" * node.MAX_LOG_TAIL, endpoint) == "reached"  # too far back
    assert node.rendezvous_view(None, endpoint) == "reached"  # type: ignore[arg-type]


def test_ddp_stage_reads_the_launcher_typed(monkeypatch) -> None:
    job = SimpleNamespace(status="PASS", message="ok", figures={"tokens_per_s": 1.5e5, "bad": "fast",
                                                                 "nan": float("nan"), 7: 1.0},
                          details={"phases": {0: "done", 1: {"x": 1}, 2: "step\x07"}})
    import trainer.launcher

    monkeypatch.setattr(trainer.launcher, "run_ddp_multinode", lambda *a, **k: job)
    args = SimpleNamespace(rdzv_endpoint="10.0.0.1:29400", nnodes=2, node_rank=0, rdzv_id="r",
                           local_addr=None, timeout=10.0, stall=5.0, join_timeout=5.0, ifname=None,
                           rail=None)
    result = node.ddp_stage(args, on_gpu=False, nproc=1)
    assert result.details["figures"] == {"xhost_tokens_per_s": 1.5e5}
    assert result.details["ranks"] == {"0": {"phase": "done"}, "1": {"phase": None},
                                       "2": {"phase": "step\\x07"}}
    json.dumps(result.details, allow_nan=False)


@pytest.mark.parametrize("target", ["/dev/null", ""])
def test_the_node_report_is_written_only_to_a_regular_file(target, capsys) -> None:
    code = node.main(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "10.0.0.1:29400",
                      "--rdzv-id", "r", "--json", target])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
