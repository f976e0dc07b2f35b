"""What runs on a node under slurmd: the health check, the Prolog and the Epilog.

The wrapper is not the checked process. It runs `python -m checks` as a child in a session and
process group of its own, which dies with the wrapper (PR_SET_PDEATHSIG), and waits for it at
most the deadline slurm.conf leaves (checks.fleet.slurm_conf). On that deadline it kills the
whole group, keeps a FAIL as last.json and drains the node with a reason naming the timeout.

If the wrapper itself is killed (slurmd's own 60 s kill, the OOM killer, a reboot), nothing in
this run can act any more. Before it starts the checks it writes `running.json` into the state
directory while holding `.lock` (flock, released by the kernel when the process dies). A
`running.json` whose lock nobody holds is the trace of a killed run: the Prolog refuses jobs on
that node (drains it, exit 1) and the next health check drains it, each with a reason saying
the last run was killed. No process is left behind to do this (no detached watchdog).

Any error of the wrapper itself (state directory full or read-only, unreadable state, an
unexpected exception) fails closed: the node is drained with `<prefix>: nodecert-wrapper ...`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from checks import safeio
from checks.fleet.slurm_control import Verdict, one_line, verdict
from checks.report import load
from checks.supervise import procs

RUN_ID = "nodecert-run"  # stands for the check id in the reason when the checks did not finish
WRAPPER_ID = "nodecert-wrapper"  # the check id in the reason when the wrapper itself failed
LAST = "last.json"
RUNNING = "running.json"
PROGRESS = "current-check"  # the id of the check the run started last (checks.node.watchdog)
LOCK = ".lock"
SLURM_ERROR = "slurm-error.json"  # our prolog/epilog exited non-zero without its own drain
DRAINED = "drained.json"  # the verdict this node is drained for by nodecert (note_drain)
TEXTFILE = "nodecert.prom"


class UsageError(Exception):
    """python -m checks refused its options (exit 2): a configuration error, not a node fault."""


class StateError(Exception):
    """The state directory holds something this wrapper cannot read (one line)."""


class Terminated(Exception):
    """The wrapper got SIGTERM (slurmd's kill, or a shutdown) while the checks ran."""


# -- the supervised check run --------------------------------------------------------------------

def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


REAP_S = 2.0  # how long a killed check run may take to end before the verdict goes without it


def _proc_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (D: uninterruptible sleep), '?' when unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


CHECK_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,47}")  # a registry id, as the reason may carry it


def running_check(progress: Path) -> str | None:
    """The check the run had started last (checks.node.watchdog writes its id to the
    NODECERT_PROGRESS file before each check); None when there is none or it is not an id."""
    try:
        with progress.open("rb") as f:
            text = f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None
    return text if CHECK_ID.fullmatch(text) else None


def _hung(progress: Path) -> str:
    check = running_check(progress)
    return f"{RUN_ID} hung in {check}:" if check else RUN_ID


def run_checks(level: str, extra: Sequence[str], timeout_s: float, progress: Path | None = None
               ) -> tuple[Verdict, dict[str, Any] | None]:
    """Run `python -m checks` under the deadline; a run that crashes or hangs is a failure too.
    A hung run's reason names the check it hung in (the progress file, default a temporary).
    Returns the verdict and the report (None when there is none)."""

    with tempfile.TemporaryDirectory(prefix="nodecert-") as tmp:
        path = Path(tmp) / "report.json"
        progress = progress or Path(tmp) / PROGRESS
        with contextlib.suppress(OSError):
            progress.unlink()  # an earlier run's check is not this run's
        cmd = [sys.executable, "-m", "checks", "--level", level, "--json", str(path), "-q", *extra]
        env = {**os.environ, procs.ENV_PROGRESS: str(progress)}
        started: list[subprocess.Popen[str]] = []
        pending = 0  # a signal that came while the checks were being started

        def on_term(signum: int, frame: object) -> None:
            nonlocal pending
            if not started:  # the checks are being started: their group is killed once known
                pending = signum
                return
            for child in started:
                _kill_group(child.pid)
            raise Terminated(f"{RUN_ID} killed by signal {signum} before it finished")

        # Set before the checks start: a SIGTERM at any moment once they exist is this wrapper's,
        # which kills their group and drains (a signal mask would not do: it is per thread, and
        # the kernel may hand the signal to any thread that does not block it).
        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            # its own session, killed by the kernel when this wrapper dies (PR_SET_PDEATHSIG)
            proc = procs.start(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=env)
            started.append(proc)
            if pending:
                on_term(pending, None)
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            try:  # drain first, then reap: a process in the kernel (D state) ignores SIGKILL
                proc.wait(timeout=REAP_S)
            except subprocess.TimeoutExpired:
                return Verdict(True, f"{_hung(progress)} did not finish in {timeout_s:g} s "
                                     f"(timeout: killed, but pid {proc.pid} did not end in "
                                     f"{REAP_S:g} s, state {_proc_state(proc.pid)}: stuck in the "
                                     "kernel; not reaped)"), None
            return Verdict(True, f"{_hung(progress)} did not finish in {timeout_s:g} s (timeout: "
                                 "killed)"), None
        finally:
            signal.signal(signal.SIGTERM, previous)
            for child in started:
                _kill_group(child.pid)  # anything the checks left in their group
        if proc.returncode == 2:
            raise UsageError(f"python -m checks: {one_line(stderr) or 'bad usage'}")
        item = load.read(path) if path.exists() else None
        if item is None or item.report is None:
            why = item.error if item else (one_line(stderr)[-80:] or f"exit {proc.returncode}")
            return Verdict(True, f"{RUN_ID} did not complete: {why}"), None
        return verdict(item.report), item.report


# -- the state directory ------------------------------------------------------------------------

def _write_atomic(path: Path, text: str) -> None:
    """A private temporary in the same directory, fsync, rename: a reader never sees half a file
    and a failure (ENOSPC, EROFS) leaves the old file and no temporary behind. As root, never
    into a directory another user can write (trusted_state)."""
    trusted_state(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def keep_last(state_dir: Path, report: dict[str, Any] | None, result: Verdict) -> None:
    """Replace state_dir/last.json: the report, or a FAIL stand-in saying why there is none."""
    doc: dict[str, Any] = (dict(report) if report is not None else
                           {"verdict": "FAIL", "checks": [], "summary_line": result.summary})
    doc["nodecert_slurm"] = {"failed": result.failed, "summary": result.summary,
                             "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_atomic(state_dir / LAST, json.dumps(doc))


def last_verdict(state_dir: Path) -> Verdict | None:
    """The verdict the health check kept, None when it has not run yet; StateError (or OSError)
    when it cannot be read (the caller fails closed)."""
    path = state_dir / LAST
    if not path.exists():
        return None
    try:
        kept = json.loads(path.read_text())["nodecert_slurm"]
        return Verdict(bool(kept["failed"]), str(kept["summary"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{LAST} unreadable: {one_line(str(exc))}") from None


def trusted_state(state_dir: Path) -> None:
    """As root, a state directory another user can write (or own) is refused (an OSError: the
    wrapper fails closed): a planted last.json or running.json would drain or resume this node,
    and root's writes there could follow their symlinks (safeio.trust_problem)."""
    safeio.refuse_untrusted(state_dir, "the Slurm state directory")


@contextlib.contextmanager
def state_lock(state_dir: Path, wait_s: float, create: bool = True) -> Iterator[bool]:
    """Hold state_dir/.lock (True), or False when another run holds it for longer than wait_s."""
    trusted_state(state_dir)
    if create:
        state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK, (os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY, 0o600)
    try:
        yield safeio.flock_within(fd, wait_s, poll_s=0.1)
    finally:
        os.close(fd)


def start_marker(state_dir: Path, role: str, deadline_s: float) -> None:
    _write_atomic(state_dir / RUNNING, json.dumps({
        "pid": os.getpid(), "role": role, "started": time.time(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "deadline_s": deadline_s}))


def clear_marker(state_dir: Path) -> None:
    for name in (RUNNING, PROGRESS):
        with contextlib.suppress(FileNotFoundError):
            (state_dir / name).unlink()


def stale_marker(state_dir: Path) -> dict[str, Any] | None:
    """The marker of a run that was killed: present while nobody holds the lock. Call with the
    lock held, or through killed_run()."""
    path = state_dir / RUNNING
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else {"at": "?", "role": "?"}
    except ValueError:
        return {"at": "?", "role": "?"}


def killed_verdict(marker: dict[str, Any], state_dir: Path | None = None) -> Verdict:
    """A killed run's verdict, naming the check it was in when the state directory kept it."""
    check = running_check(state_dir / PROGRESS) if state_dir is not None else None
    where = f" in {check}" if check else ""
    # the check before the start time: a reason cut at REASON_MAX loses the time first
    return Verdict(True, f"{RUN_ID} ({marker.get('role', '?')}) was killed{where} before it "
                         f"finished (started {marker.get('at', '?')})")


def killed_run(state_dir: Path) -> Verdict | None:
    """For the Prolog: a FAIL when the last health check was killed, None otherwise (also while
    one is still running: its lock is held, and the kept verdict stands until it ends)."""
    trusted_state(state_dir)
    if not (state_dir / RUNNING).exists():
        return None
    if not (state_dir / LOCK).exists():
        marker = stale_marker(state_dir)
        return killed_verdict(marker, state_dir) if marker else None
    with state_lock(state_dir, 0, create=False) as got:
        if not got:
            return None
        marker = stale_marker(state_dir)
        return killed_verdict(marker, state_dir) if marker else None


def note_slurm_error(state_dir: Path, role: str, why: str) -> None:
    """Best effort: our Prolog/Epilog exits non-zero without having drained the node itself, so
    Slurm drains it with "Prolog error"/"Epilog error"; this note lets a later pass resume it."""
    with contextlib.suppress(OSError):
        state_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(state_dir / SLURM_ERROR, json.dumps({
            "role": role, "why": why, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))


def caused_slurm_error(state_dir: Path) -> bool:
    return (state_dir / SLURM_ERROR).exists()


def forget_slurm_error(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / SLURM_ERROR).unlink()


def note_drain(state_dir: Path, summary: str) -> None:
    """Best effort: the node is drained by nodecert for this verdict. When it is found in
    service again with the same verdict kept, someone resumed it on purpose (an administrator's
    RESUME ends nodecert's hold), and the Prolog does not drain it again for that old verdict."""
    with contextlib.suppress(OSError):
        _write_atomic(state_dir / DRAINED, json.dumps({
            "summary": summary, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))


def drained_for(state_dir: Path) -> str | None:
    """The verdict summary note_drain kept, None when there is none or it cannot be read."""
    try:
        doc = json.loads((state_dir / DRAINED).read_text())
    except (OSError, ValueError):
        return None
    return str(doc["summary"]) if isinstance(doc, dict) and "summary" in doc else None


def forget_drain(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / DRAINED).unlink()


def describe_error(exc: BaseException) -> str:
    """One line for a wrapper error, naming the errno (ENOSPC, EROFS ...) when there is one."""
    if isinstance(exc, OSError) and exc.errno is not None and exc.errno in errno.errorcode:
        where = f" {exc.filename}" if exc.filename else ""
        return f"{errno.errorcode[exc.errno]} {exc.strerror}{where}"
    if isinstance(exc, StateError):
        return one_line(str(exc))
    return f"{type(exc).__name__}: {one_line(str(exc))}"


# -- the node_exporter textfile ---------------------------------------------------------------

INTERVAL_METRIC = "nodecert_run_interval_seconds"
CONFIG_METRIC = "nodecert_config_failure"
# what a run with no report rewrites; every other series of the last report is carried over
REWRITTEN = ("nodecert_host_healthy", "nodecert_last_run_timestamp_seconds", INTERVAL_METRIC,
             CONFIG_METRIC)
CARRY_MAX = 8 << 20  # bytes of an earlier textfile read back (a node's is a few hundred kB)


def _family(line: str) -> str:
    """The metric family a line of the text format belongs to ('# HELP name ...', samples)."""
    if line.startswith(("# HELP ", "# TYPE ")):
        return line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
    return line.split("{", 1)[0].split(" ", 1)[0]


def _carried(path: Path) -> str:
    """The earlier textfile's series but those a run with no report rewrites ('' when none)."""
    try:
        with path.open("rb") as f:
            data = f.read(CARRY_MAX + 1)
    except OSError:
        return ""
    if len(data) > CARRY_MAX:
        return ""
    lines = data.decode("utf-8", "replace").splitlines()
    kept = [line for line in lines if line.strip() and _family(line) not in REWRITTEN]
    return "".join(f"{line}\n" for line in kept)


def _gauge(name: str, help_text: str, labels: dict[str, str], value: float) -> str:
    def quoted(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    pairs = ",".join(f'{key}="{quoted(val)}"' for key, val in labels.items())
    return f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name}{{{pairs}}} {value!r}\n"


def publish(textfile_dir: Path, node: str, level: str, report: dict[str, Any] | None,
            interval_s: float | None = None, config_failure: bool = False) -> None:
    """DIR/nodecert.prom, replaced atomically: the report through the project's renderer, or,
    when the run left none (hang, crash), the host marked unhealthy with this run's time so no
    old PASS stays, and every other series of the last report carried over (a check whose FAIL
    alerts keeps alerting while the runs after it hang). With `interval_s` (how often the runs
    are scheduled: HealthCheckInterval) also nodecert_run_interval_seconds, which the staleness
    alert compares the last run's time with."""
    from prometheus_client import CollectorRegistry, generate_latest

    from checks import safeio
    from checks.render import prometheus

    path = textfile_dir / TEXTFILE
    if report is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(prometheus.ReportCollector([report]))
        text = generate_latest(registry).decode()
        host = str(report.get("host") or node)
    else:
        host = node
        text = (_carried(path)
                + _gauge(f"{prometheus.PREFIX}_host_healthy",
                         "1 when every check passed (PASS, WARN or SKIP), else 0.",
                         {"host": node, "level": level, "profile": ""}, 0.0)
                + _gauge(f"{prometheus.PREFIX}_last_run_timestamp_seconds",
                         "When the last nodecert run on this host finished (Unix time).",
                         {"host": node}, time.time()))
    # 0 on every run, 1 when nodecert's own configuration failed (refused options); the
    # wrapper's shell writes 1 itself when no Python runs at all (slurm.FAIL_CLOSED)
    text += _gauge(CONFIG_METRIC, "1 when nodecert itself failed on this host (refused options, "
                   "missing interpreter, broken package), not the node.", {"host": host},
                   1.0 if config_failure else 0.0)
    if interval_s is not None:
        text += _gauge(INTERVAL_METRIC, "How often nodecert runs on this host are scheduled "
                       "(seconds; Slurm's HealthCheckInterval).", {"host": host}, float(interval_s))
    textfile_dir.mkdir(parents=True, exist_ok=True)
    # 0644: node_exporter reads the textfile directory as its own, unprivileged user.
    safeio.write_bytes(path, text.encode(), mode=0o644)
