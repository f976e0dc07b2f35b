"""Provisioning time: one host vs four hosts in parallel (forks=4), first run and two reruns.

    sudo .venv/bin/python benchmarks/provision_bench.py                  # Debian 12 GPU-less images
    sudo .venv/bin/python benchmarks/provision_bench.py --release noble  # Ubuntu 24.04 GPU nodes
    ... --release jammy | resolute                                       # Ubuntu 22.04 / 26.04
    NODECERT_E2E_PROFILE=1 ...   also prints each run's slowest tasks (ansible.posix.profile_tasks)

Uses the end-to-end test harness (tests/e2e/e2elib): roots reached through Ansible's chroot
connection, the signed stand-in of NVIDIA's repository on 127.0.0.1, torch from a local
wheelhouse. debian12: GPU-less images (CUDA toolkit, NCCL, real torch CPU wheel), every package
from the stand-in or the roots' own lists. jammy, noble, resolute: L40S nodes from the Ubuntu
cloud-image root of that release (as test_e2e_ubuntu builds them: resolute from its release
pocket; jammy from its release and -security pockets when -updates lists a driver the pool does
not serve), Canonical's real driver and precompiled modules from Ubuntu's archive through the
caching apt proxy (each file downloaded once, then served from .cache/e2e/apt-proxy/ to every
host), a stand-in torch wheel for the release's Python (3.10, 3.12, 3.14).

Each provisions three times: the first run; a rerun of every task (-e nodecert_full_run=true),
what the roles themselves cost when nothing is left to do; and a plain rerun, which takes the fast
path of a converged node (docs/provisioning.md, "Reruns"). Goals: a no-change rerun <= 10 s per
host; four hosts <= 1.5x one host, first run too.
It also prints the CPU time of each run (ansible-playbook and everything it ran, in the roots
too) and the floor that puts on four hosts here: they share this machine's cores, where real
nodes each bring their own, so four hosts cannot finish before all cores together did four
hosts' CPU work.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from e2elib import aptproxy, aptrepo, rootfs, runner, wheelhouse  # noqa: E402

CACHE = REPO / ".cache" / "e2e"


def slowest_tasks(output: str, count: int = 8) -> list[str]:
    """The slowest tasks of a run, from the profile_tasks summary (NODECERT_E2E_PROFILE=1)."""
    timed = [(m["task"], float(m["seconds"])) for m in runner.PROFILE_TASK.finditer(output)]
    slowest = sorted(timed, key=lambda t: -t[1])[:count]
    return [f"{seconds:6.2f}s  {name.strip()}" for name, seconds in slowest]


def children_cpu_seconds() -> float:
    """CPU time (user + system) of every finished child process so far: ansible-playbook, its
    workers, and everything they ran inside the roots (each waited for by its parent)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


RUNS = ("first", "every task", "fast path")


def provision_thrice(
    names: list[str], work: Path, make_root, group_vars: dict, wrapper: Path
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Wall and CPU seconds of provisioning `names` three times: the first run, a rerun of every
    task (-e nodecert_full_run=true: the roles' own no-change cost), and a plain rerun, which
    takes the fast path of a converged node."""
    roots = {name: make_root(name) for name in names}
    inventory = runner.write_inventory(work / f"bench-{len(names)}.yml", roots, wrapper, group_vars)
    times, cpu = [], []
    for attempt in RUNS:
        args = ("-e", "nodecert_full_run=true") if attempt == "every task" else ()
        cpu_before = children_cpu_seconds()
        result = runner.run_playbook(
            "provision.yml", inventory, work / "home", *args, forks=len(names), timeout=1800
        )
        cpu.append(children_cpu_seconds() - cpu_before)
        if result.rc != 0:
            raise SystemExit(f"{len(names)} host(s), {attempt} run failed:\n{result!r}")
        if attempt != "first" and any(result.recap[n]["changed"] for n in names):
            raise SystemExit(f"{attempt} rerun changed something: {result.recap}")
        if attempt == "fast path" and result.output.count("converged since ") != len(names):
            raise SystemExit(f"the rerun did not take the fast path on every host:\n{result.output[-3000:]}")
        times.append(result.seconds)
        if os.environ.get("NODECERT_E2E_PROFILE"):
            slowest = slowest_tasks(result.output)
            print(f"{len(names)} host(s), {attempt} run, slowest tasks:", *slowest, sep="\n  ")
    for root in roots.values():
        rootfs.remove_root(root)
    return tuple(times), tuple(cpu)


# release -> (Release, its python3, the pockets of its image, the pockets to fall back to)
UBUNTU = {
    "jammy": (rootfs.UBUNTU_2204, "3.10", rootfs.ALL_POCKETS, rootfs.SECURITY_POCKETS),
    "noble": (rootfs.UBUNTU_2404, "3.12", rootfs.ALL_POCKETS, None),
    "resolute": (rootfs.UBUNTU_2604, "3.14", rootfs.RELEASE_POCKET_ONLY, None),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", choices=("debian12", *UBUNTU), default="debian12")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("error: needs root (debootstrap, chroot, unshare)", file=sys.stderr)
        return 2
    ubuntu = UBUNTU.get(args.release)
    if ubuntu and (reason := rootfs.archive_answers(ubuntu[0])):
        print(f"error: no Ubuntu archive: {reason}", file=sys.stderr)
        return 2
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=CACHE))
    proxy = aptproxy.CachingProxy(CACHE / "apt-proxy").start()
    repo = aptrepo.build_and_serve(work / "repo", os.uname().release, only_nvidia=ubuntu is not None)
    project = work / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, project / name)
    for name in ("checks", "trainer"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__"))
    group_vars = {
        "preflight_require_gpu": False,
        "preflight_min_free_disk_mb": 1024,
        "cuda_toolkit_repo_url": repo.url,
        "cuda_toolkit_repo_key_checksum": repo.key_checksum,
        "pytorch_pip_extra_args": "--no-index --find-links /srv/wheelhouse",
        "pytorch_nodecert_source": str(project),
        "pytorch_import_check": ["torch", "checks"],
    }
    if ubuntu:
        try:
            release, _, pockets, fallback = ubuntu
            tarball, note = rootfs.ubuntu_image_or_fallback(
                release, CACHE, proxy.url, proxy.apt_config(), pockets, fallback
            )
            if note:
                print(f"{release.suite}: {note}")
        except rootfs.ArchiveGap as gap:
            repo.stop()
            proxy.stop()
            shutil.rmtree(work, ignore_errors=True)
            print(f"error: no {args.release} image with precompiled modules today: {gap}", file=sys.stderr)
            return 2
        wheels = wheelhouse.cached_standin_wheelhouse(REPO, CACHE, ubuntu[1], True)
    else:
        tarball = rootfs.cached_tarball(rootfs.DEBIAN_12, CACHE)
        wheels = wheelhouse.cached_wheelhouse(REPO, CACHE)

    def make_root(name: str) -> Path:
        root = rootfs.unpack(tarball, work / "hosts" / name)
        rootfs.use_proxy(root, proxy.apt_config())
        wheelhouse.link_into(wheels, root)
        if ubuntu:
            runner.fake_pci_device(root, "0000:3b:00.0", "26b9", "0x030200")  # an L40S
        return root

    wrapper = runner.write_wrapper(work)
    try:
        one, one_cpu = provision_thrice(["bench-1"], work, make_root, group_vars, wrapper)
        names = [f"bench-4-{i}" for i in range(1, 5)]
        four, four_cpu = provision_thrice(names, work, make_root, group_vars, wrapper)
    finally:
        repo.stop()
        proxy.stop()
        shutil.rmtree(work, ignore_errors=True)
    cores = len(os.sched_getaffinity(0))
    title = "provision.yml, " + (f"{ubuntu[0].suite} L40S nodes" if ubuntu else "Debian 12 images")
    print(f"{title:<42}" + "".join(f"{run:>12}" for run in RUNS))

    def row(label: str, values, unit: str = "s") -> None:
        print(f"{label:<42}" + "".join(f"{value:>11.1f}{unit}" for value in values))

    row("1 host", one)
    row("4 hosts, forks=4", four)
    row("ratio 4 hosts / 1 host", [f / o for f, o in zip(four, one, strict=True)], "x")
    row("CPU seconds, 1 host", one_cpu)
    row("CPU seconds, 4 hosts", four_cpu)
    # Here the four "hosts" share this machine's cores; real nodes each bring their own. Four
    # hosts' CPU work cannot finish sooner than it takes all cores to do it.
    floor = [max(o, c / cores) / o for o, c in zip(one, four_cpu, strict=True)]
    row(f"floor on {cores} shared cores (CPU / cores)", floor, "x")
    print(
        f"goals: a no-change rerun <= 10 s per host: fast path {four[2] / 4:.1f} s per host with 4, "
        f"{one[2]:.1f} s alone ({one[1] / one[2]:.1f}x faster than every task's {one[1]:.1f} s); "
        f"4 hosts <= 1.5x 1 host (first {four[0] / one[0]:.2f}x, every task {four[1] / one[1]:.2f}x, "
        f"fast path {four[2] / one[2]:.2f}x; {cores} cores shared by the four hosts put the floor at "
        + ", ".join(f"{f:.2f}x" for f in floor) + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
