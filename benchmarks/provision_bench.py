"""Provisioning time: one host vs four hosts in parallel (forks=4), first and second run.

    sudo .venv/bin/python benchmarks/provision_bench.py

Uses the end-to-end test harness (tests/e2e/e2elib): Debian 12 debootstrap roots reached through
Ansible's chroot connection, the signed stand-in NVIDIA repository on 127.0.0.1, and torch from
a local wheelhouse. Goals (issue 5): second run <= 20 s per host; four hosts <= 1.5x one host.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from e2elib import aptrepo, rootfs, runner, wheelhouse  # noqa: E402

CACHE = REPO / ".cache" / "e2e"


def provision_twice(
    names: list[str], work: Path, tarball: Path, wheels: Path, group_vars: dict, wrapper: Path
) -> tuple[float, float]:
    roots = {}
    for name in names:
        roots[name] = rootfs.unpack(tarball, work / "hosts" / name)
        wheelhouse.link_into(wheels, roots[name])
    inventory = runner.write_inventory(work / f"bench-{len(names)}.yml", roots, wrapper, group_vars)
    times = []
    for attempt in ("first", "second"):
        result = runner.run_playbook("provision.yml", inventory, work / "home", forks=len(names))
        if result.rc != 0:
            raise SystemExit(f"{len(names)} host(s), {attempt} run failed:\n{result!r}")
        if attempt == "second" and any(result.recap[n]["changed"] for n in names):
            raise SystemExit(f"second run changed something: {result.recap}")
        times.append(result.seconds)
    for root in roots.values():
        rootfs.remove_root(root)
    return times[0], times[1]


def main() -> int:
    if os.geteuid() != 0:
        print("needs root (debootstrap, chroot, unshare)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-", dir=CACHE if CACHE.exists() else None))
    tarball = rootfs.cached_tarball(rootfs.DEBIAN_12, CACHE)
    wheels = wheelhouse.cached_wheelhouse(REPO, CACHE)
    repo = aptrepo.build_and_serve(work / "repo", os.uname().release)
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
    wrapper = runner.write_wrapper(work)
    try:
        one = provision_twice(["bench-1"], work, tarball, wheels, group_vars, wrapper)
        four = provision_twice(
            [f"bench-4-{i}" for i in range(1, 5)], work, tarball, wheels, group_vars, wrapper
        )
    finally:
        repo.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'provision.yml (Debian 12 roots, chroot)':<42}{'first run':>12}{'second run':>12}")
    print(f"{'1 host':<42}{one[0]:>11.1f}s{one[1]:>11.1f}s")
    print(f"{'4 hosts, forks=4':<42}{four[0]:>11.1f}s{four[1]:>11.1f}s")
    print(f"{'ratio 4 hosts / 1 host':<42}{four[0] / one[0]:>11.2f}x{four[1] / one[1]:>11.2f}x")
    print(f"goals: second run <= 20 s per host ({four[1] / 4:.1f} s per host with 4), 4 hosts <= 1.5x 1 host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
