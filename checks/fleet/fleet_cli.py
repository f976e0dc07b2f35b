"""`python -m checks.fleet report DIR`: aggregate one run's host reports into the fleet report.

    python -m checks.fleet report reports/2025-06-01T10-00 --inventory inventory \\
        --html reports/2025-06-01T10-00/fleet.html --prometheus-dir /var/lib/node_exporter

Exit codes: 0 every host PASS or WARN, 1 any host FAIL/ERROR/MISSING (a FAIL finding included:
straggler, drift, digest mismatch, lemon), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from checks import cliutil, report_schema, safeio
from checks.fleet import ansible_inventory as inventory
from checks.fleet import crosshost_plan as crosshost
from checks.fleet import drift, history
from checks.fleet import fleet_junit as junit
from checks.fleet import fleet_terminal as terminal
from checks.report import aggregate, load
from checks.report import load as loader
from checks.report import summary as summary_
from checks.report.aggregate import Fleet
from checks.supervise import pool

EXIT_USAGE = 2


class UsageError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m checks.fleet",
        description="Fleet report over the per-host JSON reports of one verify run.",
        epilog="Exit status: 0 all hosts PASS/WARN, 1 any host FAIL, ERROR (unreadable report) or "
               "MISSING, 2 bad usage. Repair the run history (forget or quarantine a run): "
               "python -m checks.fleet history --help. Docs: docs/fleet.md.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    r = sub.add_parser("report", help="aggregate reports/<run-id>/*.json",
                       description="Aggregate reports/<run-id>/<host>.json: who failed what, "
                                   "stragglers against the fleet median, GPUs drifting below "
                                   "their own history, reference digests that differ from their "
                                   "group's, lemons from the history.")
    r.add_argument("directory", metavar="DIR", help="directory of <host>.json reports of one run")
    expect = r.add_mutually_exclusive_group()
    expect.add_argument("--expect-hosts", action="append", metavar="H1,H2",
                        help="hosts that must have a report (comma-separated, repeatable)")
    expect.add_argument("--inventory", metavar="FILE",
                        help="Ansible inventory whose hosts must have a report (read with "
                             "ansible-inventory)")
    r.add_argument("--host-errors", metavar="FILE",
                   help='JSON object {"host": "reason"} for hosts without a report, e.g. '
                        '"unreachable", "checks crashed: exit 137"')
    r.add_argument("--run-id", metavar="ID", help="run id (default: the reports' run_id, else DIR's name)")
    r.add_argument("--json", type=cliutil.output_file, metavar="FILE",
                   help="write the fleet summary (schema/fleet.schema.json)")
    r.add_argument("--html", type=cliutil.output_file, metavar="FILE",
                   help="write the self-contained HTML report")
    r.add_argument("--junit", type=cliutil.output_file, metavar="FILE",
                   help="write JUnit XML (a test suite per host)")
    r.add_argument("--prometheus-dir", metavar="DIR",
                   help="write nodecert-fleet.prom, the bounded fleet summary (a node_exporter "
                        "textfile); each node publishes its own metrics with python -m checks "
                        "--prometheus FILE")
    r.add_argument("--prometheus-host-files", action="store_true",
                   help="also write nodecert-<host>.prom per host into --prometheus-dir (the old "
                        "layout: one scrape carries every host's series; small fleets only)")
    r.add_argument("--history", metavar="DB",
                   help="SQLite run history to append to and find lemons in "
                        "(default: history.sqlite beside DIR, i.e. reports/history.sqlite)")
    r.add_argument("--no-history", action="store_true", help="neither record nor query the history")
    r.add_argument("--lemon-failures", type=int, default=history.DEFAULT_FAILURES, metavar="N",
                   help="a GPU failing in N of the last M runs is a lemon "
                        f"(default {history.DEFAULT_FAILURES})")
    r.add_argument("--lemon-runs", type=int, default=history.DEFAULT_RUNS, metavar="M",
                   help=f"runs looked back over for lemons (default {history.DEFAULT_RUNS})")
    r.add_argument("--jobs", type=int, metavar="N",
                   help="processes that read and validate the reports (this one and N-1 forked) and "
                        "build the JUnit file's suites (default: one per 64 reports, at most the usable "
                        "CPUs and 16; 1: this process only); the output is the same whatever N")
    r.add_argument("-v", "--verbose", action="store_true", help="list every host, passing ones too")
    r.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
    r.add_argument("--format", choices=("table", "compact"), default="table",
                   help="terminal summary: tables (default), or compact: one line per host and check "
                        "not passed, for logs")
    return p


def _names(values: list[str] | None) -> list[str]:
    return [n.strip() for v in values or [] for n in v.split(",") if n.strip()]


def _host_errors(path: str | None) -> dict[str, str]:
    if not path:
        return {}
    try:
        data = load.parse_json(load.read_regular(Path(path)))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--host-errors {path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise UsageError(f"--host-errors {path}: expected a JSON object of host → reason strings")
    _check_names(data, f"--host-errors {path}")
    # one line each (a reason becomes a drain reason), no raw control for any renderer
    return {host: loader.clean(" ".join(reason.split())) for host, reason in data.items()}


def _check_names(names: Sequence[str] | dict[str, str], where: str) -> None:
    """Host names from the operator must be node names too: each becomes a file name and a Slurm
    node name."""
    for name in names:
        problem = report_schema.host_problem(name)
        if problem:
            raise UsageError(f"{where}: {problem}")


def _expected(args: argparse.Namespace) -> list[str] | None:
    if args.inventory:
        try:
            names = inventory.hosts(args.inventory)
        except inventory.InventoryError as exc:
            raise UsageError(str(exc)) from None
        _check_names(names, f"inventory {args.inventory}")
        return names
    names = _names(args.expect_hosts)
    _check_names(names, "--expect-hosts")
    return names or None


def _outside(found: list[loader.HostReport], expected: list[str] | None,
             errors: dict[str, str]) -> tuple[list[loader.HostReport], list[str]]:
    """With an inventory, a report from a host it does not list is no fleet member: set aside and
    named, never counted (a stray or planted file would otherwise pass or fail the fleet).
    --expect-hosts names the hosts that must report, not all the fleet: no filter."""
    if expected is None:
        return found, []
    members = {*expected, *errors}
    return ([f for f in found if f.host in members],
            sorted(f.host for f in found if f.host not in members))


def _render_crosshost(cross: crosshost.Analysis, console: Console) -> None:
    bad = [g for g in cross.groups if not g.ok]
    console.print(f"cross-host ({cross.mode}): {len(cross.groups) - len(bad)}/{len(cross.groups)} "
                  "groups passed", highlight=False)
    for g in bad:
        console.print(f"  {g.id} [{', '.join(g.hosts)}]: culprit {', '.join(g.culprits) or '?'}: "
                      f"{g.reason}", highlight=False, markup=False)
    if cross.suspects:
        console.print(f"  suspect host(s): {', '.join(cross.suspects)}", highlight=False)
    for link in cross.bad_links:
        console.print(f"  bad link: {' <-> '.join(link)}", highlight=False)


def _checked_something(found: list[loader.HostReport]) -> list[loader.HostReport]:
    """A report that holds no checks verified nothing: its host is an ERROR, never a PASS."""
    return [loader.HostReport(f.host, None, "report holds no checks: nothing was verified", f.path)
            if f.report is not None and not summary_.holds_checks(f.report) else f for f in found]


def _aggregate(found: list[loader.HostReport], directory: Path, expected: list[str] | None,
               errors: dict[str, str], run_id: str | None) -> Fleet:
    fleet = aggregate.aggregate(found, expected_hosts=expected, host_errors=errors, run_id=run_id,
                                source=str(directory))
    if fleet.run_id is None:
        fleet.run_id = directory.name
    return fleet


def _with_history(fleet: Fleet, store: history.History, found: list[loader.HostReport],
                  directory: Path, expected: list[str] | None, errors: dict[str, str],
                  args: argparse.Namespace, workers: pool.Pool) -> Fleet:
    """Key the run by what it holds (history.run_key); a host whose report was already counted in
    an earlier run, or (without an inventory) that reported in one of the last --lemon-runs runs
    and not now, has no fresh report: MISSING, with the run it last reported in. Then drift,
    record, lemons."""
    key, as_read = store.run_key(fleet), fleet
    gone = {h: f"no fresh report: its report was already counted in run {run}"
            for h, run in store.stale_reports(fleet, key).items()}
    if expected is None:
        present = {h.host for h in fleet.hosts}
        gone.update({h: f"no report since run {run}"
                     for h, run in store.recent_hosts(args.lemon_runs, before=key).items()
                     if h not in present})
    if gone:
        hostnames = {h.host: h.hostname for h in fleet.hosts}
        fleet = _aggregate([f for f in found if f.host not in gone], directory,
                           [*(expected or ()), *gone], {**gone, **errors}, fleet.run_id)
        for entry in fleet.hosts:
            entry.hostname = entry.hostname or hostnames.get(entry.host)
    last = store.last_reports(h.host for h in fleet.hosts if h.report is None)
    for entry in fleet.hosts:
        if entry.report is None:
            entry.report_finished_at = last.get(entry.host)
    fleet.history_run = key
    try:
        fleet.set_drift(drift.find(fleet, store, run_id=key))
    except drift.DriftConfigError as exc:
        raise UsageError(str(exc)) from None
    store.record(fleet, key, reports_of=as_read, map_=workers.map)  # the rows built in the pool
    fleet.set_lemons(store.lemons(args.lemon_failures, args.lemon_runs))
    return fleet


def _write_outputs(fleet: Fleet, args: argparse.Namespace, outside: list[str] | None,
                   workers: pool.Pool) -> list[Path]:
    outputs = []
    if args.json:  # written host by host, as the JUnit file
        extra = {} if outside is None else {"outside_inventory": outside}  # an inventory was given
        outputs.append(safeio.write_bytes(args.json, (c.encode() for c in fleet.json_chunks(extra))))
    if args.html:
        from checks.render import html

        outputs.append(html.write_fleet(fleet, args.html))
    if args.junit:  # the hosts' suites built in the pool too, written in order
        outputs.append(junit.write(fleet, args.junit, workers.map))
    if args.prometheus_dir:
        from checks.render import prometheus

        outputs.extend(prometheus.write_fleet(fleet, args.prometheus_dir,
                                              host_files=args.prometheus_host_files))
    return outputs


def report(args: argparse.Namespace, console: Console, err: Console) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    # as root, never read (nor merge the cross-host stage into) reports another user could plant
    safeio.refuse_untrusted(directory, "the reports directory")
    if args.lemon_failures < 1 or args.lemon_runs < args.lemon_failures:
        raise UsageError("need 1 <= --lemon-failures <= --lemon-runs")
    if args.prometheus_host_files and not args.prometheus_dir:
        raise UsageError("--prometheus-host-files needs --prometheus-dir")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give 1 or more processes")
    expected, errors = _expected(args), _host_errors(args.host_errors)
    # processes for the reading (forked for it) and the JUnit suites (forked now, while this one is small)
    with pool.Pool(pool.processes(sum(1 for _ in directory.glob("*.json")), args.jobs)) as workers:
        return _report(args, console, err, directory, expected, errors, workers)


def _report(args: argparse.Namespace, console: Console, err: Console, directory: Path,
            expected: list[str] | None, errors: dict[str, str], workers: pool.Pool) -> int:
    cross = crosshost.merge(directory)
    with loader.gc_paused():
        found, outside = _outside(_checked_something(aggregate.read(directory, workers.read_map)),
                                  expected if args.inventory else None, errors)
    if outside:
        err.print(f"warning: {len(outside)} report(s) from hosts outside the inventory, not counted: "
                  f"{', '.join(outside)}", highlight=False, markup=False, soft_wrap=True)
    fleet: Fleet = _aggregate(found, directory, expected, errors, args.run_id)
    if not fleet.hosts:
        raise UsageError(f"no host reports (*.json) in {directory} and no expected hosts")
    if not args.no_history:
        db = Path(args.history) if args.history else directory.resolve().parent / "history.sqlite"
        with history.History(db) as store:
            fleet = _with_history(fleet, store, found, directory, expected, errors, args, workers)
            events = store.config_events(args.lemon_runs)
        for run, check, failed, gpus in [] if args.quiet else events:
            err.print(f"note: run {run}: {check} failed on {failed} of {gpus} GPUs: a configuration "
                      "event (at least half the fleet's GPUs), not counted toward lemons "
                      "(python -m checks.fleet history list)", highlight=False, markup=False,
                      soft_wrap=True)
    outputs = _write_outputs(fleet, args, outside if args.inventory else None, workers)
    if not args.quiet:
        if args.format == "compact":
            terminal.render_compact(fleet, console)
        else:
            terminal.render(fleet, console, verbose=args.verbose)
        if cross is not None:
            _render_crosshost(cross, console)
        for path in outputs if len(outputs) < 8 else []:
            err.print(f"wrote {path}", highlight=False, soft_wrap=True)
        if len(outputs) >= 8:
            err.print(f"wrote {len(outputs)} files", highlight=False)
    return fleet.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    console = Console(emoji=False, highlight=False)
    err = Console(stderr=True, emoji=False, highlight=False)
    try:
        return report(args, console, err)
    except (UsageError, ImportError, safeio.UnsafePath) as exc:
        err.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_USAGE
    except sqlite3.Error as exc:  # --history names a file sqlite cannot open or is not a database
        err.print(f"error: history database {args.history or ''}: {exc}".replace(" :", ":"),
                  highlight=False, markup=False, soft_wrap=True)
        return EXIT_USAGE
    except OSError as exc:
        err.print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
                  highlight=False, markup=False, soft_wrap=True)
        return EXIT_USAGE
    except pool.WorkerDied as exc:  # no verdict: a reading process was killed (the OOM killer)
        err.print(f"error: {exc}", highlight=False, markup=False, soft_wrap=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        err.print("interrupted", highlight=False)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
