"""Run the playbooks against root filesystems with Ansible's chroot connection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = REPO / ".venv" / "bin"

# Each command Ansible runs in a root gets its own mount and PID namespace with a private /proc,
# so nothing stays mounted afterwards and processes cannot outlive the task.
CHROOT_WRAPPER = """#!/bin/sh
# Called by Ansible like chroot(8): $1 is the root, the rest the command.
exec unshare --mount --pid --fork --mount-proc="$1/proc" chroot "$@"
"""

# The line ansible.posix.profile_tasks prints under every task banner: taken out of what the tests
# read, whose patterns expect a task's result right under its banner.
PROFILE_STAMP = re.compile(
    r"^\w+ \d{2} \w+ \d{4} +\d{2}:\d{2}:\d{2} [+-]\d{4} \(\d+:\d{2}:\d{2}\.\d+\) +"
    r"\d+:\d{2}:\d{2}\.\d+ \*+ *\n",
    re.M,
)
# A line of profile_tasks' closing summary: "role : task name ------- 1.23s", slowest first.
PROFILE_TASK = re.compile(r"^(?P<task>.+?) -{2,} (?P<seconds>\d+\.\d+)s$", re.M)
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.M,
)


@dataclass(repr=False)
class Result:
    rc: int
    output: str
    seconds: float
    recap: dict[str, dict[str, int]]

    def changed(self) -> dict[str, int]:
        return {host: counts["changed"] for host, counts in self.recap.items()}

    def changed_tasks(self, host: str) -> list[str]:
        """The tasks that reported `changed` on host, by name: what a failed idempotence
        assertion shows (the output's tail is cut short by pytest)."""
        changed, task = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                task = line[len("TASK ["):].split("]", 1)[0]
            elif re.match(rf"changed: \[{re.escape(host)}\]", line):
                changed.append(task)
        return changed

    def failure(self, host: str) -> str:
        """The message of the task that failed on host ('' if none did)."""
        # The last one: a failure caught by a rescue is printed too, before the rescue's own.
        matches = re.findall(rf"^fatal: \[{re.escape(host)}\]: FAILED! => (\{{.*\}})$", self.output, re.M)
        return json.loads(matches[-1]).get("msg", "") if matches else ""

    def __repr__(self) -> str:  # what pytest shows when an assertion on a result fails
        return f"ansible-playbook rc={self.rc} after {self.seconds:.0f}s\n{self.output[-6000:]}"


def write_wrapper(directory: Path) -> Path:
    wrapper = directory / "chroot-unshare"
    wrapper.write_text(CHROOT_WRAPPER)
    wrapper.chmod(0o755)
    return wrapper


def write_inventory(
    path: Path,
    hosts: dict[str, Path],
    wrapper: Path,
    group_vars: dict,
    host_vars: dict[str, dict] | None = None,
) -> Path:
    host_vars = host_vars or {}
    inventory = {
        "all": {
            "children": {
                "gpu_nodes": {
                    "hosts": {
                        name: {"ansible_host": str(root), **host_vars.get(name, {})}
                        for name, root in hosts.items()
                    },
                    "vars": {
                        "ansible_connection": "community.general.chroot",
                        "ansible_chroot_exe": str(wrapper),
                        "ansible_python_interpreter": "/usr/bin/python3",
                        # Already root; the roots have no sudo.
                        "ansible_become": False,
                        **group_vars,
                    },
                }
            }
        }
    }
    path.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return path


def run_playbook(
    playbook: str, inventory: Path, home: Path, *args: str, forks: int = 4, timeout: float = 900
) -> Result:
    """ansible-playbook under a clean environment: the controller's pip variables (PIP_FIND_LINKS,
    PIP_CERT...) would otherwise leak into the commands run inside the roots."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "ANSIBLE_FORKS": str(forks),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_LOCAL_TEMP": str(home / "ansible-tmp"),
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        # Modules go through the chroot's stdin instead of a copied file: fewer commands per task.
        "ANSIBLE_PIPELINING": "True",
        # Absolute: with pipelining, "~" would be expanded from the controller's HOME.
        "ANSIBLE_REMOTE_TMP": "/root/.ansible/tmp",
        "ANSIBLE_COLLECTIONS_PATH": str(home / "collections"),
    }
    # Per-task timings, to see where a run spends time: NODECERT_E2E_PROFILE=1 puts them in the
    # output, =FILE also appends each run's slowest tasks to FILE (a whole pytest run's worth).
    profile = os.environ.get("NODECERT_E2E_PROFILE", "")
    if profile:
        env["ANSIBLE_CALLBACKS_ENABLED"] = "ansible.posix.profile_tasks"
    command = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(REPO / "playbooks" / playbook),
        *args,
    ]
    start = time.monotonic()
    proc = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - start
    if profile:
        proc.stdout = PROFILE_STAMP.sub("", proc.stdout)
        if profile != "1":
            summary = [m[0] for m in PROFILE_TASK.finditer(proc.stdout)][:20]
            with open(profile, "a", encoding="utf-8") as log:
                log.write(f"== {playbook} {inventory.name} {' '.join(args)}: {seconds:.0f} s\n")
                log.write("\n".join(summary) + "\n")
    recap = {
        m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
        for m in RECAP.finditer(proc.stdout)
    }
    return Result(proc.returncode, proc.stdout, seconds, recap)


# What a booted node has mounted and a chroot lacks, for commands that read more than files:
# sysfs (the PCI bus, /sys/class/infiniband; this machine's, so read-only) and a tmpfs on /dev/shm
# (DataLoader workers and the shm checks; without it /dev/shm is a directory on the root's disk).
# Mounted in the command's own mount namespace (unshare makes it private): gone when it exits.
NODE_MOUNTS = (
    'mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$0/sys" && '
    'mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$0/dev/shm" && '
    'exec chroot "$0" "$@"'
)


def in_root(
    root: Path,
    *command: str,
    check: bool = True,
    cwd: str | None = None,
    node_mounts: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess:
    """Run a command inside a root the way Ansible does (private /proc, no leftover mounts).
    cwd: the working directory inside the root (chroot starts in /). node_mounts: also sysfs and
    /dev/shm, as a booted node has them (NODE_MOUNTS). On a timeout the command's processes die
    with it (--kill-child: the whole PID namespace goes)."""
    inner = ["env", f"--chdir={cwd}", *command] if cwd else list(command)
    enter = ["sh", "-c", NODE_MOUNTS, str(root)] if node_mounts else ["chroot", str(root)]
    unshare = ["unshare", "--mount", "--pid", "--fork", "--kill-child", f"--mount-proc={root}/proc"]
    return subprocess.run(
        [*unshare, *enter, *inner],
        check=check,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        timeout=timeout,
    )


def selections(root: Path) -> dict[str, str]:
    """dpkg's package -> selection (install, hold, deinstall); Multi-Arch: same libraries, which
    dpkg lists as name:amd64, under their plain name."""
    out = in_root(root, "dpkg", "--get-selections").stdout
    return {
        name.split(":")[0]: state
        for name, state in (line.split() for line in out.splitlines() if line.strip())
    }


def package_version(root: Path, package: str) -> str:
    return in_root(root, "dpkg-query", "--show", "--showformat=${Version}", package).stdout


def fake_pci_device(root: Path, address: str, device_id: str, pci_class: str, vendor: str = "0x10de") -> None:
    """What sysfs shows for a PCI function, written into the root's (otherwise empty) /sys."""
    device = root / "sys/bus/pci/devices" / address
    device.mkdir(parents=True, exist_ok=True)
    (device / "vendor").write_text(f"{vendor}\n")
    (device / "device").write_text(f"0x{device_id}\n")
    (device / "class").write_text(f"{pci_class}\n")


def fake_secure_boot(root: Path, enabled: bool) -> None:
    efivars = root / "sys/firmware/efi/efivars"
    efivars.mkdir(parents=True, exist_ok=True)
    value = b"\x06\x00\x00\x00" + (b"\x01" if enabled else b"\x00")
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(value)


def hgx_h100(root: Path, gpu_id: str = "2330") -> None:
    """An HGX H100 board: eight H100 SXM GPUs and four NVSwitches (gpu_id 2335: an HGX H200)."""
    for index in range(8):
        fake_pci_device(root, f"0000:{0x18 + index * 0x10:02x}:00.0", gpu_id, "0x030200")
    for index in range(4):
        fake_pci_device(root, f"0000:{0xC0 + index:02x}:00.0", "22a3", "0x068000")


# Takes dpkg's frontend lock the way apt does (an fcntl write lock) and keeps it.
HOLD_DPKG_LOCK = """
import fcntl, os, sys, time
fd = os.open("/var/lib/dpkg/lock-frontend", os.O_RDWR | os.O_CREAT, 0o640)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(3600)
"""


def hold_dpkg_lock(root: Path) -> subprocess.Popen:
    """A process inside the root holding dpkg's lock until killed (--kill-child takes it along)."""
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            f"--mount-proc={root}/proc",
            "chroot",
            str(root),
            "python3",
            "-c",
            HOLD_DPKG_LOCK,
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def preinstall_deb(root: Path, deb: Path) -> None:
    """Install a .deb into a root with dpkg, as an image would ship it, then refresh apt's lists
    the way the image's first boot would (the lists then know the repository it added)."""
    target = root / "tmp" / deb.name
    target.write_bytes(deb.read_bytes())
    in_root(root, "dpkg", "-i", f"/tmp/{deb.name}")
    target.unlink()
    in_root(root, "apt-get", "update", "-q")


def plant_kernel(root: Path, release: str) -> None:
    """A kernel image installed in the root's /boot (not the running kernel: a pending one)."""
    (root / "boot").mkdir(exist_ok=True)
    (root / "boot" / f"vmlinuz-{release}").write_text("stand-in kernel image\n")
