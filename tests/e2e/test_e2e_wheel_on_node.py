"""The node's own install of nodecert, run on the node: one fresh Debian 12 root provisioned by
`provision.yml --tags preflight,pytorch` (the checks play, then the preflight and pytorch roles: the
venv, real torch 2.13.0 CPU from the wheelhouse, this project's wheel built on the controller by
the role and installed with its dependencies into /opt/nodecert/venv), then, inside the root with
/opt/nodecert/venv/bin/python, from a working directory with no source tree and no PYTHONPATH:
`--simulate` of a shipped scenario at quick, standard and burn-in (`--list`), a failing scenario,
`--budget`, `record --redact` and its replay, the fleet report and the Slurm wrappers, and a real
`--level standard` on the root (no GPU: gloo collectives, DataLoader workers and the acceptance
training jobs on 4 CPU ranks, in the root's venv: the proof that the node's install trains).

How it differs from tests/framework/test_installed_wheel.py: that test builds the wheel the way
the role does, unpacks it into a fresh venv on the controller and borrows the test venv's torch,
rich, ... through a .pth line; nothing there shows that the role's own build, copy and `pip
install` (dependency resolution from the wheelhouse included) leave a node whose install works.
Here the role does all of it and the commands run in the root's Python 3.11, against the
dependencies pip resolved into the node's venv, with only what the root holds.

The --simulate runs read simulated hardware; the real run reads the root's files and this
machine's kernel (a chroot), with sysfs and a tmpfs on /dev/shm mounted as a booted node has
them (runner.NODE_MOUNTS; without sysfs the collective and shm checks rightly ERROR).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml
from e2elib import runner

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

HOST = "wheel-node"
VENV = "/opt/nodecert/venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
RUN = "/root/nodecert-run"  # where the commands run: no source tree, nothing of this checkout
SCENARIO = "h100-sxm-8x-healthy"
# A --list line: id, code, then the level (rich wraps the title onto the next lines).
LISTED = re.compile(r"^([a-z0-9-]+)\s+[A-Z]+\d{3}\s+(?:quick|standard|burn-in)\b", re.M)
TRAIN = [f"train-{job}" for job in ("single", "localize", "ddp", "pipeline", "hybrid", "syncbn", "fsdp",
                                    "tp", "bf16", "compile", "accum", "loader", "ckpt", "throughput")]
WORKLOADS = ["nccl-allreduce", "dataloader-workers", "dataloader-shm", "dataloader-scaling",
             "dataloader-worker-death"]
# What the real run judges of this machine rather than of the install (the root shares its
# kernel, limits, swap and disk): allowed to say otherwise on another machine.
MACHINE = {"memlock-limit", "swap", "disk-space", "shm-size", "cpu-numa", "os-supported"}
# The site's policy the inventory gives the pytorch role (pytorch_site_policy): written to
# /etc/nodecert/site.yaml once the venv's checks accept it, read by every run on the node.
SITE_POLICY = {"profile": {"ecc": {"aggregate_corrected_warn": 1000}}, "skip": ["bmc-sensors"]}


@dataclass
class Node:
    root: Path
    provision: runner.Result

    def path(self, inside: str) -> Path:
        return self.root / inside.lstrip("/")

    def python(self, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 120) -> CompletedProcess:
        """The node's venv Python, inside the root, in RUN (env: PATH and LANG only)."""
        done = runner.in_root(
            self.root, f"{VENV}/bin/python", *args, cwd=RUN, node_mounts=True, check=False, timeout=timeout
        )
        assert done.returncode in ok, (
            f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        return done

    def checks(self, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 120) -> dict:
        """`python -m checks ARGS --json` on the node; its report."""
        name = f"report-{len(list(self.path(RUN).glob('report-*.json')))}.json"
        self.python("-m", "checks", *args, "--json", name, "-q", ok=ok, timeout=timeout)
        return json.loads(self.path(f"{RUN}/{name}").read_text())


def statuses(report: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in report["checks"]}


def messages(report: dict, *ids: str) -> dict[str, str]:
    return {c["id"]: c["results"][0]["message"] for c in report["checks"] if c["id"] in ids and c["results"]}


@pytest.fixture(scope="module")
def node(make_host, debian12_tarball, base_vars, chroot_wrapper, ansible_home, workdir) -> Node:
    """One fresh root through the cheapest run that leaves the real install: the checks play
    (tags preflight and pytorch select its preflight role and the pytorch role's checks) and the
    preflight and pytorch roles, as `make provision` runs them; no driver, CUDA or NCCL."""
    root = make_host(HOST, debian12_tarball)
    inventory = runner.write_inventory(workdir / f"{HOST}.yml", {HOST: root}, chroot_wrapper,
                                       {**base_vars, "pytorch_site_policy": SITE_POLICY})
    result = runner.run_playbook(
        "provision.yml", inventory, ansible_home(HOST), "--tags", "preflight,pytorch"
    )
    print(f"\nprovision.yml --tags preflight,pytorch, 1 host: {result.seconds:.0f}s")
    assert result.rc == 0, result
    (root / RUN.lstrip("/")).mkdir()
    return Node(root, result)


def test_the_role_built_and_installed_the_wheel(node):
    assert node.provision.recap[HOST]["failed"] == 0, node.provision
    out = node.provision.output
    assert re.search(r"TASK \[pytorch : Build the wheel\][ *]*\nok: \[wheel-node -> localhost\]", out), out
    assert re.search(r"TASK \[pytorch : Install this project and its dependencies\][ *]*\nchanged: ", out)
    # Only the preflight and pytorch roles changed the root (the other roles' `always` tasks
    # only read): no driver, toolkit or NCCL.
    changed = node.provision.changed_tasks(HOST)
    assert "pytorch : Install torch for the CUDA release" in changed, changed
    assert [t for t in changed if not t.startswith(("preflight : ", "pytorch : "))] == [], changed
    assert not node.path("/etc/apt/sources.list.d/nvidia-cuda.list").exists()
    [wheel] = node.path("/opt/nodecert/dist").glob("nodecert-*.whl")
    lock = node.path("/opt/nodecert/requirements.lock").read_text()
    assert f"nodecert @ file:///opt/nodecert/dist/{wheel.name}" in lock, lock
    assert re.search(r"^torch==2\.13\.0", lock, re.M), lock
    # The CUDA build from the role's release table (a GPU-less root, the driver role's branch 580).
    assert "torch 2.13.0 (CUDA 13.0 build) for Python 3.11" in out, out



def test_the_installed_package_is_the_nodes(node):
    code = (
        "import json, sys, checks, trainer, importlib.metadata as m\n"
        "d = m.distribution('nodecert')\n"
        "print(json.dumps({'checks': checks.__file__, 'trainer': trainer.__file__, 'path': sys.path,"
        " 'version': d.version, 'direct_url': json.loads(d.read_text('direct_url.json'))['url'],"
        " 'executable': sys.executable}))"
    )
    where = json.loads(node.python("-c", code).stdout)
    assert where["checks"] == f"{SITE}/checks/__init__.py", where
    assert where["trainer"] == f"{SITE}/trainer/__init__.py", where
    # Nothing on the path but the root's standard library and the venv (and '': RUN, empty).
    assert [p for p in where["path"] if p and not p.startswith(("/usr/lib/python3", SITE))] == [], where
    assert where["version"] == "0.1.0" and where["executable"] == f"{VENV}/bin/python", where
    assert re.fullmatch(r"file:///opt/nodecert/dist/nodecert-0\.1\.0-py3-none-any\.whl", where["direct_url"])
    # The doc generators and the synthetic fleets stay in the source tree, out of the product.
    for module in ("checks.docgen", "checks.devtools.synthetic"):
        failed = node.python("-c", f"import {module}", ok=(1,))
        missing = ".".join(module.split(".")[:2])
        assert f"ModuleNotFoundError: No module named '{missing}'" in failed.stderr, failed.stderr


def test_quick_from_the_nodes_install(node):
    report = node.checks("--simulate", SCENARIO, "--level", "quick")
    assert (report["verdict"], report["exit_code"], report["level"]) == ("PASS", 0, "quick")
    # The scenario and its data came from the installed package.
    assert report["scenario"] == f"{SITE}/checks/scenarios/{SCENARIO}.yaml", report["scenario"]
    assert report["tool"] == {"name": "nodecert", "version": "0.1.0"} and report["backend"] == "fixture"
    found = statuses(report)
    assert {"gpu-count", "xid-events", "nvlink", "fabric-manager", "ecc-errors", "pci-gpus"} <= set(found)
    assert found["gpu-count"] == "PASS" and found["fabric-manager"] == "PASS", found
    assert not set(found) & {"nccl-allreduce", "train-ddp", "burn-in"}, "standard checks at quick"
    assert not [i for i, s in found.items() if s in ("FAIL", "ERROR")], found


def test_standard_simulated_from_the_nodes_install(node):
    report = node.checks("--simulate", SCENARIO, "--level", "standard")
    assert (report["verdict"], report["level"]) == ("PASS", "standard")
    found = statuses(report)
    assert {*TRAIN, *WORKLOADS, "gpu-matmul", "gpu-count"} <= set(found)
    assert {i: found[i] for i in WORKLOADS} == dict.fromkeys(WORKLOADS, "PASS"), found
    assert messages(report, "nccl-allreduce")["nccl-allreduce"].startswith("8 ranks nccl:")
    # Simulated hardware cannot train: the real run below does.
    train = messages(report, *TRAIN)
    assert {i: found[i] for i in TRAIN} == dict.fromkeys(TRAIN, "SKIP"), found
    assert set(train.values()) == {"simulated hardware: training jobs need the real machine"}, train


def test_burn_in_plan_from_the_nodes_install(node):
    done = node.python("-m", "checks", "--simulate", SCENARIO, "--level", "burn-in", "--list")
    listed = LISTED.findall(done.stdout)
    assert {"burn-in", "train-ddp", "nccl-allreduce", "gpu-count"} <= set(listed), listed


def test_a_failing_scenario_exits_1_from_the_nodes_install(node):
    report = node.checks("--simulate", "fault-xid-79", "--level", "quick", ok=(1,))
    assert (report["verdict"], report["exit_code"]) == ("FAIL", 1)
    failed = {i: s for i, s in statuses(report).items() if s == "FAIL"}
    assert failed == {"xid-events": "FAIL"}, failed
    assert "XID 79" in messages(report, "xid-events")["xid-events"]


def test_budget_from_the_nodes_install(node):
    done = node.python("-m", "checks", "--simulate", SCENARIO, "--budget", "5m", "--list")
    planned = set(LISTED.findall(done.stdout))
    left_out = set(re.findall(r"^left out: ([a-z0-9-]+) \(needs ~\d+ s, \d+ s left\)$", done.stdout, re.M))
    # The quick checks fit; the 107-second acceptance launch does not fit what is left.
    assert {"gpu-count", "xid-events", "nccl-allreduce"} <= planned, done.stdout
    assert set(TRAIN) <= left_out and not planned & left_out, done.stdout


def test_record_and_replay_from_the_nodes_install(node):
    done = node.python("-m", "checks", "record", "--simulate", SCENARIO, "--redact", "rec.yaml")
    assert "recorded 8 GPU(s), 4 NVSwitch(es), NVML ok -> rec.yaml" in done.stdout + done.stderr, done
    recording = yaml.safe_load(node.path(f"{RUN}/rec.yaml").read_text())
    made = r"Recording of redacted-host made .* by nodecert 0\.1\.0 \(python -m checks record --redact\)"
    assert re.match(made, recording["description"]), recording["description"]
    replay = node.checks("--simulate", "rec.yaml", "--level", "quick")
    original = node.checks("--simulate", SCENARIO, "--level", "quick")
    assert (replay["verdict"], replay["scenario"]) == ("PASS", f"{RUN}/rec.yaml"), replay["scenario"]
    assert statuses(replay) == statuses(original)


def test_fleet_report_and_slurm_wrappers_from_the_nodes_install(node):
    reports = f"{RUN}/fleet/run1"
    node.path(reports).mkdir(parents=True)
    for host, scenario, code in (("node001", SCENARIO, 0), ("node002", "fault-xid-79", 1)):
        node.python("-m", "checks", "--simulate", scenario, "--level", "quick", "--json",
                    f"{reports}/{host}.json", "-q", ok=(code,))
    done = node.python("-m", "checks.fleet", "report", reports, "--json", "fleet.json", "--html",
                       "fleet.html", "--junit", "fleet.xml", "--prometheus-dir", "prom", ok=(1,))
    assert "FAIL  run run1: 2 hosts  PASS 1  FAIL 1" in done.stdout, done.stdout
    fleet = json.loads(node.path(f"{RUN}/fleet.json").read_text())
    assert {h["host"]: h["status"] for h in fleet["hosts"]} == {"node001": "PASS", "node002": "FAIL"}, fleet
    html = node.path(f"{RUN}/fleet.html").read_text()  # its template and styles are package data
    assert "<html" in html and "node002" in html and "xid-events" in html
    assert 'name="node002"' in node.path(f"{RUN}/fleet.xml").read_text()
    assert 'nodecert_fleet_hosts{status="FAIL"} 1' in node.path(f"{RUN}/prom/nodecert-fleet.prom").read_text()
    assert node.path(f"{RUN}/fleet/history.sqlite").stat().st_size > 0

    done = node.python("-m", "checks.fleet.slurm", "scripts", "slurm")
    scripts = {p.name: p for p in node.path(f"{RUN}/slurm").iterdir()}
    assert set(scripts) == {"nodecert-healthcheck", "nodecert-prolog", "nodecert-epilog",
                            "nodecert-remediate"}, done.stdout
    # the remediation loop's command for a timer: the node's venv too
    assert f"exec {VENV}/bin/python -m checks.fleet.slurm remediate --apply " in \
        scripts["nodecert-remediate"].read_text()
    assert scripts["nodecert-remediate"].stat().st_mode & 0o111
    for name, command in (("nodecert-healthcheck", "health-check"), ("nodecert-prolog", "prolog"),
                          ("nodecert-epilog", "epilog")):
        text = scripts[name].read_text()
        # The wrappers Slurm runs call the node's venv, the interpreter that wrote them, and judge
        # its exit themselves (no exec: a run that fails without acting is drained by the shell).
        assert f"\n{VENV}/bin/python -m checks.fleet.slurm {command} --apply " in text, text
        assert scripts[name].stat().st_mode & 0o111, name


def nvidia_on_this_machine() -> bool:
    return any(p.read_text().strip() == "0x10de" for p in Path("/sys/bus/pci/devices").glob("*/vendor"))


def test_the_site_policy_is_written_validated_and_read_by_the_nodes_runs(
        node, chroot_wrapper, base_vars, ansible_home, workdir):
    """The role wrote the inventory's policy where the checks read it by default; a run on the
    node records it (file, digest, the keys it changed) and skips what it skips. A policy the
    node's own checks refuse (an unknown key) fails the host and leaves the file as it was."""
    site = node.path("/etc/nodecert/site.yaml")
    assert yaml.safe_load(site.read_text()) == SITE_POLICY
    assert oct(site.stat().st_mode & 0o777) == "0o644"
    report = node.checks("--level", "quick", ok=(0, 1))
    recorded = report["options"]["site"]
    assert recorded["file"] == "/etc/nodecert/site.yaml" and len(recorded["sha256"]) == 64
    assert recorded["changed"] == ["ecc.aggregate_corrected_warn"] and recorded["skip"] == ["bmc-sensors"]
    assert "bmc-sensors" not in statuses(report)
    before = site.read_bytes()
    bad = {**SITE_POLICY, "profile": {"ecc": {"aggregate_corected_warn": 5}}}
    inventory = runner.write_inventory(workdir / f"{HOST}-bad-site.yml", {HOST: node.root}, chroot_wrapper,
                                       {**base_vars, "pytorch_site_policy": bad})
    result = runner.run_playbook("provision.yml", inventory, ansible_home(HOST), "--tags",
                                 "preflight,pytorch")
    print(f"\nprovision.yml with a refused site policy: {result.seconds:.0f}s")
    assert result.rc != 0, result.output[-3000:]
    assert "unknown key ecc.aggregate_corected_warn" in result.output, result.output[-3000:]
    assert site.read_bytes() == before


def test_the_nodes_install_trains(node):
    """`python -m checks --level standard` on the root, for real: with no NVIDIA GPU on the PCI bus
    the collectives run on 2 gloo ranks, the DataLoader checks start real workers and the acceptance
    jobs train on 4 CPU ranks, each proven equal to one device; every rank is the venv's Python."""
    if nvidia_on_this_machine():
        pytest.skip("this machine has an NVIDIA GPU, which the root (no driver) would rightly FAIL on")
    mounts = node.python("-c", "print(open('/proc/self/mounts').read())").stdout
    assert re.search(r"^shm /dev/shm tmpfs rw,", mounts, re.M), mounts
    assert re.search(r"^sysfs /sys sysfs ro,", mounts, re.M), mounts
    report = node.checks("--level", "standard", ok=(0, 1), timeout=1200)
    found = statuses(report)
    bad = {i for i, s in found.items() if s in ("FAIL", "ERROR")}
    assert bad - MACHINE == set(), messages(report, *bad)
    # Exit 0 and PASS unless this machine itself fails a check of its own (swap on, ...).
    expected = (1, "FAIL") if bad else (0, "PASS")
    assert (report["exit_code"], report["verdict"]) == expected, report["summary"]
    assert report["backend"] == "linux" and report["scenario"] is None
    assert report["system"]["torch"] == "2.13.0+cpu", report["system"]
    assert report["system"]["os"].startswith("Debian GNU/Linux 12"), report["system"]
    # What provisioning wrote for the checks to expect was read (the role's expect.yaml).
    assert report["options"]["expectations_file"] == "/etc/nodecert/expect.yaml", report["options"]
    trained = {i: found[i] for i in TRAIN}
    assert trained == dict.fromkeys(TRAIN, "PASS"), messages(report, *TRAIN)
    assert found["train-dp"] == "SKIP"  # DataParallel needs 2 GPUs
    assert messages(report, "train-ddp")["train-ddp"].startswith("4 ranks x 10 steps equal the single-device")
    assert {i: found[i] for i in WORKLOADS} == dict.fromkeys(WORKLOADS, "PASS"), messages(report, *WORKLOADS)
    [collective] = next(c for c in report["checks"] if c["id"] == "nccl-allreduce")["results"]
    assert collective["details"]["backend"] == "gloo", collective["details"]
    launch = collective["details"]["launch"]["command"]
    assert launch.startswith(f"{VENV}/bin/python -m checks.supervise.guard checks.supervise.forkrun "), launch
    assert f"venv {VENV}; torch {SITE}/torch" in messages(report, "disk-space")["disk-space"]
