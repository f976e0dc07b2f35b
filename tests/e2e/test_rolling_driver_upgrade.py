"""A rolling driver upgrade never swaps a driver under running jobs (provision.yml's rolling play).

Two Debian 12 roots play Ubuntu GPU nodes (one H100 each) of a real Slurm cluster on this machine
(tests/fleet/slurmcluster.py: munged, slurmctld, one slurmd per node): `upgrading` (Slurm node
gpu01) runs driver 570 with its user space installed, and a job; `current` (gpu02) already runs
580, the configured branch, from the build the run keeps. One run of provision.yml, limited to the
phases that touch the driver. gpu01 must be drained (its job finishing on the old user space)
before any of its driver packages change, then upgraded, rebooted, checked and resumed; gpu02 is
never drained nor rebooted.

What a chroot lacks is supplied by a harness around each root, the "machine": a connection plugin
(a chroot under another name, so the play may reboot it), a chroot wrapper that gives each command
the machine's loaded driver (/proc/driver/nvidia/version, a tmpfs over the root's /proc/driver)
and boot id, a stand-in `shutdown` after which the next command finds the machine booted again
with the driver the root has installed, and the node's `scontrol`, forwarded over a socket in the
root to the cluster's real one (the harness notes what the root held at each call). Real:
Ansible, apt and dpkg in the roots, the stand-in repository's packages, and Slurm.
"""

from __future__ import annotations

import ast
import json
import socketserver
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2elib import aptrepo, runner

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fleet"))
from slurmcluster import SlurmCluster, local_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

OLD_BRANCH, OLD_VERSION = "570", aptrepo.NVIDIA_REPO_DRIVERS["570"]
BRANCH, VERSION = "580", aptrepo.DRIVER_VERSIONS["580"]
NODES = {"upgrading": "gpu01", "current": "gpu02"}
TAGS = "preflight,nvidia_driver,cuda_toolkit"
CONNECTION = "nodecert_e2e.machine.machine"
REASON = f"provision: replace NVIDIA driver {OLD_VERSION} with branch {BRANCH}"

# The machine around a root: its state lives beside the root (<root>.machine/), never inside it.
MACHINE_WRAPPER = r"""#!/bin/sh
# Called by Ansible like chroot(8): $1 is the root, the rest the command.
root=$1
shift
machine=$root.machine
if [ -e "$root/run/e2e-reboot-requested" ]; then
    # The machine boots: a new boot id, and it loads the driver its root has installed.
    rm -f "$root/run/e2e-reboot-requested"
    cat /proc/sys/kernel/random/uuid > "$machine/boot_id"
    echo boot >> "$machine/boots"
    version=$(dpkg-query --admindir="$root/var/lib/dpkg" --show \
        --showformat='${db:Status-Abbrev}${Version}\n' 'nvidia-utils-*' 2>/dev/null \
        | sed -n 's/^.i *\([0-9]*:\)\{0,1\}\([0-9.]*\)-.*/\2/p' | head -n 1)
    rm -f "$machine/nvidia-version"
    if [ -n "$version" ]; then
        echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  $version  Release Build" \
            "(e2e machine)" > "$machine/nvidia-version"
    fi
fi
exec unshare --mount --pid --fork sh -c '
root=$1; machine=$2; shift 2
mount -t proc proc "$root/proc" || exit 125
mount --bind "$machine/boot_id" "$root/proc/sys/kernel/random/boot_id" || exit 125
if [ -e "$machine/nvidia-version" ]; then
    mount -t tmpfs nvidia "$root/proc/driver" && mkdir "$root/proc/driver/nvidia" \
        && cp "$machine/nvidia-version" "$root/proc/driver/nvidia/version" || exit 125
fi
exec chroot "$root" "$@"' sh "$root" "$machine" "$@"
"""

SHUTDOWN = """#!/bin/sh
# e2e machine: the reboot happens at the next command the harness runs in this root.
echo "$*" > /run/e2e-reboot-requested
"""

# The node's scontrol: the cluster's real one, reached through the harness's socket.
SCONTROL = """#!/usr/bin/python3
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("/run/e2e-slurm.sock")
s.sendall(json.dumps(sys.argv[1:]).encode() + b"\\n")
data = b""
while chunk := s.recv(65536):
    data += chunk
reply = json.loads(data)
sys.stdout.write(reply["stdout"])
sys.stderr.write(reply["stderr"])
sys.exit(reply["rc"])
"""

# The job on gpu01: it runs until its node is being drained, then notes the driver user space the
# node has at that moment and ends (a job that uses the GPUs until the drain lets it finish).
JOB = """
for i in $(seq 1200); do
    scontrol --oneliner show node {node} | grep -q 'State=[A-Z+]*DRAIN' && break
    sleep 0.5
done
dpkg-query --admindir={root}/var/lib/dpkg --show \
    --showformat='${{db:Status-Abbrev}}${{Package}} ${{Version}}\\n' 'nvidia-utils-*' \
    | sed -n 's/^.i *//p' > {result}
"""


def connection_plugin() -> str:
    """community.general's chroot under another name: load.yml reboots any connection but a chroot
    or local one. Its DOCUMENTATION is copied as a literal (Ansible reads the options from it)."""
    from ansible_collections.community.general.plugins.connection import chroot

    source = Path(chroot.__file__).read_text()
    doc = next(
        node.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION"
    )
    doc = doc.replace("name: chroot", "name: machine", 1)
    return (
        "from ansible_collections.community.general.plugins.connection.chroot import Connection as Chroot\n\n"
        f'DOCUMENTATION = r"""{doc}"""\n\n\n'
        "class Connection(Chroot):\n"
        f"    transport = {CONNECTION!r}\n\n"
        "    def reset(self):\n"
        "        # Every command is a new process in the root: after a reboot, nothing to reopen.\n"
        "        self.close()\n"
    )


def old_branch() -> list[aptrepo.Package]:
    """Canonical's 570 user space, shaped as driver_moved's other branch."""
    return aptrepo.other_branch_user_space(OLD_BRANCH, OLD_VERSION, BRANCH)


def utils_installed(root: Path) -> dict[str, str]:
    """nvidia-utils-* package -> version, as dpkg has them installed (read from outside the root)."""
    out = subprocess.run(
        [
            "dpkg-query",
            f"--admindir={root}/var/lib/dpkg",
            "--show",
            "--showformat=${db:Status-Abbrev}${Package} ${Version}\\n",
            "nvidia-utils-*",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    # Status-Abbrev "ii " or "hi " (held): installed.
    return dict(line[3:].split() for line in out.splitlines() if line[1:2] == "i")


def loaded(root: Path) -> str:
    version = Path(f"{root}.machine") / "nvidia-version"
    if not version.exists():
        return ""
    return next((word for word in version.read_text().split() if word[:1].isdigit()), "")


def boots(root: Path) -> int:
    path = Path(f"{root}.machine") / "boots"
    return len(path.read_text().splitlines()) if path.exists() else 0


@dataclass
class Call:
    argv: list[str]
    installed: dict[str, str]  # what the node's root had installed when it called scontrol
    loaded: str  # the driver its machine ran then


@dataclass
class Upgrade:
    roots: dict[str, Path]
    result: runner.Result
    calls: dict[str, list[Call]] = field(default_factory=dict)  # host -> its scontrol calls
    job_saw: str = ""
    final: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> Slurm state, reason


def make_machine(root: Path, loaded_version: str, cluster: SlurmCluster, calls: list[Call], workdir: Path):
    machine = Path(f"{root}.machine")
    machine.mkdir()
    (machine / "boot_id").write_text("00000000-e2e0-4000-8000-000000000001\n")
    (machine / "nvidia-version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {loaded_version}  Release Build"
        " (e2e machine)\n"
    )
    for path, text in (("usr/local/sbin/shutdown", SHUTDOWN), ("usr/local/bin/scontrol", SCONTROL)):
        (root / path).write_text(text)
        (root / path).chmod(0o755)

    class Forward(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            argv = json.loads(self.rfile.readline())
            calls.append(Call(argv, utils_installed(root), loaded(root)))
            proc = subprocess.run(
                ["scontrol", *argv], capture_output=True, text=True, env=cluster.env(), timeout=60
            )
            self.wfile.write(
                json.dumps({"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}).encode()
            )

    server = socketserver.ThreadingUnixStreamServer(str(root / "run/e2e-slurm.sock"), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def upgrade(make_host, debian12_tarball, base_vars, stand_in_repo, ansible_home, workdir) -> Upgrade:
    roots = {name: make_host(name, debian12_tarball) for name in NODES}
    for name, root in roots.items():
        runner.fake_pci_device(root, "0000:18:00.0", "2330", "0x030200")  # an H100
        packages = old_branch() if name == "upgrading" else aptrepo.canonical_user_space(BRANCH, VERSION)
        incoming = root / "tmp/driver"
        incoming.mkdir()
        built = [aptrepo.build_deb(p, workdir / f"debs-{name}", incoming) for p in packages]
        debs = [f"/tmp/driver/{deb.name}" for deb in built]
        runner.in_root(root, "dpkg", "--install", *debs)
    home = ansible_home("rolling-upgrade")
    plugin = home / "collections/ansible_collections/nodecert_e2e/machine/plugins/connection/machine.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(connection_plugin())
    wrapper = workdir / "machine-wrapper"
    wrapper.write_text(MACHINE_WRAPPER)
    wrapper.chmod(0o755)
    inventory = runner.write_inventory(
        workdir / "rolling-upgrade.yml",
        roots,
        wrapper,
        {**base_vars, "ansible_connection": CONNECTION, "preflight_apt_cache_valid_time": 86400},
        {name: {"provision_slurm_node_name": node} for name, node in NODES.items()},
    )
    with local_cluster(workdir / "slurm-rolling", tuple(NODES.values())) as cluster:
        calls: dict[str, list[Call]] = {name: [] for name in NODES}
        servers = [
            make_machine(roots["upgrading"], OLD_VERSION, cluster, calls["upgrading"], workdir),
            make_machine(roots["current"], VERSION, cluster, calls["current"], workdir),
        ]
        saw = workdir / "job-saw"
        cluster.run(
            "sbatch",
            "--nodelist=gpu01",
            "--ntasks=1",
            f"--output={workdir / 'job.out'}",
            "--wrap",
            JOB.format(node="gpu01", root=roots["upgrading"], result=saw),
        )
        cluster.wait_for(
            lambda: cluster.node_state("gpu01")[0] in ("mixed", "allocated"), 30, "the job to start"
        )
        try:
            result = runner.run_playbook(
                "provision.yml", inventory, home, "--tags", TAGS, forks=2, timeout=600
            )
        finally:
            for server in servers:
                server.shutdown()
                server.server_close()
        state = Upgrade(
            roots,
            result,
            calls,
            saw.read_text().strip() if saw.exists() else "",
            {node: cluster.node_state(node) for node in NODES.values()},
        )
    (ansible_home("rolling-upgrade") / "output.txt").write_text(result.output)  # NODECERT_E2E_KEEP=1 keeps it
    print(f"\nrolling driver upgrade, 2 hosts: {result.seconds:.0f}s")
    return state


def updates(calls: list[Call]) -> list[Call]:
    """The calls that changed the node's Slurm state (scontrol update)."""
    return [call for call in calls if call.argv[:1] == ["update"]]


def test_the_run_upgrades_the_node_that_ran_the_old_driver(upgrade):
    assert upgrade.result.rc == 0, upgrade.result
    root = upgrade.roots["upgrading"]
    assert utils_installed(root) == {f"nvidia-utils-{BRANCH}-server": f"{VERSION}-0ubuntu1"}
    assert loaded(root) == VERSION and boots(root) == 1
    line = (
        f"upgrading: it runs driver {OLD_VERSION}, nvidia_driver_branch is {BRANCH}. Drained (Slurm, "
        "Kubernetes) before its driver changes"
    )
    assert line in upgrade.result.output, upgrade.result


def test_the_node_is_drained_before_its_driver_changes_and_resumed_after_its_reboot(upgrade):
    """The order the issue asks for: drain (on the old driver, user space untouched), install,
    reboot, check, resume (on the new driver)."""
    assert upgrade.result.rc == 0, upgrade.result
    calls = updates(upgrade.calls["upgrading"])
    assert len(calls) == 2, calls
    drain, resume = calls
    # Before the fix the drain came in the reboot play, after the install: 580 was installed then.
    old = {f"nvidia-utils-{OLD_BRANCH}-server": f"{OLD_VERSION}-0ubuntu1"}
    assert (drain.installed, drain.loaded) == (old, OLD_VERSION), drain
    assert drain.argv == ["update", "NodeName=gpu01", "State=DRAIN", f"Reason={REASON}"], drain
    assert resume.argv == ["update", "NodeName=gpu01", "State=RESUME"], resume
    assert (resume.installed, resume.loaded) == (
        {f"nvidia-utils-{BRANCH}-server": f"{VERSION}-0ubuntu1"},
        VERSION,
    ), resume
    assert upgrade.final["gpu01"] == ("idle", "")


def test_the_running_job_ends_before_the_driver_changes(upgrade):
    """The job was still running when the drain began; the node waited for it, and its user space
    was still 570 when the job ended (before the fix the drain came only after the install)."""
    assert upgrade.job_saw == f"nvidia-utils-{OLD_BRANCH}-server {OLD_VERSION}-0ubuntu1", upgrade.result


def test_the_node_whose_driver_stays_keeps_running(upgrade):
    assert upgrade.result.rc == 0, upgrade.result
    root = upgrade.roots["current"]
    assert updates(upgrade.calls["current"]) == []
    assert upgrade.final["gpu02"] == ("idle", "")
    assert utils_installed(root) == {f"nvidia-utils-{BRANCH}-server": f"{VERSION}-0ubuntu1"}
    assert loaded(root) == VERSION and boots(root) == 0
    assert "current: it runs driver" not in upgrade.result.output
