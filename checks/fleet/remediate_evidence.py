"""What the remediation loop keeps and shows: the remedy a kept report calls for, the
evidence of each drain (the failing report, the kernel-log lines behind it, the attempts; the
last --keep-evidence per node), the bundle an escalation names, and the textfile
(nodecert-remediation.prom) node_exporter serves."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks import safeio
from checks.fleet import slurm_gate as gate
from checks.fleet.remediate_guard import load_breaker
from checks.fleet.remediate_state import BUNDLES, EVIDENCE, LEVELS, LOG, RECORD, STAGES, TEXTFILE, Record, Run
from checks.fleet.slurm_control import one_line


def kept_report(state_dir: Path) -> dict[str, Any] | None:
    """last.json when it holds a report (not a stand-in for a hung or crashed run)."""
    try:
        doc = json.loads((state_dir / gate.LAST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "schema" in doc else None


def remedy_of(state_dir: Path, reason: str, prefix: str) -> tuple[str, str, list[str], list[str],
                                                                 str, str]:
    """(class, fault, GPUs, serials, why, level) for the node's kept report; a drain with no
    report behind it (a hung or killed run, a wrapper error) is checked again (recheck)."""
    from checks.report import remedy as remedies

    report = kept_report(state_dir)
    summary = reason[len(prefix) + 1:].strip()
    if report is None:
        fault = summary.split(None, 1)[0] if summary else "unknown"
        if fault.startswith(gate.WRAPPER_ID) or fault.startswith("nodecert-config"):
            return "none", fault, [], [], f"nodecert itself failed: {summary}", "standard"
        return "recheck", fault, [], [], f"no report behind the drain: {summary}", "standard"
    level = str(report.get("level") or "standard")
    found = remedies.remedy_for(report)
    if found is None:  # the kept report passes: the drain is older than it
        return "recheck", summary.split(None, 1)[0] or "unknown", [], [], \
            "the kept report passes; verify before resuming", level
    return (found.kind, found.fault, list(found.gpus), list(found.serials), found.reason, level)


def verify_level(report_level: str, minimum: str) -> str:
    """The level that caught the fault, at least `minimum`."""
    ranks = [LEVELS.index(x) for x in (report_level, minimum) if x in LEVELS]
    return LEVELS[max(ranks, default=1)]


def make_backend(checks_args: Sequence[str]) -> Any:
    """The hardware backend the node's checks use (--simulate SCENARIO among the options)."""
    from checks.node import node_cli

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--simulate")
    known, _ = parser.parse_known_args(list(checks_args))
    return node_cli.make_backend(known.simulate)


KERNEL_LINE = re.compile(r"NVRM|Xid|SXid|AER|nvidia|nvswitch|fallen off", re.IGNORECASE)


def keep_evidence(run: Run, rec: Record, why: str) -> str:
    """A directory with the failing report, the kernel-log lines behind it and the attempts so
    far; the oldest beyond --keep-evidence are removed. Returns its path ("" in a dry run)."""
    if not run.apply:
        return ""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    base = run.directory / EVIDENCE
    path = base / f"{stamp}-{re.sub(r'[^A-Za-z0-9_.-]', '_', rec.fault)[:32]}"
    n = 1
    while path.exists():
        path = base / f"{stamp}-{n}-{rec.fault[:32]}"
        n += 1
    path.mkdir(parents=True)
    with contextlib.suppress(OSError):
        (path / "report.json").write_bytes((run.state_dir / gate.LAST).read_bytes())
    lines: list[str] = []
    report = kept_report(run.state_dir) or {}
    for chk in report.get("checks") or []:
        for result in chk.get("results") or []:
            details = result.get("details") if isinstance(result, dict) else None
            if result.get("status") in ("FAIL", "ERROR") and isinstance(details, dict) \
                    and isinstance(details.get("last"), str):
                lines.append(f"# {chk.get('id')}: {details['last']}")
    try:
        log = make_backend(run.checks_args).kernel_log()
        lines += [line for line in log if KERNEL_LINE.search(line)][-500:]
    except Exception as exc:  # evidence is best effort: say why it is missing
        lines.append(f"# kernel log not read: {type(exc).__name__}: {one_line(str(exc))}")
    (path / "kernel.log").write_text("\n".join(lines) + "\n")
    (path / "attempts.json").write_text(json.dumps(
        {"why": why, "record": dataclasses.asdict(rec), "actions": run.history()[-50:]}, indent=1))
    kept = sorted(p for p in base.iterdir() if p.is_dir())
    for old in kept[:-run.policy.keep_evidence]:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    return str(path)


def bundle(run: Run, rec: Record) -> str:
    """One tar.gz of the node's evidence, its record and its action log, for the RMA ticket."""
    if not run.apply:
        return str(run.directory / BUNDLES / f"{run.node}-<time>.tar.gz")
    out = run.directory / BUNDLES
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{run.node}-{time.strftime('%Y%m%dT%H%M%S')}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in (EVIDENCE, LOG, RECORD):
            if (run.directory / name).exists():
                tar.add(run.directory / name, arcname=f"{run.node}/{name}")
    return str(path)


def publish(run: Run) -> None:
    """DIR/nodecert-remediation.prom: this node's stage, its actions by kind and result, the
    breaker (node_exporter's textfile collector)."""
    if run.textfile_dir is None or not run.apply:
        return
    rec = Record.load(run.directory / RECORD)
    stage = rec.stage if rec else "in-service"
    counts: dict[tuple[str, str], int] = {}
    for e in run.history():
        key = (str(e.get("action")), str(e.get("result")))
        counts[key] = counts.get(key, 0) + 1
    host = run.node
    breaker = int(bool(load_breaker(run.directory).get("open")))
    out = ["# HELP nodecert_remediation_state 1 for the remediation stage this node is in.",
           "# TYPE nodecert_remediation_state gauge"]
    for s in STAGES:
        labels = f'host="{host}",state="{s}"'
        if s == stage and rec and s in ("escalated", "held"):
            labels += f',fault="{_q(rec.fault)}",reason="{_q(rec.reason)}"'
        out.append(f"nodecert_remediation_state{{{labels}}} {int(s == stage)}")
    out += ["# HELP nodecert_remediation_actions_total Remediation actions on this node, by kind "
            "and result (the action log).", "# TYPE nodecert_remediation_actions_total counter"]
    out += [f'nodecert_remediation_actions_total{{host="{host}",kind="{_q(k)}",result="{_q(r)}"}} {n}'
            for (k, r), n in sorted(counts.items())]
    out += ["# HELP nodecert_remediation_breaker_open 1 while the breaker stops new remedies "
            "(remediate --reset-breaker).", "# TYPE nodecert_remediation_breaker_open gauge",
            f'nodecert_remediation_breaker_open{{host="{host}"}} {breaker}',
            "# HELP nodecert_remediation_last_run_timestamp_seconds When the remediation loop last "
            "ran on this host.", "# TYPE nodecert_remediation_last_run_timestamp_seconds gauge",
            f'nodecert_remediation_last_run_timestamp_seconds{{host="{host}"}} {time.time():.3f}']
    run.textfile_dir.mkdir(parents=True, exist_ok=True)
    safeio.write_bytes(run.textfile_dir / TEXTFILE, ("\n".join(out) + "\n").encode(), mode=0o644)


def _q(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
