"""The generated wrappers fail closed by themselves: a run of `python -m checks.fleet.slurm` that
did not act (missing interpreter, broken package, refused options, a killed run) drains the node
with /bin/sh and scontrol alone, naming nodecert's configuration, not the node.

The wrappers here are the real generated scripts, run by /bin/sh with slurmd's bare environment
(PATH=/usr/bin:/bin, scontrol outside it); the interpreter is replaced by a stand-in that exits
with the code under test, and scontrol by a stub that logs its arguments and answers
`show node` with a chosen state (the real daemons: tests/fleet/test_slurm_gate.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from checks.fleet import slurm, slurm_conf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from promtools import samples

PLAN = slurm_conf.Plan(check_timeout_s=35, slurm_call_timeout_s=10, prolog_call_timeout_s=2.5,
                       budget_s=None, health_check_max_s=35, epilog_max_s=300)
STUB = """#!/bin/sh
echo "$*" >> {log}
case "$*" in *show*) cat {state} ;; *update*) [ ! -e {refuse} ] ;; esac
"""


def _setup(tmp_path: Path, python_rc: int | None, state: str) -> tuple[Path, Path]:
    """Wrappers in tmp_path/w whose interpreter exits python_rc (None: no interpreter at all)."""
    tools = tmp_path / "sbin"  # not on the wrapper's PATH
    tools.mkdir()
    log = tmp_path / "scontrol.log"
    (tmp_path / "state.txt").write_text(f"NodeName=gpu07 Arch=x86_64 State={state} Reason=x\n")
    stub = tools / "scontrol"
    stub.write_text(STUB.format(log=log, state=tmp_path / "state.txt", refuse=tmp_path / "refuse"))
    stub.chmod(0o755)
    python = tools / "python3"
    if python_rc is not None:
        python.write_text(f"#!/bin/sh\necho Traceback >&2\nexit {python_rc}\n")
        python.chmod(0o755)
    slurm.write_scripts(tmp_path / "w", tmp_path / "st", "NODECERT", PLAN, ["--expect-gpus", "8"],
                        python=str(python), scontrol=str(stub))
    return tmp_path / "w", log


def _run(wrappers: Path, name: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu07"}
    return subprocess.run(["/bin/sh", str(wrappers / name)], env=env, capture_output=True,
                          text=True, timeout=30)


def _updates(log: Path) -> list[str]:
    return [line for line in (log.read_text().splitlines() if log.exists() else [])
            if line.startswith("update")]


@pytest.mark.parametrize("rc", [None, 1, 2, 137])  # 127 from sh, traceback, usage, killed
@pytest.mark.parametrize("name,role", [("nodecert-healthcheck", "health-check"),
                                       ("nodecert-prolog", "prolog"),
                                       ("nodecert-epilog", "epilog")])
def test_a_run_that_did_not_act_drains_with_a_configuration_reason(tmp_path, rc, name, role) -> None:
    wrappers, log = _setup(tmp_path, rc, "IDLE")
    proc = _run(wrappers, name)
    code = 127 if rc is None else rc
    why = (f"nodecert-run ({role}) killed by signal 9 before it finished" if code == 137 else
           f"nodecert-config {role} exited {code}: nodecert's configuration failed, not the node")
    assert _updates(log) == [f"update NodeName=gpu07 State=DRAIN Reason=NODECERT: {why}"], proc.stderr
    # the Prolog refuses the job; the Epilog has acted (non-zero would make Slurm's own drain)
    assert proc.returncode == (0 if role == "epilog" else code), proc.stderr


def test_a_node_the_run_drained_keeps_its_reason(tmp_path) -> None:
    wrappers, log = _setup(tmp_path, 1, "IDLE+DRAIN")
    proc = _run(wrappers, "nodecert-healthcheck")
    assert proc.returncode == 1 and _updates(log) == []
    assert log.read_text().splitlines() == ["-o show node gpu07"]


def test_a_passing_run_calls_no_slurm_tool(tmp_path) -> None:
    wrappers, log = _setup(tmp_path, 0, "IDLE")
    assert _run(wrappers, "nodecert-healthcheck").returncode == 0 and not log.exists()


def test_a_run_that_found_slurm_unreachable_is_not_retried(tmp_path) -> None:
    """Exit 3 (sinfo/scontrol failed in the run): the wrapper exits 3 at once, no call of its own
    (scontrol retries a missing slurm.conf for 60 s, past slurmd's limits)."""
    wrappers, log = _setup(tmp_path, 3, "IDLE")
    assert _run(wrappers, "nodecert-prolog").returncode == 3 and not log.exists()


def test_when_scontrol_cannot_drain_the_wrapper_exits_3(tmp_path) -> None:
    wrappers, log = _setup(tmp_path, 2, "IDLE")
    (tmp_path / "refuse").touch()
    assert _run(wrappers, "nodecert-epilog").returncode == 3  # Slurm then drains: Epilog error
    assert len(_updates(log)) == 1


@pytest.mark.parametrize("node", ["gpu[01-03]", "ALL", "a,b", ""])
def test_a_node_name_scontrol_would_expand_drains_nothing(tmp_path, node) -> None:
    wrappers, log = _setup(tmp_path, 127, "IDLE")
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": node}
    proc = subprocess.run(["/bin/sh", str(wrappers / "nodecert-healthcheck")], env=env,
                          capture_output=True, text=True, timeout=30)
    if node == "":  # falls back to the host name, which is one node name
        assert _updates(log)
        return
    assert proc.returncode == 2 and not log.exists(), proc.stderr


def test_the_real_interpreter_and_a_typo_in_the_options_drain(tmp_path) -> None:
    """The real `python -m checks.fleet.slurm` refusing a pushed typo (exit 2) is drained."""
    wrappers, log = _setup(tmp_path, 0, "IDLE")
    slurm.write_scripts(wrappers, tmp_path / "st", "NODECERT", PLAN, ["--expect-gpu", "8"],
                        python=sys.executable, scontrol=str(tmp_path / "sbin" / "scontrol"))
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu07",
           "PYTHONPATH": str(Path(slurm.__file__).resolve().parents[2])}
    proc = subprocess.run(["/bin/sh", str(wrappers / "nodecert-healthcheck")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert _updates(log) == ["update NodeName=gpu07 State=DRAIN Reason=NODECERT: nodecert-config "
                             "health-check exited 2: nodecert's configuration failed, not the node"]


def test_refused_options_publish_the_host_unhealthy(tmp_path, capsys) -> None:
    """The configuration-error path writes the textfile too: NodecertHostUnhealthy fires."""
    textfiles = tmp_path / "textfiles"
    code = slurm.main(["health-check", "--node", "gpu07", "--state-dir", str(tmp_path / "st"),
                       "--textfile-dir", str(textfiles), "--", "--simulate", "no-such-scenario"])
    assert code == 2 and capsys.readouterr().err.startswith("error:")
    published = samples((textfiles / "nodecert.prom").read_text())
    assert [(labels, value) for name, labels, value in published if name == "nodecert_host_healthy"] == [
        (frozenset({("host", "gpu07"), ("level", "quick"), ("profile", "")}), 0.0)]


def test_a_check_run_the_kill_cannot_end_is_judged_without_being_reaped(tmp_path, monkeypatch) -> None:
    """A check stuck in the kernel (D state) ignores SIGKILL and cannot be reaped; the verdict
    (and so the drain) must not wait for it. D state cannot be made here: the stand-in is a
    real child the kill does not reach (the group kill is disabled), which a blocking wait()
    would wait for until the test's own timeout. What this proves: the deadline verdict comes
    within REAP_S of the deadline and names the process left behind; not that a real D-state
    process is handled the same (its state letter would read D instead of S)."""
    import os
    import signal
    import time

    from checks.fleet import slurm_gate

    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 300\n")
    stuck.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stuck))
    monkeypatch.setattr(slurm_gate, "_kill_group", lambda pgid: None)
    started = time.monotonic()
    result, report = slurm_gate.run_checks("quick", [], timeout_s=1.0)
    took = time.monotonic() - started
    assert report is None and result.failed and took < 1.0 + slurm_gate.REAP_S + 2, took
    assert result.summary.startswith("nodecert-run did not finish in 1 s (timeout: killed, but pid ")
    assert "stuck in the kernel; not reaped" in result.summary
    pid = int(result.summary.split("pid ")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def test_a_sigterm_while_the_checks_start_kills_them_and_is_the_wrappers(tmp_path, monkeypatch) -> None:
    """slurmd's SIGTERM can come while the checks are being started (they exist, their pid is
    not yet known): it is kept until it is, then kills their group and ends the run as
    Terminated (the drain says so), instead of killing the wrapper with the checks left to run.
    The process has a second thread, as pytest-xdist's workers do: the kernel may hand a
    process-directed signal to either (a signal mask held in one thread did not hold it back:
    seen in CI's run, the checks left running)."""
    import os
    import signal
    import threading

    from checks.fleet import slurm_gate
    from checks.supervise import procs

    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nexec sleep 300\n")
    sleeper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(sleeper))
    seen: dict[str, object] = {}
    real_start = procs.start

    def start_then_sigterm(*args, **kwargs):
        proc = real_start(*args, **kwargs)
        seen["pid"] = proc.pid
        os.kill(os.getpid(), signal.SIGTERM)  # before start returns to the wrapper
        return proc

    monkeypatch.setattr(procs, "start", start_then_sigterm)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with pytest.raises(slurm_gate.Terminated, match="killed by signal 15 before it finished"):
            slurm_gate.run_checks("quick", [], timeout_s=30.0)
    finally:
        stop.set()
    stat = Path(f"/proc/{seen['pid']}/stat")
    for _ in range(50):  # killed with its group (a zombie until reaped)
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the checks ({seen['pid']}) still run after the SIGTERM")


def test_a_hung_run_names_the_check_it_hung_in(tmp_path, monkeypatch) -> None:
    """The run writes the id of each check it starts into NODECERT_PROGRESS's file; at the
    deadline the verdict (so the drain reason) names it. The stand-in interpreter does what the
    watchdog's worker does (the real writer: the test below), then hangs."""
    import time

    from checks.fleet import slurm_gate

    hanging = tmp_path / "python"
    hanging.write_text('#!/bin/sh\necho nvlink-topology > "$NODECERT_PROGRESS"\nexec sleep 300\n')
    hanging.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hanging))
    progress = tmp_path / "state" / slurm_gate.PROGRESS
    progress.parent.mkdir()
    progress.write_text("gpu-occupied\n")  # an earlier run's: never this run's
    started = time.monotonic()
    result, report = slurm_gate.run_checks("quick", [], timeout_s=1.0, progress=progress)
    assert report is None and time.monotonic() - started < 1.0 + slurm_gate.REAP_S + 2
    assert result.summary == ("nodecert-run hung in nvlink-topology: did not finish in 1 s "
                              "(timeout: killed)"), result.summary
    reason = slurm.drain_reason("NODECERT", result.summary)
    assert reason.startswith("NODECERT: nodecert-run hung in nvlink-topology: ")


@pytest.mark.parametrize("written", ["", "not an id; DROP\n", "x" * 200, "\x00\xff"])
def test_a_progress_file_that_is_not_a_check_id_is_not_quoted(tmp_path, written) -> None:
    from checks.fleet import slurm_gate

    progress = tmp_path / "current-check"
    progress.write_text(written, errors="surrogateescape")
    assert slurm_gate.running_check(progress) is None
    assert slurm_gate.running_check(tmp_path / "absent") is None


def test_the_checks_write_the_check_they_start(tmp_path, monkeypatch) -> None:
    """python -m checks (its watchdog's worker) replaces the progress file before each check:
    after a run it holds the last check's id, and nothing else is left in its directory."""
    from checks.node import node_cli

    progress = tmp_path / "p" / "current-check"
    progress.parent.mkdir()
    monkeypatch.setenv("NODECERT_PROGRESS", str(progress))
    code = node_cli.main(["--simulate", "h100-sxm-8x-healthy", "--only", "driver-loaded,gpu-occupied",
                          "--no-json", "-q"])
    assert code == 0
    assert progress.read_text() == "gpu-occupied\n"
    assert [p.name for p in progress.parent.iterdir()] == ["current-check"]


def test_a_killed_run_names_the_check_it_was_in(tmp_path) -> None:
    from checks.fleet import slurm_gate

    (tmp_path / slurm_gate.PROGRESS).write_text("dcgm-diag\n")
    marker = {"role": "health-check", "at": "2026-12-04T10:00:00+0000"}
    assert slurm_gate.killed_verdict(marker, tmp_path).summary == (
        "nodecert-run (health-check) was killed in dcgm-diag before it finished (started "
        "2026-12-04T10:00:00+0000)")
    assert slurm_gate.killed_verdict(marker).summary.startswith(
        "nodecert-run (health-check) was killed before it finished (started ")


def test_a_hung_run_keeps_the_last_reports_series_and_the_interval(tmp_path, h100_report) -> None:
    """A run with no report (hang, crash) publishes healthy 0 with its own time and carries the
    last report's other series over: a FAIL that alerted keeps alerting (NodecertCheckFailed does
    not resolve because the next run hung). The interval is published on both paths."""
    from prometheus_client.parser import text_string_to_metric_families

    from checks.devtools import synthetic
    from checks.devtools.synthetic import Broken
    from checks.fleet import slurm_gate

    [report] = synthetic.build(1, base=h100_report, broken=[
        Broken("node0000", "ecc-errors", gpu=5, message="GPU5: 2 volatile uncorrectable ECC errors")])
    textfiles = tmp_path / "textfiles"
    slurm_gate.publish(textfiles, "gpu07", "quick", report, 600)
    prom = textfiles / "nodecert.prom"
    before = samples(prom.read_text())

    def failed(found: set) -> set:
        return {(n, labels) for n, labels, v in found
                if n == "nodecert_check_status" and ("status", "FAIL") in labels and v == 1}

    assert failed(before) and ("nodecert_run_interval_seconds", frozenset({("host", "node0000")}),
                               600.0) in before
    slurm_gate.publish(textfiles, "gpu07", "quick", None, 600)
    text = prom.read_text()
    after = samples(text)
    assert failed(after) == failed(before)
    names = [f.name for f in text_string_to_metric_families(text)]
    assert len(names) == len(set(names))  # one block per family: a valid textfile
    healthy = [(labels, v) for n, labels, v in after if n == "nodecert_host_healthy"]
    assert healthy == [(frozenset({("host", "gpu07"), ("level", "quick"), ("profile", "")}), 0.0)]
    [stamp] = [v for n, _, v in after if n == "nodecert_last_run_timestamp_seconds"]
    assert abs(stamp - time.time()) < 60
    assert ("nodecert_run_interval_seconds", frozenset({("host", "gpu07")}), 600.0) in after
    assert oct(prom.stat().st_mode & 0o777) == "0o644"
    slurm_gate.publish(textfiles, "gpu07", "quick", None)  # hung again, no interval given
    assert "nodecert_run_interval_seconds" not in prom.read_text()
    assert failed(samples(prom.read_text())) == failed(before)


def test_scripts_pass_slurm_confs_health_check_interval_to_the_textfile(tmp_path, capsys) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("HealthCheckInterval=600\nMessageTimeout=10\n")
    assert slurm.main(["scripts", str(tmp_path / "w"), "--slurm-conf", str(conf),
                       "--textfile-dir", str(tmp_path / "tf")]) == 0
    for name in ("nodecert-healthcheck", "nodecert-epilog"):
        assert " --interval 600" in (tmp_path / "w" / name).read_text()
    assert "--interval" not in (tmp_path / "w" / "nodecert-prolog").read_text()
    assert "no HealthCheckInterval" not in capsys.readouterr().out
    conf.write_text("HealthCheckInterval=0\n")  # Slurm's default: no periodic health check
    assert slurm.main(["scripts", str(tmp_path / "w"), "--slurm-conf", str(conf),
                       "--textfile-dir", str(tmp_path / "tf")]) == 0
    assert "--interval" not in (tmp_path / "w" / "nodecert-healthcheck").read_text()
    assert "note: slurm.conf sets no HealthCheckInterval: " in capsys.readouterr().out
    assert slurm.main(["health-check", "--node", "n1", "--interval", "0"]) == 2
