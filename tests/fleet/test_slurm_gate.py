"""The wrappers under a real slurmd: deadlines, a stopped or killed check, a broken state
directory, the Prolog and the Epilog (tests/fleet/slurmcluster.py: munged, slurmctld, slurmd).

slurm.conf names one HealthCheckProgram/Prolog/Epilog per cluster; here each is a two-line shim
that execs the wrapper `python -m checks.fleet.slurm scripts` wrote into the node's own
directory (and does nothing while there is none), so that each test wires its own wrappers
into the one cluster the module starts. What slurmd runs is the generated wrapper itself."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.fleet import slurm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurmcluster import SlurmCluster, need_cluster, role_shims

NODES = ("hc1", "hc2", "hc3")
SCENARIOS = Path(slurm.__file__).resolve().parents[1] / "scenarios"
ROLES = {"HealthCheckProgram": "nodecert-healthcheck", "Prolog": "nodecert-prolog",
         "Epilog": "nodecert-epilog"}


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def mounts(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """A read-only state directory and a 16 KiB one (a report is ~70 KB), mounted before slurmd
    starts: each node's mount namespace is a private copy taken then."""
    need_cluster()
    base = tmp_path_factory.mktemp("mounts")
    ro, full = base / "readonly", base / "full"
    ro.mkdir()
    full.mkdir()
    _mount("--bind", str(ro), str(ro))
    _mount("-o", "remount,bind,ro", str(ro))
    _mount("-t", "tmpfs", "-o", "size=16k,mode=0755", "tmpfs", str(full))
    try:
        yield {"readonly": ro, "full": full}
    finally:
        for path in (ro, full):
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, mounts) -> Iterator[SlurmCluster]:
    base = tmp_path_factory.mktemp("gate")
    conf = {"HealthCheckInterval": "2", "HealthCheckNodeState": "ANY",
            "SchedulerParameters": "nohold_on_prolog_fail"}
    role_shims(base, ROLES, conf)
    with SlurmCluster(base / "cluster", nodes=NODES, extra_conf=conf) as c:
        c.wrappers = base / "nodes"  # type: ignore[attr-defined]
        yield c


def _use(index: int):  # type: ignore[no-untyped-def]
    """A fixture for one idle node with no wrappers; they are removed again afterwards, and the
    test's jobs cancelled."""

    @pytest.fixture()
    def node(cluster) -> Iterator[str]:
        name = NODES[index]
        yield name
        for wrapper in ROLES.values():
            with contextlib.suppress(FileNotFoundError):
                (cluster.wrappers / name / wrapper).unlink()
        subprocess.run(["scancel", "-u", "root"], env=cluster.env(), check=False,
                       capture_output=True)
        # a health check slurmd started before its wrapper was removed may still drain the node:
        # wait for every wrapper run to end, then reset (else the next test inherits its drain)
        deadline = time.monotonic() + 120
        while _pids("checks.fleet.slurm") and time.monotonic() < deadline:
            time.sleep(0.2)
        cluster.reset()

    return node


node0, node1, node2 = _use(0), _use(1), _use(2)


def _scripts(cluster: SlurmCluster, node: str, state: Path, *args: str, env: dict | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "scripts",
                           str(cluster.wrappers / node), "--state-dir", str(state), *args],
                          env=env or cluster.env(), capture_output=True, text=True, timeout=120)


def _only(cluster: SlurmCluster, node: str, *keep: str) -> None:
    """Leave only these wrappers on the node (again on a retry: the others may be gone already)."""
    for wrapper in set(ROLES.values()) - set(keep):
        (cluster.wrappers / node / wrapper).unlink(missing_ok=True)


def _health_check_here(cluster: SlurmCluster, node: str, state: Path, scenario: str,
                       *extra: str) -> int:
    """One health check run by hand on `node` (dry run unless --apply in extra)."""
    env = {**cluster.env(), "SLURMD_NODENAME": node}
    return subprocess.run([sys.executable, "-m", "checks.fleet.slurm", "health-check", *extra,
                           "--state-dir", str(state), "--", "--simulate", scenario], env=env,
                          capture_output=True, timeout=180, check=False).returncode


def _pids(*needles: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(n.encode() in cmdline for n in needles):
            found.append(int(entry.name))
    return found


def _wait_for_pid(*needles: str, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _pids(*needles)
        # the top of the run: `python -m checks` forks a worker with the same command line
        top = [pid for pid in pids if _ppid(pid) not in pids]
        if top:
            return top[0]
        time.sleep(0.02)
    raise AssertionError(f"no process with {needles} appeared")


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def _parent(pid: int) -> int:
    """The wrapper that started this check: its parent, which must be a health-check run."""
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    cmdline = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    assert b"checks.fleet.slurm" in cmdline and b"health-check" in cmdline, cmdline
    return ppid


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def _stopped_check(cluster: SlurmCluster, node: str, state: Path, scenario: Path) -> tuple[int, int]:
    """slurmd runs the generated health-check wrapper on `node`; its check is found and stopped
    (SIGSTOP): (the check's pid, the wrapper's pid)."""
    assert _scripts(cluster, node, state, "--timeout", "30", "--", "--simulate",
                    str(scenario)).returncode == 0
    _only(cluster, node, "nodecert-healthcheck")
    check = _wait_for_pid("checks", "--simulate", str(scenario))
    wrapper = _parent(check)
    os.kill(check, signal.SIGSTOP)
    return check, wrapper


def _scenario(tmp_path: Path, name: str) -> Path:
    """A scenario under a path unique to this test: it names this test's check processes."""
    link = tmp_path / "node-state.yaml"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    link.symlink_to(SCENARIOS / f"{name}.yaml")
    return link


def test_scripts_derive_the_deadline_from_slurm_conf_and_refuse_what_cannot_fit(
        cluster, node0, tmp_path) -> None:
    node = node0
    state = tmp_path / "state"
    done = _scripts(cluster, node, state)
    assert done.returncode == 0, done.stderr
    text = (cluster.wrappers / node / "nodecert-healthcheck").read_text()
    # slurmd's 60 s, less 5 s start-up and two Slurm calls of MessageTimeout=10 each.
    assert "--timeout 35 --slurm-timeout 10" in text
    assert "checks 35 s (HealthCheckProgram limit 60 s)" in done.stdout
    for args, needle in ((["--timeout", "120"], "--timeout 120 s cannot fit: slurmd kills"),
                         (["--timeout", "40"], "at most 35 s"),
                         (["--budget", "90s"], "--budget 90 s cannot fit"),
                         (["--timeout", "20", "--budget", "16s"], "at most 15 s")):
        refused = _scripts(cluster, node, state, *args)
        assert refused.returncode == 2, (args, refused.stdout)
        assert refused.stderr.count("\n") == 1 and needle in refused.stderr, refused.stderr


def test_a_stopped_check_is_killed_and_the_node_drained_by_its_watchdog(
        cluster, node0, tmp_path) -> None:
    """slurmd runs the health check; the test SIGSTOPs the check process. The wrapper (not the
    checked process) kills the check's group at its deadline and drains with the timeout."""
    node = node0
    state = tmp_path / "state"
    scenario = _scenario(tmp_path, "h100-sxm-8x-healthy")
    assert _health_check_here(cluster, node, state, str(scenario)) == 0  # a PASS is kept
    assert not slurm.last_verdict(state).failed
    textfiles = tmp_path / "textfiles"
    assert _scripts(cluster, node, state, "--timeout", "10", "--textfile-dir", str(textfiles),
                    "--", "--simulate", str(scenario)).returncode == 0
    # the run above left its last check's id: this run's own must be waited for, not that one
    progress = state / "current-check"
    for _attempt in range(5):
        progress.unlink(missing_ok=True)
        _only(cluster, node, "nodecert-healthcheck")
        check = _wait_for_pid("checks", "--simulate", str(scenario))
        # the whole run stops once it has started a check: its worker first, then the top process
        cluster.wait_for(progress.exists, 30, "the run to start a check")
        workers = [pid for pid in _pids("checks", "--simulate", str(scenario)) if pid != check]
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):  # a worker may end between list and kill
                os.kill(worker, signal.SIGSTOP)
        try:
            os.kill(check, signal.SIGSTOP)
            break
        except ProcessLookupError:
            # the simulated run (well under a second) finished between its first check and the
            # stop: let its stopped workers go, wait for that health check to end, start another
            for worker in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, signal.SIGCONT)
            cluster.wait_for(lambda: not _pids("checks", "--simulate", str(scenario)), 30, "the run's end")
    else:
        pytest.fail("five health-check runs each ended before the check could be stopped")
    hung_in = progress.read_text().strip()
    # No later run: slurmd starts the next health check 2 s after this one ends, and its PASS
    # (the scenario is healthy) would resume the node and rewrite the textfile before the test
    # reads them (seen under load). The run already started has its wrapper loaded.
    _only(cluster, node)
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 90, "the drain")
    reason = cluster.node_state(node)[1]
    assert reason == (f"NODECERT: nodecert-run hung in {hung_in}: did not finish in 10 s "
                      "(timeout: killed)"), reason
    kept = slurm.last_verdict(state)
    assert kept.failed and "did not finish in 10 s" in kept.summary  # no stale PASS
    assert _gone(check)
    from promtools import samples  # a run with no report publishes the host unhealthy

    published = samples((textfiles / "nodecert.prom").read_text())
    assert ("nodecert_host_healthy", frozenset({("host", node), ("level", "quick"),
                                                ("profile", "")}), 0.0) in published


def test_a_killed_wrapper_leaves_no_check_and_its_trace_drains(cluster, node1, tmp_path) -> None:
    """The wrapper itself is killed (SIGKILL, as slurmd's own kill ends it): the check dies with
    it, the Prolog no longer trusts the kept PASS, and the next health check drains."""
    node = node1
    state = tmp_path / "state"
    scenario = _scenario(tmp_path, "h100-sxm-8x-healthy")
    assert _health_check_here(cluster, node, state, str(scenario)) == 0
    check, wrapper = _stopped_check(cluster, node, state, scenario)
    os.kill(wrapper, signal.SIGKILL)
    cluster.wait_for(lambda: _gone(check), 30, "the check to die with its wrapper")
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 90, "the drain")
    # the wrapper's shell drains at once; the next health check names the killed run's start
    reason = cluster.node_state(node)[1]
    assert reason == "NODECERT: nodecert-run (health-check) killed by signal 9 before it finished" or (
        reason.startswith("NODECERT: nodecert-run (health-check) was killed ")), reason
    cluster.wait_for(lambda: re.match(r"NODECERT: nodecert-run \(health-check\) was killed "
                                      r"(in [a-z0-9-]+ )?before it finished \(started ",
                                      cluster.node_state(node)[1]) is not None
                     or cluster.node_state(node) == ("idle", ""), 90, "the killed run's trace")
    # The next passing run resumes the node it drained.
    cluster.wait_for(lambda: cluster.node_state(node) == ("idle", ""), 120, "the resume")


def test_a_terminated_wrapper_kills_its_check_and_drains(cluster, node1, tmp_path) -> None:
    """SIGTERM to the wrapper (how slurmd starts its kill, or a shutdown): the check's group is
    killed, the failure kept, the node drained saying so."""
    node = node1
    state = tmp_path / "state"
    scenario = _scenario(tmp_path, "h100-sxm-8x-healthy")
    check, wrapper = _stopped_check(cluster, node, state, scenario)
    os.kill(wrapper, signal.SIGTERM)
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")
    reason = cluster.node_state(node)[1]
    assert reason == ("NODECERT: nodecert-wrapper health-check: Terminated: nodecert-run killed "
                      "by signal 15 before it finished"), reason
    assert _gone(check)
    assert slurm.last_verdict(state).failed
    assert not (state / "running.json").exists()  # it was not killed: no trace of a killed run


def test_the_prolog_refuses_a_node_whose_health_check_was_killed(cluster, node1, tmp_path) -> None:
    node = node1
    state = tmp_path / "state"
    assert _health_check_here(cluster, node, state, "h100-sxm-8x-healthy") == 0
    (state / "running.json").write_text(json.dumps({"pid": 1, "role": "health-check",
                                                    "at": "2026-12-01T10:00:00+0000"}))
    verdict = slurm.prolog_verdict(state)
    assert verdict.failed and "was killed before it finished" in verdict.summary


@pytest.mark.parametrize(("which", "needle"), [("readonly", "EROFS Read-only file system"),
                                               ("full", "ENOSPC No space left on device")])
def test_a_broken_state_directory_fails_closed(cluster, mounts, node2, which, needle) -> None:
    """The state directory is read-only, or full: slurmd's health check drains the node with a
    NODECERT reason naming the error (the checks' fault would otherwise go unseen)."""
    node = node2
    state = mounts[which] / node
    if which == "full":
        state.mkdir(exist_ok=True)
    assert _scripts(cluster, node, state, "--timeout", "30", "--", "--simulate",
                    "fault-xid-79").returncode == 0
    _only(cluster, node, "nodecert-healthcheck")
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 120, "the drain")
    reason = cluster.node_state(node)[1]
    assert reason.startswith("NODECERT: nodecert-wrapper health-check: "), reason
    assert needle in reason, reason
    assert not [p for p in Path(state if state.exists() else mounts[which]).iterdir()
                if p.name.startswith(".last.json")]  # no temporary left behind


def test_an_unreadable_kept_verdict_makes_the_prolog_refuse(cluster, node2, tmp_path) -> None:
    node = node2
    state = tmp_path / "state"
    state.mkdir()
    (state / "last.json").write_text("{truncated")
    assert _scripts(cluster, node, state).returncode == 0
    _only(cluster, node, "nodecert-prolog")
    job = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "true").strip()
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")
    reason = cluster.node_state(node)[1]
    assert reason.startswith("NODECERT: nodecert-wrapper prolog: "), reason
    assert "last.json unreadable" in reason
    _requeued_not_held(cluster, job)


def _requeued_not_held(cluster: SlurmCluster, job: str) -> None:
    # slurmctld counts the restart while the refused job is still COMPLETING on the node; where
    # the requeue leaves it (pending or held) shows only once that is over.
    def requeued() -> bool:
        out = cluster.run("scontrol", "show", "job", job, "-o")
        return "Restarts=1" in out and "JobState=COMPLETING" not in out
    cluster.wait_for(requeued, 60, f"job {job} to be requeued")
    out = cluster.run("scontrol", "show", "job", job, "-o")
    assert "JobState=PENDING" in out and "held" not in out.lower(), out


def test_the_prolog_drains_with_nodecerts_reason_and_the_job_is_requeued(
        cluster, node0, tmp_path) -> None:
    node = node0
    state = tmp_path / "state"
    assert _health_check_here(cluster, node, state, "fault-ecc-uncorrectable") == 1  # dry run
    out = tmp_path / "ran"
    assert _scripts(cluster, node, state).returncode == 0
    _only(cluster, node, "nodecert-prolog")
    job = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                      f"touch {out}").strip()
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")
    reason = cluster.node_state(node)[1]
    assert reason.startswith("NODECERT: GPU002 ecc-errors"), reason  # never "Prolog error"
    _requeued_not_held(cluster, job)
    assert not out.exists()
    # Repaired: the health check passes and resumes the node nodecert drained.
    assert _health_check_here(cluster, node, state, "h100-sxm-8x-healthy", "--apply") == 0
    assert cluster.node_state(node)[0] in ("idle", "allocated", "mixed", "completing")


def test_a_prolog_error_caused_by_our_wrapper_is_resumed_when_the_node_passes(
        cluster, node0, tmp_path) -> None:
    """Our Prolog cannot reach slurmctld (a wrong SLURM_CONF): it exits non-zero and Slurm
    drains with its own "Prolog error". nodecert noted that it caused it, and resumes it."""
    node = node0
    state = tmp_path / "state"
    assert _health_check_here(cluster, node, state, "fault-ecc-uncorrectable") == 1
    broken = {**cluster.env(), "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    assert _scripts(cluster, node, state, env=broken).returncode == 0
    _only(cluster, node, "nodecert-prolog")
    cluster.run("sbatch", "-w", node, "-o", "/dev/null", "--wrap", "true")
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")
    assert cluster.node_state(node)[1].startswith("Prolog error")
    assert (state / "slurm-error.json").exists()
    subprocess.run(["scancel", "-w", node], env=cluster.env(), check=False)
    assert _health_check_here(cluster, node, state, "h100-sxm-8x-healthy", "--apply") == 0
    assert "drain" not in cluster.node_state(node)[0]
    assert not (state / "slurm-error.json").exists()


@pytest.mark.parametrize(("scenario", "drained"), [
    # refused options are nodecert's configuration failing: the wrapper drains, saying so
    ("no-such-scenario", "NODECERT: nodecert-config epilog exited 2: nodecert's configuration "
                         "failed, not the node"),
    ("fault-xid-79", "NODECERT: GPU005 xid-events")])
def test_the_epilog_drains_with_its_own_reason_and_a_usage_error_fails_closed(
        cluster, node1, tmp_path, scenario, drained) -> None:
    node = node1
    state = tmp_path / "state"
    assert _scripts(cluster, node, state, "--", "--simulate", scenario).returncode == 0
    _only(cluster, node, "nodecert-epilog")
    job = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "true").strip()

    def epilog_done() -> bool:
        out = cluster.run("scontrol", "show", "job", job, "-o", check=False)
        return "JobState=COMPLETED" in out and "completing" not in cluster.node_state(node)[0]

    cluster.wait_for(epilog_done, 120, "the job and its epilog")
    cluster.wait_for(lambda: (state / ".lock").exists() and not (state / "running.json").exists(),
                     120, "the epilog to have run")
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")
    assert cluster.node_state(node)[1].startswith(drained), cluster.node_state(node)  # not "Epilog error"


def test_the_health_check_publishes_its_textfile_for_node_exporter(cluster, node2, tmp_path) -> None:
    """--textfile-dir: each run slurmd starts replaces DIR/nodecert.prom (the project's renderer);
    a real node_exporter serves it. A passing node reads healthy 1, then the fault 0."""
    from promtools import NodeExporter, samples

    node = node2
    state, textfiles = tmp_path / "state", tmp_path / "textfiles"
    textfiles.mkdir()
    scenario = _scenario(tmp_path, "h100-sxm-8x-healthy")
    assert _scripts(cluster, node, state, "--timeout", "30", "--textfile-dir", str(textfiles),
                    "--", "--simulate", str(scenario)).returncode == 0
    _only(cluster, node, "nodecert-healthcheck")

    def healthy(exporter: NodeExporter) -> set[float]:
        return {value for name, _labels, value in samples(exporter.scrape())
                if name == "nodecert_host_healthy"}

    with NodeExporter(textfiles) as exporter:
        cluster.wait_for(lambda: healthy(exporter) == {1.0}, 120, "a healthy textfile")
        _scenario(tmp_path, "fault-xid-79")
        cluster.wait_for(lambda: healthy(exporter) == {0.0}, 120, "the fault in the textfile")
        assert "nodecert_checks" in exporter.scrape()
        # slurm.conf's HealthCheckInterval=2, for the staleness alert
        assert {value for name, _labels, value in samples(exporter.scrape())
                if name == "nodecert_run_interval_seconds"} == {2.0}
    assert [p.name for p in textfiles.iterdir()] == ["nodecert.prom"]  # no temporary left
    cluster.wait_for(lambda: "drain" in cluster.node_state(node)[0], 60, "the drain")


def _job_process(cluster: SlurmCluster, job: str, marker: str, timeout: float = 60) -> int:
    """The PID of the job's own process (`sleep <marker>`), found in /proc once it runs."""
    found: list[int] = []

    def running() -> bool:
        found[:] = [pid for pid in _pids("sleep", marker)
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep"]
        return bool(found)

    cluster.wait_for(running, timeout, f"job {job}'s process")
    return found[0]


def test_a_busy_node_is_not_drained_for_the_job_slurm_placed_there(cluster, node2, tmp_path) -> None:
    """slurmd runs the health check (HealthCheckNodeState=ANY, every 2 s) while a job runs on the
    node. The scenario's GPUs are held by the job's real process (its PID, read from /proc);
    proctrack/linuxproc gives it no job cgroup, so gpu-occupied finds the job through the job
    step's slurmstepd above it (host.process_tree: live). The node stays allocated, never
    drained, and the kept report says which job holds the GPUs. The same scenario with a PID
    that is no job's fails (the control: the check would drain this node)."""
    node = node2
    state = tmp_path / "state"
    marker = str(3000 + os.getpid() % 1000)
    job = cluster.run("sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap",
                      f"sleep {marker}").strip()
    pid = _job_process(cluster, job, marker)
    scenario = tmp_path / "busy.yaml"

    def write(holder: int) -> None:
        scenario.write_text(
            "extends: h100-sxm-8x-healthy\n"
            "gpu_defaults:\n"
            "  memory_used_bytes: 42949672960\n"
            f"  compute_processes: [{{pid: {holder}, name: python, used_memory_bytes: 42949672960}}]\n"
            "host: {process_tree: live}\n")

    write(os.getpid())  # the control: this test's own process is in no job
    assert _health_check_here(cluster, node, tmp_path / "control", str(scenario)) == 1
    control = json.loads((tmp_path / "control" / "last.json").read_text())
    assert control["nodecert_slurm"]["summary"].startswith("GPU050 gpu-occupied 1 other process")
    write(pid)
    assert _scripts(cluster, node, state, "--timeout", "30", "--", "--simulate",
                    str(scenario)).returncode == 0
    _only(cluster, node, "nodecert-healthcheck")
    runs: list[float] = []

    def judged_twice() -> bool:
        assert "drain" not in cluster.node_state(node)[0], cluster.node_state(node)
        last = state / "last.json"
        if last.exists() and (not runs or last.stat().st_mtime != runs[-1]):
            runs.append(last.stat().st_mtime)
        return len(runs) >= 2

    cluster.wait_for(judged_twice, 120, "two health checks during the job")
    kept = json.loads((state / "last.json").read_text())
    assert kept["verdict"] == "PASS" and not kept["nodecert_slurm"]["failed"], kept["nodecert_slurm"]
    (occupied,) = [c for c in kept["checks"] if c["id"] == "gpu-occupied"]
    assert {r["status"] for r in occupied["results"]} == {"SKIP"}
    assert f"busy: in use by Slurm job {job} (pid {pid} (python" in occupied["results"][0]["message"]
    assert cluster.node_state(node) in (("allocated", ""), ("mixed", ""))  # the job: 1 of 2 CPUs
    assert Path(f"/proc/{pid}").exists()  # the job ran through the health checks
