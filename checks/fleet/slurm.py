"""Drain Slurm nodes that fail nodecert, and resume the ones nodecert drained once they pass.

    python -m checks.fleet.slurm report reports/run1/node07.json --node node07     # dry run
    python -m checks.fleet.slurm report reports/run1/node07.json --node node07 --apply
    python -m checks.fleet.slurm report reports/run1/meta/fleet.json --apply  # the fleet's findings
    python -m checks.fleet.slurm health-check --apply        # HealthCheckProgram: runs checks here
    python -m checks.fleet.slurm prolog --apply              # Prolog: refuse a node that failed
    python -m checks.fleet.slurm epilog --apply              # Epilog: the health check after a job
    python -m checks.fleet.slurm scripts /etc/slurm/nodecert # write the three wrappers slurm.conf names
    python -m checks.fleet.slurm batch-script --nodes 2      # sbatch script: cross-host stage

A failed node is drained with `scontrol update NodeName=<node> State=DRAIN
Reason="NODECERT: <fault code> <check-id> <message>"` (the prefix follows LBNL NHC's `NHC:`
convention). Health-check mode keeps the node's last report in --state-dir (last.json), which
the prolog reads: a job does not start on a node whose last verdict failed. A node
is resumed (`State=RESUME`) only if it is drained with a reason carrying our prefix (or with
Slurm's "Prolog error"/"Epilog error" that our own wrapper caused): a node an administrator
drained stays drained. Dry run by default: the exact command is printed, not run. The current
state and reason come from `sinfo -h -N -n <node> -o '%T|%E'`. A node name is one Slurm node
(no ranges, lists or ALL) before any Slurm command sees it. Deadlines and the behaviour on
hang, crash and a broken state directory: checks.fleet.slurm_conf and checks.fleet.slurm_gate.

Exit status: 0 the node passes, 1 the node fails (drained, or would be), 2 bad input (unreadable
report, bad options), 3 a Slurm command failed or is missing. The Epilog exits 0 once it has
acted (a non-zero Epilog makes Slurm drain the node with "Epilog error").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from checks import cliutil
from checks.fleet import slurm_conf
from checks.fleet import slurm_control as control
from checks.fleet import slurm_gate as gate
from checks.fleet.slurm_control import (  # noqa: F401 (the module's API)
    DEFAULT_PREFIX,
    EXIT_FAIL,
    EXIT_SLURM,
    EXIT_USAGE,
    SLURM_ERROR_REASONS,
    Action,
    InputError,
    NodeState,
    SlurmError,
    Verdict,
    act,
    decide,
    drain_reason,
    local_node,
    node_name,
    node_state,
    verdict,
)
from checks.fleet.slurm_gate import RUN_ID, keep_last, last_verdict  # noqa: F401 (API)
from checks.report import load

STATE_DIR = "/var/lib/nodecert"
LAST = gate.LAST
ROLES = ("health-check", "epilog", "prolog")


def run_checks(level: str, extra: Sequence[str], timeout_s: float,
               state_dir: Path | None = None) -> Verdict:
    """Run `python -m checks` here under the deadline (checks.fleet.slurm_gate); the report, or
    a FAIL stand-in saying why there is none, is kept as state_dir/last.json."""
    progress = state_dir / gate.PROGRESS if state_dir is not None else None
    result, report = gate.run_checks(level, extra, timeout_s, progress)
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        keep_last(state_dir, report, result)
    return result


def _kept_report(state_dir: Path) -> dict[str, Any] | None:
    """The report last.json holds, None for a stand-in (hang, crash) or none at all."""
    try:
        doc = json.loads((state_dir / LAST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or "schema" not in doc:
        return None
    doc.pop("nodecert_slurm", None)
    return doc


# The per-node path's exit when the drain budget held a drain back (the textfile alerts): the
# wrappers read it as "acted" (health check and epilog exit 0, the Prolog lets the job run).
EXIT_HELD = 4


def cluster_view(node: str, prefix: str) -> tuple[NodeState, list[str], int]:
    """One `sinfo` for the whole cluster (the wrappers' deadline counts two Slurm calls): this
    node's state, the nodes drained with a `<prefix>:` reason now, sorted (an administrator's
    drains do not count), and how many nodes there are. A dry run knows none of it: the state
    is unknown and the budget not counted."""
    if control.offline:
        return control.UNKNOWN, [], 0
    out = control.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"])
    states: dict[str, NodeState] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|", 2)]
        if len(parts) == 3 and parts[0]:
            states[parts[0]] = control.parse_state(parts[1], parts[2])
    if node not in states:
        raise SlurmError(f"sinfo knows no node {node!r}")
    ours = sorted(n for n, s in states.items() if s.drained and s.reason.startswith(f"{prefix}:"))
    return states[node], ours, len(states)


def drain_allowed(fraction: float, nodes: int) -> int:
    """How many nodes the per-node path may hold drained with nodecert's reason at once."""
    return max(1, math.floor(fraction * nodes))


def _act_here(node: str, result: Verdict, state_dir: Path, prefix: str, apply: bool,
              max_fraction: float = 1.0) -> bool:
    """Drain or resume this node; a "Prolog error"/"Epilog error" our wrapper caused counts as
    ours, and its note is dropped once the node is resumed. A new drain past the cluster-wide
    budget (max_fraction of the nodes already drained by nodecert) is held back: True.

    Nodes whose runs drain in the same instant (slurmd starts every node's health check
    together) each find the budget free; so a new drain reads the count again after it. Over
    the budget, every node that drained just now and is not among the first `allowed` names of
    nodecert's drained nodes resumes itself: all of them read the same set once all have
    drained, so the same few stay."""
    state, drained, nodes = cluster_view(node, prefix)
    ours = gate.caused_slurm_error(state_dir)
    action = decide(node, result, state, prefix, slurm_error_ours=ours)
    allowed = drain_allowed(max_fraction, nodes)
    new_drain = action.kind == "drain" and not state.drained
    if new_drain and len(drained) >= allowed:
        _held(node, len(drained), nodes, allowed, max_fraction, action.reason)
        return True
    act(action, apply)
    if new_drain and apply:
        _, after, nodes = cluster_view(node, prefix)
        if len(after) > allowed and node not in after[:allowed]:
            act(Action("resume", node, "drained together with others past the drain budget"),
                apply)
            _held(node, len(after) - 1, nodes, allowed, max_fraction, action.reason)
            return True
    if action.kind == "resume" and apply and ours:
        gate.forget_slurm_error(state_dir)
    if action.kind == "resume" and apply and state.drained:
        from checks.fleet.remediate_state import note_resume  # a cycle the loop counts

        note_resume(state_dir, node, "health check", state.reason)
    if apply and result.failed and (action.kind == "drain" or (
            state.drained and state.reason.startswith(f"{prefix}:"))):
        gate.note_drain(state_dir, result.summary)
    elif apply and not result.failed:
        gate.forget_drain(state_dir)
    return False


def _held(node: str, drained: int, nodes: int, allowed: int, fraction: float, reason: str | None
          ) -> None:
    print(f"{node}: held back by the drain budget: {drained} of {nodes} nodes are drained by "
          f"nodecert, at most {allowed} at once (--max-drain-fraction {fraction:g}); alerting "
          f"instead (nodecert_host_healthy 0); would drain: {reason}", file=sys.stderr)


def _wrapper_failed(node: str, role: str, exc: BaseException, state_dir: Path, prefix: str,
                    apply: bool) -> int:
    """Fail closed: the wrapper itself broke (disk full, read-only, unreadable state, a bug).
    Drain with our reason; when even that is impossible, exit so that Slurm drains."""
    summary = f"{gate.WRAPPER_ID} {role}: {gate.describe_error(exc)}"
    print(f"error: {summary}", file=sys.stderr)
    result = Verdict(True, summary)
    with contextlib.suppress(Exception):  # the state may be what broke
        keep_last(state_dir, None, result)
    try:
        act(decide(node, result, node_state(node), prefix), apply)
    except SlurmError as err:
        print(f"error: {err}", file=sys.stderr)
        if role != "health-check":
            gate.note_slurm_error(state_dir, role, summary)
        return EXIT_SLURM
    return 0 if role == "epilog" else EXIT_FAIL


def _publish_unhealthy(args: argparse.Namespace, config_failure: bool = False) -> None:
    """The wrapper-error paths publish the host unhealthy too (no report: healthy 0), so that
    NodecertHostUnhealthy fires (and NodecertConfigFailure for refused options); a textfile
    directory that is what broke is left as it is."""
    if args.textfile_dir:
        with contextlib.suppress(Exception):
            gate.publish(Path(args.textfile_dir), args.node, args.level, None, args.interval,
                         config_failure)


def gate_run(role: str, args: argparse.Namespace, extra: Sequence[str]) -> int:
    """health-check or epilog: run the checks under the deadline, keep the verdict, act."""
    state_dir, node = Path(args.state_dir), args.node
    try:
        with gate.state_lock(state_dir, wait_s=2.0) as held:
            if not held:
                print(f"{node}: another nodecert run holds {state_dir / gate.LOCK}; it acts",
                      file=sys.stderr)
                return 0
            stale = gate.stale_marker(state_dir)
            gate.start_marker(state_dir, role, args.timeout)
            if stale is not None:  # the last run was killed: that is this run's finding
                result = gate.killed_verdict(stale, state_dir)
                keep_last(state_dir, None, result)
            else:
                result = run_checks(args.level, extra, args.timeout, state_dir)
            gate.clear_marker(state_dir)
            if args.textfile_dir:
                gate.publish(Path(args.textfile_dir), node, args.level, _kept_report(state_dir),
                             args.interval)
        held = _act_here(node, result, state_dir, args.prefix, args.apply, args.max_drain_fraction)
    except gate.UsageError as exc:  # a configuration error, not a node fault (FAIL_CLOSED)
        with contextlib.suppress(OSError):
            gate.clear_marker(state_dir)
        _publish_unhealthy(args, config_failure=True)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE  # the wrapper drains: nodecert's configuration failed
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if role == "epilog":
            gate.note_slurm_error(state_dir, role, str(exc))
        return EXIT_SLURM
    except Exception as exc:  # fail closed, whatever broke
        with contextlib.suppress(OSError):  # not killed: its own error names what broke
            gate.clear_marker(state_dir)
        _publish_unhealthy(args)
        return _wrapper_failed(node, role, exc, state_dir, args.prefix, args.apply)
    if role == "epilog":
        return 0
    if held:
        return EXIT_HELD
    return EXIT_FAIL if result.failed else 0


def prolog_verdict(state_dir: Path) -> Verdict | None:
    """What the Prolog trusts: a killed health check first, then the kept verdict."""
    return gate.killed_run(state_dir) or last_verdict(state_dir)


def prolog_run(args: argparse.Namespace) -> int:
    """Refuse the job (exit 1) on a node whose last verdict failed, after draining it with our
    reason; slurmctld keeps that reason and requeues the job (held unless
    SchedulerParameters=nohold_on_prolog_fail)."""
    state_dir, node = Path(args.state_dir), args.node
    try:
        kept = prolog_verdict(state_dir)
        if kept is None or not kept.failed:
            return 0
        print(f"nodecert: this node's last verdict failed: {kept.summary}", file=sys.stderr)
        state, drained, nodes = cluster_view(node, args.prefix)
        if not state.drained and gate.drained_for(state_dir) == kept.summary:
            # nodecert drained the node for this verdict and someone resumed it since: an
            # administrator's RESUME ends nodecert's hold; the next health check judges anew
            print(f"{node}: resumed after nodecert drained it for this verdict: the job runs; "
                  "the next health check judges the node again", file=sys.stderr)
            return 0
        action = decide(node, kept, state, args.prefix)
        if (action.kind == "drain" and not state.drained
                and len(drained) >= drain_allowed(args.max_drain_fraction, nodes)):
            print(f"{node}: held back by the drain budget ({len(drained)} of {nodes} nodes "
                  "drained by nodecert): the job runs", file=sys.stderr)
            return 0
        act(action, args.apply)
        return EXIT_FAIL
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        gate.note_slurm_error(state_dir, "prolog", str(exc))
        return EXIT_SLURM
    except Exception as exc:  # fail closed: unreadable state refuses the job
        code = _wrapper_failed(node, "prolog", exc, state_dir, args.prefix, args.apply)
        return code or EXIT_FAIL


WRAPPERS = {
    # name: (what slurm.conf calls it, subcommand and options)
    "nodecert-healthcheck": ("HealthCheckProgram", ["health-check", "--apply"]),
    "nodecert-prolog": ("Prolog", ["prolog", "--apply"]),
    "nodecert-epilog": ("Epilog", ["epilog", "--apply"]),
}


# What a wrapper does when the nodecert run it starts did not act (any exit but 0, and a 1 that
# left the node in service): it drains the node itself, with nothing but /bin/sh, sinfo, scontrol
# and POSIX tools, so that a missing interpreter (127), a broken package (1 with a traceback),
# refused options (2), a failed fork or a killed run (exit 128+N: signal N, named as such) never
# switch checking off in silence. A node that is already drained (by the run, or by an
# administrator) keeps its reason. The drain obeys the same cluster-wide budget as the run's own
# (_act_here: --max-drain-fraction of the nodes drained by nodecert, read from one sinfo, checked
# again after the drain), so one typo pushed to every node drains at most the budget; every node
# publishes nodecert_host_healthy 0 and nodecert_config_failure 1 to the textfile itself (no
# Python ran to write it), carrying the file's other series over.
CONFIG_ID = "nodecert-config"
DRAIN_FRACTION = 0.10  # the run's --max-drain-fraction default, which the wrappers keep
FAIL_CLOSED = r"""rc=$?
[ "$rc" -eq 0 ] && exit 0
[ "$rc" -eq 4 ] && exit 0  # EXIT_HELD: the drain budget held the drain back; the textfile alerts
[ "$rc" -eq 3 ] && exit 3  # the run found Slurm unreachable: Slurm drains a Prolog/Epilog node
# scontrol retries a missing slurm.conf for 60 s: no call that cannot succeed
[ -z "${SLURM_CONF:-}" ] || [ -r "$SLURM_CONF" ] || exit 3
if [ -z "$NODE" ]; then  # not under slurmd: this host's name as Slurm knows it, full or short
  NODE=$(uname -n)
  "$SCONTROL" -o show node "$NODE" >/dev/null 2>&1 || NODE=${NODE%%.*}
fi
case "$NODE" in  # one node name, as slurm_control.node_name: no range, list or ALL
  ""|[!A-Za-z0-9]*|*[!A-Za-z0-9_.-]*|[Aa][Ll][Ll])
    echo "nodecert: $ROLE run exited $rc; node name '$NODE' is not one Slurm node" >&2; exit 2 ;;
esac
config=1; [ "$rc" -gt 128 ] && config=0
publish() {  # what the run would have written: unhealthy, why, when; the file's other series kept
  [ -n "$TEXTFILE_DIR" ] || return 0
  f="$TEXTFILE_DIR/nodecert.prom"; t="$TEXTFILE_DIR/.nodecert.prom.sh$$"
  mkdir -p "$TEXTFILE_DIR" 2>/dev/null
  own='^(# (HELP|TYPE) )?nodecert_(host_healthy|config_failure|last_run_timestamp_seconds)[ {]'
  { [ -r "$f" ] && grep -Ev "$own" "$f"
    echo "# HELP nodecert_host_healthy 1 when every check passed (PASS, WARN or SKIP), else 0."
    echo "# TYPE nodecert_host_healthy gauge"
    echo "nodecert_host_healthy{host=\"$NODE\",level=\"quick\",profile=\"\"} 0"
    echo "# HELP nodecert_config_failure 1 when nodecert itself failed on this host (refused" \
         "options, missing interpreter, broken package), not the node."
    echo "# TYPE nodecert_config_failure gauge"
    echo "nodecert_config_failure{host=\"$NODE\"} $config"
    echo "# HELP nodecert_last_run_timestamp_seconds When the last nodecert run on this host" \
         "finished (Unix time)."
    echo "# TYPE nodecert_last_run_timestamp_seconds gauge"
    echo "nodecert_last_run_timestamp_seconds{host=\"$NODE\"} $(date +%s)"
  } > "$t" && chmod 644 "$t" && mv -f "$t" "$f" || rm -f "$t"
}
why="$CONFIG_ID $ROLE exited $rc: nodecert's configuration failed, not the node"
[ "$rc" -gt 128 ] && why="nodecert-run ($ROLE) killed by signal $((rc - 128)) before it finished"
T=; command -v timeout >/dev/null 2>&1 && T="timeout -k 1 $CALL_S"
ours() {  # the nodes drained with our reason now, sorted as the run sorts them; n: all nodes
  out=$($T "$SINFO" -h -N -o '%N|%T|%E' 2>/dev/null) || { n=0; drained=; mine=; return; }
  mine=$(printf '%s\n' "$out" | awk -F'|' -v n="$NODE" '$1 == n { print $3; exit }')
  n=$(printf '%s\n' "$out" | awk -F'|' 'NF > 2 && !s[$1]++' | wc -l)
  drained=$(printf '%s\n' "$out" | awk -F'|' -v p="$PREFIX:" \
    'tolower($2) ~ /drain/ && index($3, p) == 1 && !s[$1]++ { print $1 }' | LC_ALL=C sort)
}
held() {
  publish
  echo "nodecert: $ROLE run exited $rc; held back by the drain budget: $1 of $n nodes are" \
       "drained by nodecert, at most $allowed at once; alerting instead" \
       "(nodecert_host_healthy 0, nodecert_config_failure $config); would drain: $why" >&2
  exit 0
}
first() {  # this node is among the first $allowed of nodecert's drained nodes
  printf '%s\n' "$drained" | head -n "$allowed" | grep -qxF -- "$NODE"
}
ours  # sinfo unanswered (n=0): no budget to keep, the node is drained (fail closed)
allowed=$(LC_ALL=C awk -v f="$MAX_DRAIN_FRACTION" -v n="$n" \
  'BEGIN { a = int(f * n); print (a < 1 ? 1 : a) }')
count=$(printf '%s' "$drained" | grep -c .)
st=$("$SCONTROL" -o show node "$NODE" 2>/dev/null) || st=
st=${st#* State=}
case "${st%% *}" in
  *DRAIN*)
    case "$mine" in  # our own configuration drain, kept by a run that drained with others
      "$PREFIX: $CONFIG_ID "*) if [ "$n" -gt 0 ] && [ "$count" -gt "$allowed" ] && ! first; then
          "$SCONTROL" update NodeName="$NODE" State=RESUME && held "$((count - 1))"
        fi ;;
    esac
    publish; [ "$ROLE" = epilog ] && exit 0; exit "$rc" ;;
esac
[ "$n" -gt 0 ] && [ "$count" -ge "$allowed" ] && held "$count"
echo "nodecert: $ROLE run exited $rc and left $NODE in service: draining it ($why)" >&2
"$SCONTROL" update NodeName="$NODE" State=DRAIN Reason="$PREFIX: $why" || { publish; exit 3; }
ours  # runs that failed in the same instant each found the budget free: keep the first names
count=$(printf '%s' "$drained" | grep -c .)
if [ "$n" -gt 0 ] && [ "$count" -gt "$allowed" ] &&
   ! first; then
  "$SCONTROL" update NodeName="$NODE" State=RESUME && held "$((count - 1))"
fi
publish
[ "$ROLE" = epilog ] && exit 0
exit "$rc"
"""


def _sh_lines(name: str, role: str, prefix: str, python: str, scontrol: str, run: str,
              textfile_dir: str | None = None, call_s: float = 10.0) -> list[str]:
    """The wrapper's text: settings, the run (not exec'd: its exit is judged), FAIL_CLOSED."""
    q = shlex.quote
    path = ":".join(dict.fromkeys([str(Path(scontrol).parent), "/usr/local/sbin", "/usr/local/bin",
                                   "/usr/sbin", "/usr/bin", "/sbin", "/bin"]))
    sinfo = str(Path(scontrol).parent / "sinfo")  # the same installation as scontrol
    lines = ["#!/bin/sh",
             f"# {WRAPPERS[name][0]} for Slurm, written by python -m checks.fleet.slurm scripts",
             f"PATH={q(path)}${{PATH:+:$PATH}}; export PATH",  # slurmd's PATH is bare
             f"SCONTROL={q(scontrol)} ROLE={q(role)} PREFIX={q(prefix)} CONFIG_ID={CONFIG_ID}",
             f"SINFO={q(sinfo)} MAX_DRAIN_FRACTION={DRAIN_FRACTION:g} CALL_S={call_s:g} "
             f"TEXTFILE_DIR={q(textfile_dir or '')}",
             'NODE=${SLURMD_NODENAME:-}']
    conf = os.environ.get("SLURM_CONF")
    if conf:
        lines.append(f"export SLURM_CONF={q(conf)}")
    return [*lines, f"{q(python)} -m checks.fleet.slurm {run}", FAIL_CLOSED.rstrip("\n")]


def write_scripts(directory: Path, state_dir: Path, prefix: str, plan: slurm_conf.Plan,
                  checks_args: Sequence[str], textfile_dir: str | None = None,
                  python: str | None = None, scontrol: str | None = None) -> list[Path]:
    """Slurm runs a program path without arguments: one small wrapper per role, naming this
    Python (the node's nodecert venv), scontrol by its full path (found on PATH now), SLURM_CONF
    when one is set, and the deadlines the plan derived from slurm.conf. A run that does not act
    is failed closed by the wrapper itself (FAIL_CLOSED)."""
    directory.mkdir(parents=True, exist_ok=True)
    python = python or sys.executable
    scontrol = scontrol or shutil.which("scontrol") or "/usr/bin/scontrol"
    written = []
    for name, (_, sub) in WRAPPERS.items():
        args = [*sub, "--prefix", prefix, "--state-dir", str(state_dir)]
        if sub[0] == "prolog":
            args += ["--slurm-timeout", f"{plan.prolog_call_timeout_s:g}"]
        else:
            args += ["--timeout", f"{plan.check_timeout_s:g}",
                     "--slurm-timeout", f"{plan.slurm_call_timeout_s:g}"]
            if textfile_dir:
                args += ["--textfile-dir", textfile_dir]
                if plan.interval_s:
                    args += ["--interval", f"{plan.interval_s:g}"]
            if plan.budget_s is not None:
                args += ["--budget", f"{plan.budget_s:g}s"]
            if checks_args:
                args += ["--", *checks_args]
        call_s = plan.prolog_call_timeout_s if sub[0] == "prolog" else plan.slurm_call_timeout_s
        lines = _sh_lines(name, sub[0], prefix, python, scontrol, shlex.join(args), textfile_dir,
                          call_s)
        # the checks honour this node's GPU reset markers (checks.hw.kernel_log)
        lines.insert(-2, f"NODECERT_STATE_DIR={shlex.quote(str(state_dir))}; "
                         "export NODECERT_STATE_DIR")
        path = directory / name
        tmp = directory / f".{name}.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.chmod(0o755)
        tmp.replace(path)
        written.append(path)
    from checks.fleet import remediate  # the loop's command, for a timer: same options

    path = directory / "nodecert-remediate"
    path.write_text("\n".join(remediate.wrapper_lines(
        python, scontrol, prefix, state_dir, plan.slurm_call_timeout_s, textfile_dir,
        checks_args)) + "\n")
    path.chmod(0o755)
    written.append(path)
    return written


NODE_HELP = ("Slurm node name (default: $SLURMD_NODENAME, else the node whose NodeName or "
             "NodeHostname equals this host's name, else its short name)")
DRAIN_BUDGET_HELP = ("cluster-wide budget: when this share of the nodes (at least one) is "
                     "already drained with nodecert's reason, a new drain is held back and "
                     "alerted instead (exit 4; an administrator's drains do not count; "
                     "default 0.10)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.fleet.slurm",
                                description="Drain failed Slurm nodes, resume the ones nodecert drained.",
                                epilog="Exit status: 0 node passes, 1 node fails, 2 bad input, "
                                       "3 Slurm command failed. Dry run unless --apply.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", default=DEFAULT_PREFIX,
                        help=f"reason prefix that marks nodecert's drains (default {DEFAULT_PREFIX})")
    common.add_argument("--apply", action="store_true", help="run scontrol (default: print the command)")
    common.add_argument("--dry-run", action="store_true",
                        help="ask no Slurm daemon (no sinfo, no scontrol; works without slurmctld): "
                             "print the scontrol commands this would run, the node's state taken "
                             "as unknown; health-check and epilog keep no state and publish no "
                             "metrics")
    common.add_argument("--slurm-timeout", type=float, default=30.0, metavar="S",
                        help="limit of each sinfo/scontrol call (default 30; the wrappers pass "
                             "slurm.conf's MessageTimeout)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    rep = sub.add_parser("report", parents=[common],
                         help="act on a host report or on a fleet summary (JSON)")
    rep.add_argument("report", metavar="FILE",
                     help="host report (python -m checks --json) or fleet summary "
                          "(python -m checks.fleet report --json)")
    rep.add_argument("--node", help="Slurm node name (default: the node the report's host names: "
                                    "NodeName or NodeHostname equal to it, else to its short name)")
    rep.add_argument("--max-drain-fraction", type=float, default=0.10, metavar="F",
                     help="fleet summary: never drain more than this share of a partition at "
                          "once; the rest are reported, not drained (default 0.10)")
    for role, what in (("health-check", "HealthCheckProgram"), ("epilog", "Epilog")):
        hc = sub.add_parser(role, parents=[common],
                            help=f"run python -m checks here, then act on this node ({what})")
        hc.add_argument("--node", help=NODE_HELP)
        hc.add_argument("--level", default="quick", choices=("quick", "standard", "burn-in"),
                        help="check level (default quick: seconds, safe between jobs)")
        hc.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="the check run is killed (its whole process group) and the node "
                             "drained after this (default 300; the wrappers derive it from "
                             "slurm.conf)")
        hc.add_argument("--state-dir", default=STATE_DIR, metavar="DIR",
                        help=f"keep the last report here for the prolog (default {STATE_DIR})")
        hc.add_argument("--budget", metavar="TIME",
                        help="passed to python -m checks --budget: the most valuable checks that "
                             "fit (e.g. 30s; at least 5 s below --timeout)")
        hc.add_argument("--textfile-dir", metavar="DIR",
                        help="node_exporter textfile directory: write DIR/nodecert.prom "
                             "(atomically) after each run")
        hc.add_argument("--max-drain-fraction", type=float, default=0.10, metavar="F",
                        help=DRAIN_BUDGET_HELP)
        hc.add_argument("--interval", type=cliutil.number(float, above=0), metavar="S",
                        help="how often this runs (HealthCheckInterval; a cron period): published "
                             "as nodecert_run_interval_seconds with --textfile-dir, for the "
                             "staleness alert (scripts takes it from slurm.conf)")
    pro = sub.add_parser("prolog", parents=[common],
                         help="Prolog: drain this node and exit 1 (Slurm requeues the job) when "
                              "its last verdict failed or its last health check was killed")
    pro.add_argument("--node", help=NODE_HELP)
    pro.add_argument("--state-dir", default=STATE_DIR, metavar="DIR")
    pro.add_argument("--max-drain-fraction", type=float, default=0.10, metavar="F",
                     help=DRAIN_BUDGET_HELP)
    sc = sub.add_parser("scripts", parents=[common],
                        help="write nodecert-healthcheck, -prolog and -epilog wrappers for slurm.conf")
    sc.add_argument("directory", metavar="DIR")
    sc.add_argument("--state-dir", default=STATE_DIR, metavar="DIR")
    sc.add_argument("--slurm-conf", metavar="FILE",
                    help="read deadlines from this slurm.conf (default $SLURM_CONF, else "
                         f"{slurm_conf.DEFAULT_CONF})")
    sc.add_argument("--timeout", type=float, metavar="S",
                    help="check run deadline (default: what slurm.conf leaves, e.g. 35 s with "
                         "MessageTimeout=10); one that cannot fit is refused")
    sc.add_argument("--budget", metavar="TIME",
                    help="python -m checks --budget for the wrappers; one that cannot fit is refused")
    sc.add_argument("--textfile-dir", metavar="DIR",
                    help="node_exporter textfile directory the health check and epilog write to")
    from checks.fleet import remediate

    remediate.add_parser(sub, common, NODE_HELP, STATE_DIR)
    bs = sub.add_parser("batch-script", help="print an sbatch script for multi-node verification")
    bs.add_argument("--nodes", type=int, required=True)
    bs.add_argument("--out", default="reports/slurm", help="report directory (shared by the nodes)")
    bs.add_argument("--port", type=int, default=29400, help="rendezvous port on the first node")
    bs.add_argument("--minutes", type=int, default=30, help="job time limit")
    bs.add_argument("--level", default="quick", choices=("quick", "standard", "burn-in"))
    bs.add_argument("--ifname", help="network interface for NCCL/gloo between the nodes")
    bs.add_argument("--nproc-per-node", type=int, help="ranks per node (default: GPUs, or 1)")
    return p


def check_passthrough(checks_args: Sequence[str]) -> None:
    """InputError (one line) when `python -m checks` would refuse the options after `--`, parsed
    by its own parser as the wrappers pass them: a typo written into the wrappers would make
    every node fail closed at its next run (each drained, or held by the drain budget)."""
    import io

    from checks.node import node_cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        parsed = cliutil.parse(node_cli.build_parser(),
                               ["--level", "quick", "--json", "report.json", "-q", *checks_args])
    if isinstance(parsed, int):
        why = (control.one_line(err.getvalue()).removeprefix("error: ") if parsed else
               "--help/--version print and exit, leaving no report")
        raise InputError(f"the options after -- are refused by python -m checks, so every "
                         f"wrapper would fail: {why}; nothing written")


def _scripts(args: argparse.Namespace) -> int:
    check_passthrough(args.checks_args)
    limits = slurm_conf.read(slurm_conf.conf_path(args.slurm_conf))
    budget = slurm_conf.parse_duration(args.budget) if args.budget else None
    plan = slurm_conf.plan(limits, args.timeout, budget)
    for path in write_scripts(Path(args.directory), Path(args.state_dir), args.prefix, plan,
                              args.checks_args, args.textfile_dir):
        print(f"wrote {path} ({WRAPPERS[path.name][0]}={path})" if path.name in WRAPPERS else
              f"wrote {path} (for a systemd timer or cron: the remediation loop)")
    print(f"deadlines from {limits.source}: checks {plan.check_timeout_s:g} s (HealthCheckProgram "
          f"limit {slurm_conf.HEALTH_CHECK_LIMIT_S:g} s), Slurm calls "
          f"{plan.slurm_call_timeout_s:g} s, prolog calls {plan.prolog_call_timeout_s:g} s")
    if limits.source == "defaults":
        print(f"note: no slurm.conf at {slurm_conf.conf_path(args.slurm_conf)} here: deadlines from "
              "Slurm's defaults, and the wrappers' sinfo/scontrol calls need the slurm.conf slurmd "
              "runs with (set SLURM_CONF, or --slurm-conf FILE for the deadlines; configless "
              "slurmd: its cached copy)")
    if args.textfile_dir and not plan.interval_s:
        print("note: slurm.conf sets no HealthCheckInterval: the wrappers publish no "
              "nodecert_run_interval_seconds, so only the 26 h rule (NodecertReportsStopped) "
              "notices runs that stop")
    if shutil.which("scontrol") is None:
        print("note: scontrol is not on PATH here: the wrappers name /usr/bin/scontrol, which "
              "they need to drain the node when a run fails without acting")
    if not limits.nohold_on_prolog_fail:
        print("note: without SchedulerParameters=nohold_on_prolog_fail a job the Prolog refuses "
              "is requeued held (launch_failed_requeued_held); with it, requeued to run elsewhere")
    return 0


def _report(args: argparse.Namespace) -> int:
    path = Path(args.report)
    if path.exists() and not path.is_file():  # a FIFO or a device would block the read
        raise InputError(f"{path}: not a regular file")
    item = load.read(path)
    if item is None:  # a fleet summary: act on each host's findings, with the drain guard
        if args.node:  # one node was meant: a summary would drain and resume every other node
            raise InputError(f"{path}: a fleet summary (schema {load.FLEET_SCHEMA_NAME}), not one node's "
                             f"report: --node {args.node} refused (without --node the summary acts "
                             f"on every host)")
        from checks.fleet import slurm_fleet

        return slurm_fleet.act_on_summary(path, args.prefix, args.apply, args.max_drain_fraction)
    if item.report is None:
        raise InputError(f"{args.report}: {item.error}")
    host = item.report["host"]
    node = node_name(args.node or control.resolve_node(node_name(str(host), f"{path}: host")),
                     "--node")
    result = verdict(item.report)
    if result.failed != (item.report["verdict"] == "FAIL"):
        raise InputError(f"{path}: verdict {item.report['verdict']} contradicts its checks "
                         f"({result.summary or 'none failed'})")
    act(decide(node, result, node_state(node), args.prefix), args.apply)
    return EXIT_FAIL if result.failed else 0


def _remediate(args: argparse.Namespace) -> int:
    from checks.fleet import remediate

    return remediate.main(args)


def _gate(args: argparse.Namespace, extra: list[str]) -> int:
    if control.offline:  # the preview keeps no verdict the Prolog would read
        with tempfile.TemporaryDirectory(prefix="nodecert-dry-run.") as scratch:
            args.state_dir, args.textfile_dir = scratch, None
            return gate_run(args.command, args, extra)
    return gate_run(args.command, args, extra)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        control.offline = False  # a dry run's setting ends with it (tests call main in-process)


def _main(argv: Sequence[str] | None = None) -> int:
    # Everything after "--" goes to python -m checks (health-check, epilog, scripts, batch-script).
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = cliutil.parse(build_parser(), argv[:cut])
    if isinstance(args, int):
        return args
    args.checks_args = argv[cut + 1:]
    args.prefix = getattr(args, "prefix", DEFAULT_PREFIX)
    if not args.prefix or ":" in args.prefix:
        print("error: --prefix must be non-empty and without ':'", file=sys.stderr)
        return EXIT_USAGE
    control.call_timeout_s = getattr(args, "slurm_timeout", 30.0)
    control.offline = bool(getattr(args, "dry_run", False))
    try:
        if control.offline and args.apply:
            raise InputError("--dry-run asks no Slurm daemon and --apply runs scontrol: give one")
        if not (math.isfinite(control.call_timeout_s) and control.call_timeout_s > 0):
            raise InputError("--slurm-timeout must be a positive number of seconds")
        if args.command == "scripts":
            return _scripts(args)
        if args.command == "batch-script":
            from checks.fleet import slurm_batch

            return slurm_batch.run(args)
        if not 0 <= getattr(args, "max_drain_fraction", 0) <= 1:
            raise InputError("--max-drain-fraction must be between 0 and 1")
        if args.command == "report":
            return _report(args)
        args.node = node_name(args.node or local_node(), "--node (or $SLURMD_NODENAME)")
        handler = {"prolog": prolog_run, "remediate": _remediate}.get(args.command)
        if handler is not None:
            return handler(args)
        if not (math.isfinite(args.timeout) and args.timeout > 0):
            raise InputError("--timeout must be a positive number of seconds")
        extra = list(args.checks_args)
        if args.budget:
            budget = slurm_conf.parse_duration(args.budget)
            if budget > args.timeout - slurm_conf.CHECKS_START_RESERVE_S:
                raise InputError(f"--budget {args.budget} cannot fit --timeout {args.timeout:g} s "
                                 f"(the checks need {slurm_conf.CHECKS_START_RESERVE_S:g} s to start)")
            extra = ["--budget", args.budget, *extra]
        return _gate(args, extra)
    except (InputError, ImportError, slurm_conf.DeadlineError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SLURM


if __name__ == "__main__":
    sys.exit(main())
