"""--budget: the checks and sizes that fit, most valuable first, what was left out, and the plan
in the report; the Slurm health check passes its budget on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from checks.fleet import slurm
from checks.node import budget, registry
from checks.node import node_cli as cli

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "checks/schema/report.schema.json").read_text())
QUICK = [c.id for c in registry.select("quick")]
ALL = [c.id for c in registry.select("burn-in")]


def test_the_table_covers_every_registered_check_with_sane_numbers() -> None:
    table = budget.table()
    assert set(ALL) <= set(table), set(ALL) - set(table)
    for check_id, e in table.items():
        if check_id.startswith(budget.SHARED):
            assert e.cost.cpu > 0 and e.cost.gpu > 0
            continue
        assert 1 <= e.value <= 10, check_id
        assert e.cost.cpu > 0 and e.cost.gpu > 0, check_id


def test_a_large_budget_runs_everything_and_the_burn_in_takes_the_rest() -> None:
    plan = budget.make(ALL, 3600, gpus=8, duration_s=600)
    assert plan.left_out == [] and plan.ids == set(ALL)
    assert plan.duration_s == 600  # capped by --duration
    assert [c.id for c in plan.chosen] == ALL  # run order kept
    assert plan.estimated_s <= 3600


def test_a_tight_budget_keeps_the_most_valuable_checks_and_says_what_it_left_out() -> None:
    plan = budget.make(ALL, 160, gpus=8, duration_s=600)
    assert set(QUICK) <= plan.ids  # every quick check is cheap and worth more than any workload
    assert plan.estimated_s <= 160
    left = {x["id"]: x for x in plan.left_out}
    assert "burn-in" in left and "dataloader-scaling" in left
    assert left["dataloader-scaling"]["reason"].startswith("needs ~25 s")
    assert set(left) | plan.ids == set(ALL) and not set(left) & plan.ids
    # Nothing left out would have fitted in what the plan did not use.
    unused = 160 - plan.estimated_s
    assert all(x["cost_s"] > unused for x in plan.left_out)


def test_value_decides_before_cost() -> None:
    entries = {"a": budget.Budget(9, budget.Cost(50, 50), "t"),
               "b": budget.Budget(2, budget.Cost(10, 10), "t"),
               "c": budget.Budget(5, budget.Cost(45, 45), "t")}
    plan = budget.make(["a", "b", "c"], 60, gpus=0, duration_s=600, entries=entries)
    assert [c.id for c in plan.chosen] == ["a", "b"]  # a first; c (45 s) no longer fits; b does
    assert [x["id"] for x in plan.left_out] == ["c"]


def test_a_shared_launch_is_paid_once() -> None:
    launch = budget.table()[budget.SHARED + "acceptance"].cost.on(0)
    plan = budget.make(["train-ddp", "train-pipeline", "train-syncbn"], launch + 5, gpus=0,
                       duration_s=600)
    assert [c.cost_s for c in plan.chosen] == [launch + 1, 1, 1]
    alone = budget.make(["train-pipeline"], launch - 5, gpus=0, duration_s=600)
    assert alone.left_out[0]["reason"].startswith(f"needs ~{launch + 1:.0f} s")


def test_a_smaller_size_is_chosen_when_the_full_one_does_not_fit() -> None:
    plan = budget.make(["gpu-matmul"], 30, gpus=8, duration_s=600)
    [choice] = plan.chosen
    assert (choice.size, choice.cost_s) == ("smaller", 12 + 2 * 8)
    assert plan.profile_overrides == {"compute": {"matmul_dtypes_gpu": ["bf16"]}}


def test_the_burn_in_is_sized_to_what_is_left() -> None:
    plan = budget.make(["ecc-errors", "burn-in"], 200, gpus=8, duration_s=600)
    assert plan.duration_s == 200 - 1 - 20  # the budget less the other check and start-up
    assert [c.size for c in plan.chosen] == ["full", "179 s"]
    assert budget.make(["burn-in"], 50, gpus=8, duration_s=600).left_out[0]["id"] == "burn-in"


def test_the_table_is_the_declarations() -> None:
    """Each check's entry is the Budget its @check declares; the acceptance launch is declared
    once with the checks that share it."""
    table = budget.table()
    assert all(table[c.id] is c.budget for c in registry.select("burn-in"))
    assert table["gpu-matmul"].smaller_profile == {"compute": {"matmul_dtypes_gpu": ["bf16"]}}
    assert {table[f"train-{j}"].shared for j in ("ddp", "single", "throughput")} == {"acceptance"}
    assert table[budget.SHARED + "acceptance"].cost == budget.Cost(cpu=20, gpu=90, per_gpu=2)


def _never(_: object) -> None:
    return None


@pytest.mark.parametrize(("declared", "message"), [
    (None, r"test_budget\.py:\d+: @check\('zz-budget'\) has no budget; add budget=Budget\(value=1-10, "
           r"cost=Cost\(cpu=1, gpu=1\), source=\"estimated\"\) to it"),
    (budget.Budget(11, budget.Cost(1, 1), "estimated"), r"budget value 11 is not 1-10"),
    (budget.Budget(5, budget.Cost(0, 1), "estimated"), r"cpu and gpu seconds > 0"),
    (budget.Budget(5, budget.Cost(1, 1), "guessed"), r"source 'guessed' is not one of"),
    (budget.Budget(5, budget.Cost(1, 1), "estimated", shared="nope"),
     r"shares the launch 'nope', which no shared_launch\(\) declares"),
], ids=["missing", "value", "cost", "source", "shared"])
def test_a_check_without_a_sound_budget_is_refused_where_it_is_declared(declared, message) -> None:
    with pytest.raises(ValueError, match=message):
        registry.check("zz-budget", code="ZZ901", title="t", budget=declared)(_never)
    assert "zz-budget" not in registry.REGISTRY


def test_a_cost_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError):
        budget.Cost("a", 1)  # type: ignore[arg-type]


# --- through python -m checks ------------------------------------------------------------------

def test_the_report_records_the_plan(run_cli) -> None:
    _code, doc, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--budget", "3m")
    assert doc is not None
    jsonschema.validate(doc, SCHEMA)
    plan = doc["options"]["budget"]
    assert plan["budget_s"] == 180 and plan["gpus"] == 8 and plan["estimated_s"] <= 180
    ran = [c["id"] for c in doc["checks"]]
    assert ran == [c["id"] for c in plan["chosen"]]
    assert {x["id"] for x in plan["left_out"]} == set(ALL) - set(ran)
    assert doc["level"] == "burn-in"  # with a budget, every level is a candidate
    assert "burn-in" not in ran and "burn-in" in {x["id"] for x in plan["left_out"]}


def test_list_shows_the_plan(capsys) -> None:
    assert cli.main(["--simulate", "h100-sxm-8x-healthy", "--budget", "90s", "--list"]) == 0
    out = capsys.readouterr().out
    assert "left out: burn-in (needs ~" in out and "ecc-errors" in out


@pytest.mark.parametrize("value", ["0", "soon"])
def test_a_bad_budget_is_a_one_line_usage_error(value, capsys) -> None:
    assert cli.main(["--simulate", "cpu-only-healthy", "--budget", value, "--no-json", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # argparse prints its usage above a bad value, as for --duration
    assert "Traceback" not in err and "budget" in last
    assert last.startswith(("error:", "python -m checks: error:"))


def test_slurm_health_check_passes_its_budget_on(monkeypatch, tmp_path) -> None:
    seen = {}

    def fake_run(level, extra, timeout_s, state_dir):
        seen.update(level=level, extra=list(extra))
        return slurm.Verdict(False, "")

    monkeypatch.setattr(slurm, "run_checks", fake_run)
    monkeypatch.setattr(slurm, "node_state", lambda node: slurm.NodeState("idle", ""))
    # The per-node path reads the whole cluster's drains once (its drain budget).
    monkeypatch.setattr(slurm, "cluster_view", lambda node, prefix: (slurm.NodeState("idle", ""), [], 1))
    code = slurm.main(["health-check", "--node", "n1", "--budget", "90s", "--state-dir", str(tmp_path),
                       "--", "--simulate", "cpu-only-healthy"])
    assert code == 0
    assert seen["extra"] == ["--budget", "90s", "--simulate", "cpu-only-healthy"]


def test_slurm_budget_reaches_the_report(tmp_path) -> None:
    """The real path: health-check's python -m checks run with the budget, kept as last.json."""
    result = slurm.run_checks("quick", ["--budget", "60s", "--simulate", "h100-sxm-8x-healthy"], 120,
                              tmp_path)
    assert not result.failed, result.summary
    last = json.loads((tmp_path / "last.json").read_text())
    assert last["options"]["budget"]["budget_s"] == 60
    assert last["level"] == "quick"


def test_a_smaller_size_reaches_the_check(run_cli) -> None:
    _code, doc, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "gpu-matmul", "--budget", "30s")
    assert doc is not None
    assert doc["options"]["budget"]["chosen"] == [
        {"id": "gpu-matmul", "size": "smaller", "cost_s": 28.0, "value": 7.0}]
    [chk] = doc["checks"]
    assert {tuple(r["details"]["figures"]) for r in chk["results"]} == {("matmul_bf16_tflops",)}
    _code, full, _ = run_cli("--simulate", "h100-sxm-8x-healthy", "--only", "gpu-matmul", "--budget", "2m")
    assert len(full["checks"][0]["results"][0]["details"]["figures"]) == 4


@pytest.mark.parametrize(("argv", "message"), [
    # One check would fit, and the run would have said PASS having looked at nothing else.
    (["--budget", "1s"], r"--budget 1 s is too small: the \d+ quick-level checks \(the node's "
                         r"health\) need ~\d+ s here; give at least --budget \d+s"),
    (["--budget", "30s", "--level", "quick"], r"need ~\d+ s here"),
    (["--budget", "1s", "--only", "gpu-matmul"], r"--budget 1 s holds none of the selected checks"),
], ids=["health-checks-left-out", "quick-level", "nothing-fits"])
def test_a_budget_too_small_for_the_health_checks_is_a_usage_error(argv, message, capsys,
                                                                   tmp_path) -> None:
    report = tmp_path / "report.json"
    code = cli.main(["--simulate", "cpu-only-healthy", *argv, "--json", str(report), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and re.search(message, err), err
    assert not report.exists()


def test_the_health_checks_are_planned_before_anything_more_valuable() -> None:
    entries = {"health": budget.Budget(3, budget.Cost(10, 10), "t"),
               "workload": budget.Budget(9, budget.Cost(50, 50), "t")}
    plan = budget.make(["health", "workload"], 55, gpus=0, duration_s=600, entries=entries,
                       required=["health"])
    assert [c.id for c in plan.chosen] == ["health"]  # by value alone, workload would fill it
    assert [x["id"] for x in plan.left_out] == ["workload"]
    with pytest.raises(budget.BudgetError, match="need ~10 s here; give at least --budget 10s"):
        budget.make(["health", "workload"], 9, gpus=0, duration_s=600, entries=entries,
                    required=["health"])


def test_checks_that_skip_on_one_gpu_are_not_charged_a_launch_there() -> None:
    """On one GPU, the collectives and P2P SKIP at once ("a single GPU has nobody to talk to",
    "has no peer"): charged their 60 + 2 s and 15 + 4 s launches, they crowded the acceptance
    jobs and the HBM check out of a one-GPU node's plan."""
    table = budget.table()
    for check_id in ("nccl-allreduce", "nccl-transport", "p2p-bandwidth"):
        assert table[check_id].min_gpus == 2, check_id
        assert table[check_id].on(1) == budget.SKIP_COST_S
        assert table[check_id].on(8) == table[check_id].cost.on(8)
        assert table[check_id].on(0) == table[check_id].cost.cpu  # the CPU stand-in runs them
    standard = [c.id for c in registry.select("standard")]
    one = budget.make(standard, 250, gpus=1, duration_s=600)
    charged = {c.id: c.cost_s for c in one.chosen}
    assert charged.get("nccl-allreduce") == budget.SKIP_COST_S
    # The ~80 s the two skips were charged before now buy real measurements of the one GPU.
    assert {"gpu-matmul", "reference-digest"} <= one.ids, one.left_out
