"""provision.yml on Ubuntu 22.04 (jammy), 24.04 (noble) and 26.04 (resolute) roots with Canonical's
real packages from Ubuntu's archive, when it answers (each release is probed; a case whose archive
does not answer, or serves no kernel with precompiled modules for its driver, is skipped with the
reason), and the refusal of a release out of standard support (20.04) before any change.

The roots start as a fresh cloud image does (rootfs.cached_ubuntu_image): every component in the
release, -updates and -security pockets, and a -generic kernel through linux-image-virtual. The
driver user space (nvidia-*-580-server), Canonical's signed precompiled modules for that kernel
(linux-modules-nvidia-580-server-open-<kernel> and the -generic meta package that follows kernel
upgrades), Fabric Manager and NSCQ (multiverse) come from Ubuntu's archive through a caching proxy
on the controller (each file downloaded once, kept across runs), maintainer scripts and all. Only
what NVIDIA alone ships (cuda-keyring, cuda-toolkit-12-8, libnccl2/-dev) comes from the signed
stand-in of NVIDIA's repository, in its NVIDIA-only form.

Five hosts, five starting points, one run (then a second that must change nothing):
  noble-535         a noble HGX H100 node running branch 535 from noble's release pocket (the
                    genuine 535, before Ubuntu made 535-server transitional), held: upgraded to
                    580, the holds moved, nothing of 535 left;
  noble-image       a noble L40S node whose image ships cuda-keyring (its own entry for NVIDIA's
                    repository) and unattended-upgrades configured to upgrade everything;
  jammy-image       a jammy L40S cloud image (python3 3.10, the venv on it) on which an admin
                    installed Canonical's desktop build of 580 for its kernel, as ubuntu-drivers
                    does (nvidia-driver-580-open: its X server, DKMS, gcc and modprobe options):
                    replaced by the server build, the desktop build purged, what only it
                    needed removed. Where the archive lists a 580-server build its pool does not
                    serve (jammy on 2026-12-06: 580.196.07, 404), its sources also name a site
                    repository of the newest older build the pool serves (580.178.04,
                    e2elib.sitedriver), its desktop build comes from there (older than the
                    build the archive lists), its kernel is one whose modules are built for that
                    build, and the play must install that build and say why not the newest listed;
  noble-release     a noble HGX H100 node installed from 24.04's release pocket alone, on the
                    branch noble released with (nvidia_driver_branch 535: Canonical's genuine
                    535.161.08 -server, its precompiled open modules for 6.8.0-31, Fabric Manager
                    and NSCQ 535): noble end to end whatever its -updates pool serves;
  resolute-release  a resolute HGX H100 node installed from 26.04's release pocket alone (a site
                    mirror of what it certified): kernel 7.0, python3 3.14, Canonical's 580-server
                    driver, modules, Fabric Manager and NSCQ as 26.04 released them.
On each, the installed checks run in the venv on the release's own Python (--simulate: PASS and
exit 0 for a healthy node, FAIL and exit 1 for an XID 79). Check mode on a fresh image of each
release leaves it byte-identical. On each release whose kernel came with its meta package, a
kernel ABI move under that release's own unattended-upgrades lands with its modules, or stays out
when its modules need another driver, and never stops the other updates of the run. A
debootstrapped jammy root dressed as 20.04 must be refused in the first check.

NODECERT_E2E_UBUNTU_HOSTS=noble-release,resolute-release runs those hosts alone (the others are
skipped, saying so): for working on one release.

torch: the local torch wheel is built for CPython 3.11 (Debian 12); the Ubuntu hosts install a
stand-in wheel named torch 2.13.0 (py3-none-any, importable, not PyTorch) beside this project's
wheel and its dependencies built for the release's own Python (3.10, 3.12, 3.14), which import
there.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2elib import aptproxy, aptrepo, rootfs, runner, sitedriver, wheelhouse

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "e2e"
WHEELHOUSE_IN_HOST = "srv/wheelhouse"
PROBE_TIMEOUT = 5
BRANCH = "580"


@dataclass(frozen=True)
class Host:
    release: rootfs.Release
    python: str
    devices: str  # "hgx" or "l40s"
    pockets: tuple[str, ...] = rootfs.ALL_POCKETS
    # the pockets of the image built instead when `pockets` list a driver the pool does not serve
    # (rootfs.ArchiveGap): a node whose sources name the release and -security pockets alone
    fallback: tuple[str, ...] | None = None
    branch: str = BRANCH  # nvidia_driver_branch (the image's kernel has its precompiled modules)
    # Where the archive lists a build of the branch its pool does not serve, the node's sources also
    # name a site repository of the newest older build the pool still serves (e2elib.sitedriver):
    # the role must install that one (tasks/served.yml), and the image's kernel is one whose
    # precompiled modules are built for it.
    site_driver: bool = False


HOSTS = {
    "noble-535": Host(rootfs.UBUNTU_2404, "3.12", devices="hgx"),
    "noble-image": Host(rootfs.UBUNTU_2404, "3.12", devices="l40s"),
    "jammy-image": Host(rootfs.UBUNTU_2204, "3.10", devices="l40s", site_driver=True),
    "noble-release": Host(
        rootfs.UBUNTU_2404, "3.12", devices="hgx", pockets=rootfs.RELEASE_POCKET_ONLY, branch="535"
    ),
    "resolute-release": Host(rootfs.UBUNTU_2604, "3.14", devices="hgx", pockets=rootfs.RELEASE_POCKET_ONLY),
}
# The genuine 535 in noble's release pocket (-updates has only the transitional 535 -> 580).
OLD_BRANCH_PACKAGES = (
    "nvidia-headless-no-dkms-535-server",
    "nvidia-utils-535-server",
    "nvidia-fabricmanager-535",
    "libnvidia-nscq-535",
)
OLD_BRANCH_PIN = """\
# nodecert e2e starting point: branch 535 as noble released it.
Package: /-535/
Pin: release a=noble
Pin-Priority: 1001
"""
# unattended-upgrades told to upgrade from every origin, NVIDIA's included.
UPGRADE_EVERYTHING = """\
Unattended-Upgrade::Origins-Pattern { "origin=*"; };
APT::Periodic::Update-Package-Lists "1";
APT::Periodic::Unattended-Upgrade "1";
"""


def apt_in(root: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={root}/proc", "chroot", str(root), *args],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"},
    )
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def start_on_branch_535(root: Path) -> None:
    pin = root / "etc/apt/preferences.d/nodecert-e2e-535"
    pin.write_text(OLD_BRANCH_PIN)
    apt_in(root, "apt-get", "update", "-q")
    apt_in(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", *OLD_BRANCH_PACKAGES)
    pin.unlink()
    installed = apt_in(root, "dpkg-query", "--show", "--showformat=${Package}\\n").stdout.split()
    apt_in(root, "apt-mark", "hold", *[p for p in installed if "535" in p])


# Canonical's desktop build of the branch, as `ubuntu-drivers install` leaves a workstation: the
# driver meta package and the precompiled modules of the running kernel (its DKMS, compiler and X
# server come as dependencies).
DESKTOP_PACKAGES = (f"nvidia-driver-{BRANCH}-open", f"linux-modules-nvidia-{BRANCH}-open-{{kernel}}")
KMS_CONF = "etc/modprobe.d/nvidia-graphics-drivers-kms.conf"


def autoremovable(root: Path) -> set[str]:
    simulated = apt_in(root, "apt-get", "--simulate", "autoremove").stdout
    return set(re.findall(r"^Remv (\S+)", simulated, re.M))


# The build the site repository serves, preferred while the starting point is installed (the
# archive's newest is listed, not served).
SITE_PIN = """\
# nodecert e2e starting point: the desktop build from the site repository.
Package: *
Pin: origin 127.0.0.1
Pin-Priority: 1001
"""


def start_on_the_desktop_build(root: Path, kernel: str, from_site: bool = False) -> list[str]:
    """Canonical's desktop driver installed on the image (DESKTOP_PACKAGES); returns the packages
    that install brought, so the test can tell what the move must take away with it."""
    before = set(installed_packages(root))
    pin = root / "etc/apt/preferences.d/nodecert-e2e-site"
    if from_site:
        pin.write_text(SITE_PIN)
    apt_in(root, "apt-get", "update", "-q")
    apt_in(root, "apt-get", "install", "-y", "-q", "--no-install-recommends",
           *(name.format(kernel=kernel) for name in DESKTOP_PACKAGES))
    pin.unlink(missing_ok=True)
    assert (root / KMS_CONF).exists(), "Canonical's desktop build ships its modprobe options"
    return sorted(set(installed_packages(root)) - before)


def installed_packages(root: Path) -> list[str]:
    shown = apt_in(root, "dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\\n").stdout
    return [line.split(" ", 1)[0] for line in shown.splitlines() if line.split(" ", 1)[1].strip() == "ii"]


def release_pocket_version(root: Path, package: str) -> str:
    """The version of package in the release pocket itself (not -updates or -security)."""
    madison = apt_in(root, "apt-cache", "madison", package).stdout
    suite = rootfs.UBUNTU_2404.suite
    (found,) = [line.split("|")[1].strip() for line in madison.splitlines() if f" {suite}/main " in line]
    return found


def start_as_vendor_image(root: Path, nvidia_repo: aptrepo.StandInRepo, workdir: Path) -> None:
    deb = aptrepo.build_deb(
        aptrepo.cuda_keyring(nvidia_repo, "ubuntu2404"), workdir / "keyring-ubuntu", workdir
    )
    apt_in(root, "apt-get", "update", "-q")
    apt_in(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", "unattended-upgrades")
    # curl as noble released it, so that -security has an update for it (libcurl4t64 is what the
    # blacklist's old '^libcu' swallowed).
    curl = release_pocket_version(root, "libcurl4t64")
    apt_in(root, "apt-get", "install", "-y", "-q", "--no-install-recommends", "--allow-downgrades",
           f"curl={curl}", f"libcurl4t64={curl}")
    (root / "etc/apt/apt.conf.d/52nodecert-e2e-upgrade-everything").write_text(UPGRADE_EVERYTHING)
    runner.preinstall_deb(root, deb)


@dataclass
class Ubuntu:
    roots: dict[str, Path]
    skipped: dict[str, str]
    kernels: dict[str, str]
    inventory: Path
    first: runner.Result | None
    second: runner.Result | None  # every task (-e nodecert_full_run=true)
    fast: runner.Result | None  # the fast path of converged nodes
    desktop: list[str]  # what installing the desktop build brought onto jammy-image
    # host -> the site repository its sources name (Host.site_driver, where the archive lists a
    # build its pool does not serve)
    site: dict[str, sitedriver.SiteDriver] = field(default_factory=dict)


@pytest.fixture(scope="module")
def nvidia_repo(workdir):
    repo = aptrepo.build_and_serve(workdir / "nvidia-only-repo", os.uname().release, only_nvidia=True)
    yield repo
    repo.stop()


@pytest.fixture(scope="module")
def proxy():
    running = aptproxy.CachingProxy(CACHE / "apt-proxy").start()
    yield running
    running.stop()


def ubuntu_image(host: Host, proxy: aptproxy.CachingProxy, driver: str = "") -> tuple[Path, str]:
    """The host's image and '', or its fallback's and why (rootfs.ubuntu_image_or_fallback)."""
    return rootfs.ubuntu_image_or_fallback(
        host.release, CACHE, proxy.url, proxy.apt_config(), host.pockets, host.fallback, host.branch, driver
    )


def image_with_site(
    name: str, host: Host, proxy: aptproxy.CachingProxy, site_repos: dict, workdir: Path
) -> tuple[Path, str, sitedriver.SiteDriver | None]:
    """ubuntu_image, and for a Host.site_driver host whose archive lists a build its pool does not
    serve, the site repository of the newest older build it serves (served under site_repos[name],
    add it to the root with sitedriver.add_to_root) and an image whose kernel has modules for it."""
    found = host.site_driver and sitedriver.find(
        host.release.mirror, host.release.suite, host.pockets, proxy.url, host.branch
    )
    if found and name not in site_repos:
        site_repos[name] = sitedriver.build_and_serve(
            found, host.release.mirror, proxy.url, CACHE / f"site-driver-{host.release.name}", workdir / name
        )
    tarball, note = ubuntu_image(host, proxy, upstream(found.version) if found else "")
    return tarball, note, found or None


@pytest.fixture(scope="module")
def site_repos():
    """name -> the site repository served for that host (stopped with the module)."""
    served: dict[str, sitedriver.Served] = {}
    yield served
    for repo in served.values():
        repo.stop()


@pytest.fixture(scope="module")
def ubuntu(
    e2e_ready, workdir, base_vars, nvidia_repo, proxy, chroot_wrapper, ansible_home, site_repos
) -> Ubuntu:
    roots: dict[str, Path] = {}
    site: dict[str, sitedriver.SiteDriver] = {}
    skipped: dict[str, str] = {}
    kernels: dict[str, str] = {}
    pockets: dict[str, str] = {}
    only = {n for n in os.environ.get("NODECERT_E2E_UBUNTU_HOSTS", "").split(",") if n}
    for name, host in HOSTS.items():
        if only and name not in only:
            skipped[name] = f"not in NODECERT_E2E_UBUNTU_HOSTS={','.join(sorted(only))}"
            continue
        reason = rootfs.archive_answers(host.release, timeout=PROBE_TIMEOUT)
        if reason:
            skipped[name] = f"no Ubuntu archive: {reason}"
            continue
        try:
            tarball, pockets[name], found = image_with_site(name, host, proxy, site_repos, workdir)
            if found:
                site[name] = found
        except rootfs.ArchiveGap as gap:
            skipped[name] = f"no Ubuntu image with precompiled modules today: {gap}"
            continue
        wheels = wheelhouse.cached_standin_wheelhouse(REPO, CACHE, host.python, True)
        root = rootfs.unpack(tarball, workdir / "hosts" / name)
        rootfs.use_proxy(root, proxy.apt_config())
        if name in site_repos:
            sitedriver.add_to_root(root, site_repos[name])
        wheelhouse.link_into(wheels, root, WHEELHOUSE_IN_HOST)
        if host.devices == "hgx":
            runner.hgx_h100(root)
        else:
            runner.fake_pci_device(root, "0000:3b:00.0", "26b9", "0x030200")
        (kernel,) = [p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*")]
        kernels[name] = kernel
        roots[name] = root
    if "noble-535" in roots:
        start_on_branch_535(roots["noble-535"])
    if "noble-image" in roots:
        start_as_vendor_image(roots["noble-image"], nvidia_repo, workdir)
    desktop: list[str] = []
    # Where the site repository serves the build, the desktop build comes from it too: older than
    # the build the archive lists, as on a workstation installed months before (apt's resolver
    # cannot plan that move from the server build's names alone: tasks/install.yml).
    if "jammy-image" in roots:
        desktop = start_on_the_desktop_build(
            roots["jammy-image"], kernels["jammy-image"], from_site="jammy-image" in site_repos
        )
    inventory = workdir / "ubuntu.yml"
    if not roots:
        return Ubuntu(roots, skipped, kernels, inventory, None, None, None, desktop, site)
    group_vars = {
        **base_vars,
        "cuda_toolkit_repo_url": nvidia_repo.url,
        "cuda_toolkit_repo_key_checksum": nvidia_repo.key_checksum,
        "preflight_gpu_distributions": ["Ubuntu"],  # the default: these are Ubuntu roots
    }
    host_vars = {name: {"nvidia_driver_branch": HOSTS[name].branch} for name in roots}
    runner.write_inventory(inventory, roots, chroot_wrapper, group_vars, host_vars)
    first = runner.run_playbook(
        "provision.yml", inventory, ansible_home("ubuntu"), forks=len(roots), timeout=1800
    )
    (workdir / "ubuntu-first.log").write_text(first.output)  # kept with NODECERT_E2E_KEEP=1
    second = fast = None
    if first.rc == 0:
        every_task = ("-e", "nodecert_full_run=true")
        home = ansible_home("ubuntu")
        second = runner.run_playbook("provision.yml", inventory, home, *every_task, forks=len(roots))
        (workdir / "ubuntu-second.log").write_text(second.output)
        fast = runner.run_playbook("provision.yml", inventory, ansible_home("ubuntu"), forks=len(roots))
    print(
        f"\nprovision.yml, Ubuntu hosts {sorted(roots)} (archive packages): first run {first.seconds:.0f}s"
        + (f", second run {second.seconds:.0f}s (every task)" if second else "")
        + (f", third run {fast.seconds:.1f}s (fast path)" if fast else "")
        + "".join(f"\n  {name}: {note}" for name, note in sorted(pockets.items()) if note)
        + "".join(f"\n  {name}: the archive lists {s.newest} but serves no file of it ({s.unserved}); "
                  f"the site repository serves {s.version}" for name, s in sorted(site.items()))
    )
    return Ubuntu(roots, skipped, kernels, inventory, first, second, fast, desktop, site)


@pytest.fixture(params=sorted(HOSTS))
def host(request, ubuntu) -> str:
    if request.param in ubuntu.skipped:
        pytest.skip(ubuntu.skipped[request.param])
    return request.param



def upstream(deb_version: str) -> str:
    return re.sub(r"-[^-]*$", "", re.sub(r"^[0-9]+:", "", deb_version))


def test_root_is_the_ubuntu_release(ubuntu, host):
    os_release = (ubuntu.roots[host] / "etc/os-release").read_text()
    name = HOSTS[host].release.name
    assert "ID=ubuntu" in os_release and f'VERSION_ID="{name[6:8]}.{name[8:]}"' in os_release


def test_first_run_provisions(ubuntu, host):
    assert ubuntu.first is not None and ubuntu.first.recap[host]["failed"] == 0, ubuntu.first
    assert ubuntu.first.rc == 0, ubuntu.first


def test_second_run_changes_nothing(ubuntu, host):
    assert ubuntu.second is not None, ubuntu.first
    assert ubuntu.second.rc == 0, ubuntu.second
    assert ubuntu.second.recap[host]["changed"] == 0, ubuntu.second.changed_tasks(host)


def test_rerun_of_a_converged_node_takes_the_fast_path(ubuntu, host):
    """The record the second run left matches: the node ends after one module, changing nothing."""
    assert ubuntu.fast is not None, ubuntu.second
    assert ubuntu.fast.rc == 0, ubuntu.fast
    assert ubuntu.fast.recap[host]["changed"] == 0 and ubuntu.fast.recap[host]["ok"] <= 3, ubuntu.fast.recap
    said = [line for line in ubuntu.fast.output.splitlines() if "converged since " in line]
    assert len(said) == len(ubuntu.roots), ubuntu.fast


def test_canonicals_driver_is_installed_pinned_and_held(ubuntu, host):
    root, kernel, branch = ubuntu.roots[host], ubuntu.kernels[host], HOSTS[host].branch
    held = runner.selections(root)
    expected = [
        f"nvidia-headless-no-dkms-{branch}-server-open",
        f"nvidia-utils-{branch}-server",
        f"libnvidia-compute-{branch}-server",
        f"nvidia-compute-utils-{branch}-server",
        f"nvidia-kernel-common-{branch}-server",
        f"linux-modules-nvidia-{branch}-server-open-{kernel}",
    ]
    assert {p: held.get(p) for p in expected} == dict.fromkeys(expected, "hold")
    # Canonical's build from the archive (not a stand-in), one upstream version throughout.
    utils = runner.package_version(root, f"nvidia-utils-{branch}-server")
    assert re.fullmatch(rf"{branch}\.\d+\.\d+-0ubuntu\S+", utils), utils
    assert upstream(runner.package_version(root, f"libnvidia-compute-{branch}-server")) == upstream(utils)
    assert not [p for p in held if p.startswith("nvidia-dkms-")], "precompiled modules: no DKMS"


def test_flavour_meta_package_follows_the_kernel(ubuntu, host):
    """The image's kernel came through its meta package (linux-image-virtual, or
    linux-image-virtual-hwe-22.04 for jammy's HWE kernel): the meta package of the
    modules comes too (it brings the modules of the next kernel along), not held."""
    note = rootfs.image_note(ubuntu.roots[host])
    if note.get("meta") != "yes":
        pytest.skip(f"the image has no kernel meta package: {note.get('meta')}")
    modules_flavour = note.get("flavour", "virtual generic").split()[1]
    meta = f"linux-modules-nvidia-{HOSTS[host].branch}-server-open-{modules_flavour}"
    assert runner.selections(ubuntu.roots[host]).get(meta) == "install", meta


def test_what_lands_on_disk(ubuntu, host):
    """The kernel module for the installed kernel, nvidia-smi and NVML, as the packages' own
    maintainer scripts left them."""
    root, kernel = ubuntu.roots[host], ubuntu.kernels[host]
    modules = sorted((root / "lib/modules" / kernel).rglob("nvidia.ko*"))
    assert modules, f"no nvidia.ko under /lib/modules/{kernel}"
    assert not (root / "lib/modules" / os.uname().release).exists()  # not for the controller's kernel
    smi = root / "usr/bin/nvidia-smi"
    assert smi.read_bytes()[:4] == b"\x7fELF"
    nvml = root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert nvml.exists() and nvml.resolve().read_bytes()[:4] == b"\x7fELF"


def test_fabric_manager_and_nscq_on_the_nvswitch_boards(ubuntu, host):
    root = ubuntu.roots[host]
    held = runner.selections(root)
    if HOSTS[host].devices != "hgx":
        assert not [p for p in held if p.startswith(("nvidia-fabricmanager", "libnvidia-nscq"))]
        return
    branch = HOSTS[host].branch
    driver = upstream(runner.package_version(root, f"nvidia-utils-{branch}-server"))
    for package in (f"nvidia-fabricmanager-{branch}", f"libnvidia-nscq-{branch}"):
        assert held.get(package) == "hold", package
        assert upstream(runner.package_version(root, package)) == driver, package
    unit = root / "usr/lib/systemd/system/nvidia-fabricmanager.service"
    assert unit.exists()
    link = root / "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service"
    assert os.readlink(link) == "/lib/systemd/system/nvidia-fabricmanager.service"


def test_nvidia_only_packages_come_from_the_cuda_repository(ubuntu, host, nvidia_repo):
    root = ubuntu.roots[host]
    held = runner.selections(root)
    for package in ("cuda-toolkit-12-8", "libnccl2", "libnccl-dev"):
        assert held.get(package) == "hold", package
    assert runner.package_version(root, "libnccl2") == f"{aptrepo.NCCL_VERSION}+cuda{aptrepo.CUDA_VERSION}"
    distribution = HOSTS[host].release.name
    source = (root / "etc/apt/sources.list.d/nvidia-cuda.list").read_text()
    line = f"deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] {nvidia_repo.url}/{distribution}/x86_64/ /"
    assert line in source and "trusted=yes" not in source
    key = (root / "etc/apt/keyrings/nvidia-cuda.asc").read_bytes()
    assert "sha256:" + hashlib.sha256(key).hexdigest() == nvidia_repo.key_checksum


def test_profile_has_no_ld_library_path(ubuntu, host):
    root = ubuntu.roots[host]
    login = runner.in_root(root, "bash", "-lc", "nvcc --version; echo LD=$LD_LIBRARY_PATH").stdout
    assert "release 12.8," in login and "\nLD=\n" in login, login


def test_the_desktop_build_was_replaced_with_what_it_brought(ubuntu):
    """jammy-image started on Canonical's desktop build (start_on_the_desktop_build): none of its
    packages is left, not even configuration files, so its modprobe options (modeset,
    PreserveVideoMemoryAllocations) went with its purged nvidia-kernel-common (a copy kept); what
    only it needed (X server, Mesa, DKMS) is gone, and apt has nothing of it left to autoremove."""
    if "jammy-image" in ubuntu.skipped:
        pytest.skip(ubuntu.skipped["jammy-image"])
    root = ubuntu.roots["jammy-image"]
    assert ubuntu.first is not None and ubuntu.first.rc == 0, ubuntu.first
    brought = set(ubuntu.desktop)
    assert {f"nvidia-driver-{BRANCH}-open", "xserver-xorg-core", "dkms", "gcc"} <= brought, brought
    shown = apt_in(root, "dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\\n").stdout
    known = {line.split(" ", 1)[0]: line.split(" ", 1)[1].strip() for line in shown.splitlines()}
    desktop_build = sorted(name for name in brought if re.search(rf"-{BRANCH}(-open)?(-|$)", name)
                           and "-server" not in name)
    assert desktop_build, brought
    assert {name: known.get(name) for name in desktop_build} == dict.fromkeys(desktop_build), known
    assert not (root / KMS_CONF).exists()
    assert (root / "var/backups/nodecert/nvidia-graphics-drivers-kms.conf").read_text().strip()
    left = sorted(name for name in brought if known.get(name) == "ii")
    gone = {"xserver-xorg-core", "xserver-common", "dkms", "libllvm15", "libgl1-mesa-dri"}
    assert not gone & set(left), left
    # What stays of it, apt itself keeps: `apt` suggests dpkg-dev, which recommends gcc, and apt
    # counts suggested and recommended packages as needed (APT::AutoRemove::SuggestsImportant).
    assert not autoremovable(root) & brought, sorted(autoremovable(root) & brought)
    assert "packages that only the replaced driver needed" in ubuntu.first.output


def test_the_newest_served_build_is_installed_where_the_newest_listed_is_not(ubuntu):
    """jammy-image's sources list the archive's newest build of the branch, whose files the pool
    does not serve (404 on 2026-12-06: 580.196.07), and the site repository's older build: the
    play installs the older one, the whole branch at that version with the precompiled modules
    built for it, says so in one line naming the file not served, and leaves no pin behind; the
    rerun (every task) keeps it and says nothing more. Before tasks/served.yml the play stopped in
    its checks, naming the file."""
    if "jammy-image" in ubuntu.skipped:
        pytest.skip(ubuntu.skipped["jammy-image"])
    if "jammy-image" not in ubuntu.site:
        pytest.skip("the archive serves its newest 580-server build for jammy today: no gap to prove")
    root, site = ubuntu.roots["jammy-image"], ubuntu.site["jammy-image"]
    assert ubuntu.first is not None and ubuntu.first.rc == 0, ubuntu.first
    listed = apt_in(root, "apt-cache", "madison", f"nvidia-utils-{BRANCH}-server").stdout
    assert site.newest in listed and site.version in listed, listed
    for package in (f"nvidia-utils-{BRANCH}-server", f"libnvidia-compute-{BRANCH}-server",
                    f"nvidia-kernel-common-{BRANCH}-server", f"nvidia-headless-no-dkms-{BRANCH}-server-open",
                    f"nvidia-compute-utils-{BRANCH}-server"):
        assert runner.package_version(root, package) == site.version, package
    modules = f"linux-modules-nvidia-{BRANCH}-server-open-{ubuntu.kernels['jammy-image']}"
    assert runner.selections(root).get(modules) == "hold", modules
    said = [line for line in ubuntu.first.output.splitlines() if "the newest version of branch" in line]
    assert len(said) == 1 and upstream(site.version) in said[0] and upstream(site.newest) in said[0], said
    # the first file apt could not fetch (on 2026-12-06 nvidia-firmware-580-server-580.196.07), as apt said
    assert re.search(rf"/pool/restricted/\S+_{re.escape(site.newest)}_\w+\.deb \(404 ", said[0]), said
    assert ubuntu.second is not None and "the newest version of branch" not in ubuntu.second.output
    assert not [p.name for p in (root / "etc/apt/preferences.d").iterdir() if "nodecert" in p.name]
    assert not list((root / "var/cache/apt").glob("nodecert-fetch.*"))


# Releases the playbooks provision (roles/preflight/defaults/main.yml) and the hosts that prove each.
SUPPORTED = __import__("yaml").safe_load(
    (REPO / "playbooks/roles/preflight/defaults/main.yml").read_text()
)["preflight_supported_distributions"]["Ubuntu"]


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_supported_release_is_proven(ubuntu, version):
    """A supported release none of whose hosts could run fails here, naming it and why, instead of
    leaving only skipped tests behind. Skipped (the reason then heads pytest's summary, -ra) only
    where the archive does not answer at all or the hosts were left out on purpose."""
    name = f"ubuntu{version.replace('.', '')}"
    hosts = sorted(h for h, host in HOSTS.items() if host.release.name == name)
    assert hosts, f"no e2e host for Ubuntu {version}: add one to HOSTS"
    ran = [h for h in hosts if h not in ubuntu.skipped]
    why = {h: ubuntu.skipped[h] for h in hosts if h in ubuntu.skipped}
    on_purpose = ("no Ubuntu archive:", "not in NODECERT_E2E_UBUNTU_HOSTS")
    if not ran and all(reason.startswith(on_purpose) for reason in why.values()):
        pytest.skip(f"Ubuntu {version} NOT PROVEN: {why}")
    assert ran, f"Ubuntu {version} is supported but none of its e2e hosts could run: {why}"
    assert ubuntu.first is not None and all(ubuntu.first.recap[h]["failed"] == 0 for h in ran), ubuntu.first


def test_branch_535_was_replaced(ubuntu):
    """The 535 node: 580 installed and held, the holds moved, nothing of 535 left (not even
    configuration files)."""
    if "noble-535" in ubuntu.skipped:
        pytest.skip(ubuntu.skipped["noble-535"])
    root = ubuntu.roots["noble-535"]
    listed = runner.in_root(
        root, "dpkg-query", "--show", "--showformat=${Package} ${db:Status-Abbrev}\\n"
    ).stdout
    assert not [line for line in listed.splitlines() if "535" in line], listed
    held = runner.in_root(root, "apt-mark", "showhold").stdout.split()
    assert f"nvidia-utils-{BRANCH}-server" in held and f"nvidia-fabricmanager-{BRANCH}" in held
    assert not [p for p in held if "535" in p]


def test_vendor_image_keyring_and_unattended_upgrades(ubuntu, nvidia_repo):
    """cuda-keyring's entry is switched off (apt works, our key verifies the repository), and
    unattended-upgrades, told to upgrade everything, leaves NVIDIA's packages alone although the
    repository offers a newer NCCL, while curl's security update from noble-security goes through."""
    if "noble-image" in ubuntu.skipped:
        pytest.skip(ubuntu.skipped["noble-image"])
    root = ubuntu.roots["noble-image"]
    keyring_list = (root / "etc/apt/sources.list.d/cuda-ubuntu2404-x86_64.list").read_text()
    assert not [line for line in keyring_list.splitlines() if line.strip().startswith("deb")], keyring_list
    update = runner.in_root(root, "apt-get", "update", check=False)
    assert update.returncode == 0 and "Conflicting" not in update.stderr, update.stderr
    newer = f"{aptrepo.NEWER_NCCL[0]}+cuda{aptrepo.NEWER_NCCL[1]}"
    assert newer in runner.in_root(root, "apt-cache", "madison", "libnccl2").stdout
    dry = subprocess.run(
        [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            f"--mount-proc={root}/proc",
            "chroot",
            str(root),
            "unattended-upgrade",
            "--dry-run",
            "--debug",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )
    said = dry.stdout + dry.stderr
    # It read the role's blacklist and turned the newer NCCL down because of it.
    assert "Initial blacklist: ^nvidia- ^libnvidia-" in said, said[-3000:]
    assert re.search(r"^skipping blacklisted package libnccl", said, re.M), said[-3000:]
    upgrades = re.findall(r"^Packages that will be upgraded: (.*)$", said, re.M)
    touched = [
        p
        for line in upgrades
        for p in line.split()
        if p.startswith(("libnccl", "nvidia-", "cuda-", "libnvidia-"))
    ]
    assert touched == [], said[-3000:]
    assert runner.package_version(root, "libnccl2") == f"{aptrepo.NCCL_VERSION}+cuda{aptrepo.CUDA_VERSION}"
    # Everything else still gets its security updates: curl, held back by no rule of ours.
    assert not re.search(r"^skipping blacklisted package (lib)?curl", said, re.M), said[-3000:]
    upgraded = {p for line in upgrades for p in line.split()}
    assert {"curl", "libcurl4t64"} <= upgraded, said[-3000:]
    security = apt_in(root, "apt-cache", "madison", "libcurl4t64").stdout
    assert f"{rootfs.UBUNTU_2404.suite}-security/main" in security, security


def test_venv_with_the_stand_in_torch(ubuntu, host):
    root = ubuntu.roots[host]
    probe = runner.in_root(
        root,
        "/opt/nodecert/venv/bin/python",
        "-c",
        "import sys, torch; print(torch.__version__, '%d.%d' % sys.version_info[:2])",
    )
    assert probe.stdout.split() == ["2.13.0", HOSTS[host].python], probe.stderr
    lock = (root / "opt/nodecert/requirements.lock").read_text()
    assert re.search(r"^torch==2\.13\.0$", lock, re.M)
    imports = runner.in_root(root, "/opt/nodecert/venv/bin/python", "-c", "import checks, trainer, numpy")
    assert imports.returncode == 0, imports.stderr
    assert re.search(r"^nodecert @ file:///opt/nodecert/dist/nodecert-", lock, re.M)


def test_the_node_checks_run_on_the_release_python(ubuntu, host):
    """The installed checks run in the node's venv on the release's own Python (3.10 on 22.04, 3.14
    on 26.04), through the same code as on a GPU node, the fixture backend standing in for NVML:
    a healthy HGX H100 PASSes (exit 0), an XID 79 (GPU fallen off the bus) FAILs (exit 1)."""
    verdicts = {}
    for scenario in ("h100-sxm-8x-healthy", "fault-xid-79"):
        run = runner.in_root(ubuntu.roots[host], "/opt/nodecert/venv/bin/python", "-m", "checks",
                             "--simulate", scenario, check=False)
        verdicts[scenario] = (run.returncode, run.stdout.strip().splitlines()[-1].split()[0])
    assert verdicts == {"h100-sxm-8x-healthy": (0, "PASS"), "fault-xid-79": (1, "FAIL")}, verdicts


def test_a_release_out_of_standard_support_is_refused_before_any_change(
    workdir, base_vars, nvidia_repo, chroot_wrapper, ansible_home
):
    """Ubuntu 20.04 left standard support (and its python3 is 3.8): a root that says it is 20.04
    (a debootstrapped jammy root whose os-release claims focal), with the defaults and this
    project's own package, stops in the first check of the checks that run on every node, with one
    line saying why and what to do, and nothing in the root changes."""
    reason = rootfs.archive_answers(rootfs.UBUNTU_2204, timeout=PROBE_TIMEOUT)
    if reason:
        pytest.skip(f"no Ubuntu archive: {reason}")
    root = rootfs.unpack(rootfs.cached_tarball(rootfs.UBUNTU_2204, CACHE), workdir / "hosts" / "focal")
    rootfs.pretend_os(root, "ubuntu", "Ubuntu", "20.04", "focal")
    runner.hgx_h100(root)
    group_vars = {
        **base_vars,
        "cuda_toolkit_repo_url": nvidia_repo.url,
        "cuda_toolkit_repo_key_checksum": nvidia_repo.key_checksum,
        "preflight_gpu_distributions": ["Ubuntu"],
    }
    # What a run may write without changing the node: Ansible's own temporary files.
    scratch = ("root/.ansible", "tmp", "var/tmp")
    before = rootfs.tree_digest(root, exclude=scratch)
    inventory = runner.write_inventory(
        workdir / "ubuntu-focal.yml", {"focal": root}, chroot_wrapper, group_vars
    )
    result = runner.run_playbook("provision.yml", inventory, ansible_home("ubuntu-focal"))
    assert result.rc == 2, result
    message = result.failure("focal")
    assert "\n" not in message.strip(), message
    refusal = "focal runs Ubuntu 20.04; these roles support Ubuntu 22.04/24.04/26.04, Debian 12."
    assert message.startswith(refusal), message
    assert "python3 is 3.8" in message and "Upgrade to 22.04" in message, message
    assert "TASK [preflight : Check that the operating system is supported]" in result.output
    assert result.recap["focal"]["changed"] == 0, result.changed_tasks("focal")
    assert rootfs.tree_digest(root, exclude=scratch) == before, "the refused root changed"


@pytest.mark.parametrize("name", ["noble-image", "jammy-image", "noble-release", "resolute-release"])
def test_check_mode_on_a_fresh_node_changes_nothing(
    name, workdir, base_vars, nvidia_repo, proxy, chroot_wrapper, ansible_home, site_repos
):
    """`make provision CHECK=1`, the documented first step, on a fresh HGX image of each release:
    it passes (noble's own libnccl2 2.18.5 in multiverse is no reason to stop) and leaves the root
    byte-identical (no apt planner log, no package lists, no holds)."""
    host = HOSTS[name]
    only = {n for n in os.environ.get("NODECERT_E2E_UBUNTU_HOSTS", "").split(",") if n}
    if only and name not in only:
        pytest.skip(f"not in NODECERT_E2E_UBUNTU_HOSTS={','.join(sorted(only))}")
    reason = rootfs.archive_answers(host.release, timeout=PROBE_TIMEOUT)
    if reason:
        pytest.skip(f"no Ubuntu archive: {reason}")
    try:
        image, note, _ = image_with_site(name, host, proxy, site_repos, workdir)
        if note:
            print(f"\n{name}: {note}")
    except rootfs.ArchiveGap as gap:
        pytest.skip(f"no Ubuntu image with precompiled modules today: {gap}")
    root = rootfs.unpack(image, workdir / "hosts" / f"{name}-check")
    rootfs.use_proxy(root, proxy.apt_config())
    if name in site_repos:
        sitedriver.add_to_root(root, site_repos[name])
        apt_in(root, "apt-get", "update", "-q")  # a node in service has read its sources
    wheels = wheelhouse.cached_standin_wheelhouse(REPO, CACHE, host.python, True)
    wheelhouse.link_into(wheels, root, WHEELHOUSE_IN_HOST)
    runner.hgx_h100(root)
    group_vars = {
        **base_vars,
        "cuda_toolkit_repo_url": nvidia_repo.url,
        "cuda_toolkit_repo_key_checksum": nvidia_repo.key_checksum,
        "preflight_gpu_distributions": ["Ubuntu"],
    }
    scratch = ("root/.ansible",)
    before = rootfs.tree_digest(root, exclude=scratch)
    inventory = runner.write_inventory(
        workdir / f"ubuntu-check-{name}.yml", {f"{name}-check": root}, chroot_wrapper, group_vars,
        {f"{name}-check": {"nvidia_driver_branch": host.branch}},
    )
    result = runner.run_playbook(
        "provision.yml", inventory, ansible_home(f"ubuntu-check-{name}"), "--check", "--diff"
    )
    assert result.rc == 0, result
    assert result.recap[f"{name}-check"]["changed"] > 0, "check mode should report what it would change"
    after = rootfs.tree_digest(root, exclude=scratch)
    changed = rootfs.changed_paths(before, after)
    assert changed == [], f"check mode changed the root: {changed[:20]}"
    assert "a real run installs cuda-toolkit-12-8" in result.output
    # Canonical's driver is in the archive already: apt resolved it, in its simulation.
    simulated = re.search(r"Check mode: a real run installs ([^\"]*)", result.output)
    assert simulated and f"nvidia-utils-{host.branch}-server" in simulated.group(1), result


# --- A kernel ABI move under the real unattended-upgrades -------------------------------------
#
# unattended-upgrades installs in minimal steps: each upgradable package with what it drags along,
# in an order that iterates a Python set (upgrade_order in unattended-upgrade), so PYTHONHASHSEED
# decides whether the kernel's meta package (linux-image-virtual -> linux-image-<abi>) or the
# modules' meta package (linux-modules-nvidia-<branch>-server-open-generic -> ...-<abi>, which
# brings the kernel along) goes first; a step dpkg refuses ends the whole run ("Installing the
# upgrades failed!", every later step with it). The packages of the new ABI are stand-ins with the
# control fields of Canonical's (Depends as resolute's 7.0.0-14 and noble's 6.8.0-31 packages
# read); u-u (each release's own), apt, dpkg and the role's guard are real.
CANARY = "nodecert-e2e-canary"  # an unrelated update in the same run (curl's role on a real day)
# The new kernel's modules as Canonical builds them: for the installed driver ("fits"), or for a
# newer driver of the branch this node does not have (the archive's driver moved first, the role
# holds it). The newer version only has to be newer than the installed one.
NEWER_DRIVER = {"580": "580.196.07", "535": "535.288.01"}
# Each release's provisioned node whose kernel came with its meta package (a kernel ABI move
# reaches a node only through it), and the hash seeds tried: every ordering on 26.04 (seeds 0-2
# cover both), two seeds on the others (CI time).
UU_CASES = (
    [("resolute-release", "fits", seed) for seed in (0, 1, 2)]
    + [("resolute-release", "other-driver", seed) for seed in (0, 1)]
    + [(name, variant, seed) for name in ("jammy-image", "noble-release")
       for variant, seed in (("fits", 0), ("fits", 1), ("other-driver", 0))]
)


@dataclass(frozen=True)
class KernelMove:
    """The ABI the stand-in packages move a node to: the running kernel's version with ABI 999
    (linux-image-<abi> at <base>-999.999; the meta packages of the image's flavour at
    <base>.999.999, newer than the meta versions the releases use: 6.8.0-149.149~22.04.1 for
    jammy's HWE kernel, 6.8.0-31.31 on noble)."""

    branch: str
    kernel: str  # 7.0.0-999-generic
    version: str  # of linux-image-<kernel> and its modules: 7.0.0-999.999
    meta_version: str  # of the flavour's meta packages: 7.0.0.999.999
    kernel_meta: str = "virtual"  # linux-image-<kernel_meta>: virtual, virtual-hwe-22.04
    modules_flavour: str = "generic"  # linux-modules-nvidia-<branch>-server-open-<modules_flavour>

    @classmethod
    def of(cls, branch: str, running: str, kernel_meta: str, modules_flavour: str) -> KernelMove:
        base = running.split("-")[0]  # "7.0.0" of 7.0.0-14-generic
        return cls(branch, f"{base}-999-generic", f"{base}-999.999", f"{base}.999.999",
                   kernel_meta, modules_flavour)

    @property
    def modules(self) -> str:
        return f"linux-modules-nvidia-{self.branch}-server-open-{self.kernel}"

    @property
    def nvidia_ko(self) -> str:
        return f"lib/modules/{self.kernel}/kernel/nvidia-{self.branch}srv-open/nvidia.ko"


def kernel_move_packages(move: KernelMove, driver: str) -> list[aptrepo.Package]:
    prefix = f"linux-modules-nvidia-{move.branch}-server-open-"
    common = f"nvidia-kernel-common-{move.branch}-server"
    stub = ("stand-in\n", 0o644)
    return [
        aptrepo.Package(f"linux-modules-{move.kernel}", move.version,
                        files={f"lib/modules/{move.kernel}/kernel/stand-in.ko": stub}),
        aptrepo.Package(f"linux-image-{move.kernel}", move.version,
                        depends=[f"linux-modules-{move.kernel}"],
                        files={f"boot/vmlinuz-{move.kernel}": stub}),
        aptrepo.Package(f"linux-image-{move.kernel_meta}", move.meta_version,
                        depends=[f"linux-image-{move.kernel}"]),
        aptrepo.Package(
            move.modules,
            move.version,
            depends=[f"linux-image-{move.kernel} | linux-image-unsigned-{move.kernel}",
                     f"{common} (<= {driver}-1)", f"{common} (>= {driver})"],
            files={move.nvidia_ko: stub},
        ),
        aptrepo.Package(f"{prefix}{move.modules_flavour}", move.meta_version,
                        depends=[f"{move.modules} (= {move.version})", f"{common} (>= {driver})"]),
        aptrepo.Package(CANARY, "2.0", files={f"usr/share/doc/{CANARY}/version": ("2.0\n", 0o644)}),
    ]


def mount_overlay(lower: str, upper: Path, merged: Path) -> None:
    work = upper.with_name(upper.name + ".work")
    for path in (upper, work, merged):
        path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)


def build_kernel_move_layer(root: Path, base: Path, move: KernelMove, variant: str) -> Path:
    """The provisioned node with unattended-upgrades installed as Ubuntu ships it (told to take
    every origin, as the noble image is), the canary at 1.0, and a signed repository offering the
    new kernel ABI, its NVIDIA modules (built for the installed driver, or for a newer one) and the
    canary 2.0, its lists fetched (which runs the guard's blacklist hook): one overlay layer over
    the root, shared by every seed's run."""
    layer, merged = base / "layer", base / "prep"
    mount_overlay(str(root), layer, merged)
    try:
        common = f"nvidia-kernel-common-{move.branch}-server"
        installed = upstream(runner.package_version(merged, common))
        pool, build = merged / "srv/kernel-move", base / "build"
        pool.mkdir(parents=True)
        driver = installed if variant == "fits" else NEWER_DRIVER[move.branch]
        for package in kernel_move_packages(move, driver):
            aptrepo.build_deb(package, build, pool)
        canary_v1 = aptrepo.build_deb(aptrepo.Package(CANARY, "1.0"), build, base)
        aptrepo._index(pool, "nodecert kernel-move stand-in", "nodecert kernel-move stand-in")
        signer = aptrepo.Gpg("nodecert-kernel-move")
        try:
            signer.sign_release(pool)
            (merged / "etc/apt/keyrings").mkdir(parents=True, exist_ok=True)
            (merged / "etc/apt/keyrings/kernel-move.asc").write_bytes(signer.export_armored())
        finally:
            signer.close()
        (merged / "etc/apt/sources.list.d/kernel-move.list").write_text(
            "deb [signed-by=/etc/apt/keyrings/kernel-move.asc] file:/srv/kernel-move ./\n"
        )
        runner.preinstall_deb(merged, canary_v1)
        apt_in(merged, "apt-get", "install", "-y", "-q", "--no-install-recommends", "unattended-upgrades")
        (merged / "etc/apt/apt.conf.d/52nodecert-e2e-upgrade-everything").write_text(UPGRADE_EVERYTHING)
        apt_in(merged, "apt-get", "update", "-q")
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    return layer


@pytest.fixture(scope="module")
def kernel_move(ubuntu, workdir):
    """(host name, variant) -> (root, layer, move), built on first use."""
    layers: dict[tuple[str, str], Path] = {}

    def get(name: str, variant: str) -> tuple[Path, Path, KernelMove]:
        if name in ubuntu.skipped:
            pytest.skip(ubuntu.skipped[name])
        if ubuntu.second is None or ubuntu.second.rc != 0:
            pytest.skip(f"the {name} node was not provisioned")
        root = ubuntu.roots[name]
        note = rootfs.image_note(root)
        if note.get("meta") != "yes":
            pytest.skip(f"{name}'s kernel came without its meta package: no ABI move reaches it")
        kernel_meta, modules_flavour = note.get("flavour", "virtual generic").split()
        move = KernelMove.of(HOSTS[name].branch, ubuntu.kernels[name], kernel_meta, modules_flavour)
        if (name, variant) not in layers:
            try:
                layers[name, variant] = build_kernel_move_layer(
                    root, workdir / "kernel-move" / name / variant, move, variant
                )
            except subprocess.CalledProcessError as exc:
                if exc.cmd[:2] == ["mount", "-t"]:
                    pytest.skip(f"no overlay mounts here: {exc}")
                raise
        return root, layers[name, variant], move

    yield get
    subprocess.run(["rm", "-rf", "--one-file-system", str(workdir / "kernel-move")], check=False)


def run_unattended_upgrades(root: Path, layer: Path, upper: Path, seed: int):
    """Mount a fresh overlay (the layer over the root), run the real unattended-upgrade with this
    hash seed; return (merged root, what it said)."""
    merged = upper.with_name("root")
    mount_overlay(f"{layer}:{root}", upper, merged)
    run = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--kill-child", f"--mount-proc={merged}/proc",
         "chroot", str(merged), "unattended-upgrade", "--verbose"],
        capture_output=True, text=True, timeout=900,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": str(seed)},
    )
    log = merged / "var/log/unattended-upgrades/unattended-upgrades-dpkg.log"
    said = run.stdout + run.stderr + (log.read_text(errors="replace") if log.exists() else "")
    return merged, said


@pytest.mark.parametrize(("name", "variant", "seed"), UU_CASES)
def test_a_kernel_abi_move_under_unattended_upgrades(kernel_move, workdir, name, variant, seed):
    """Whatever order u-u's steps take (the hash seed), on each release with its own u-u: with
    modules built for the installed driver the new kernel gets in with them (nvidia.ko for the
    kernel the next boot lands in); with modules built only for a newer driver the kernel stays out
    (the guard's blacklist keeps u-u from trying it). Either way the driver stays held where it was
    and the unrelated update of the same run is applied."""
    root, layer, move = kernel_move(name, variant)
    base = workdir / "kernel-move" / name / variant / f"seed-{seed}"
    merged, said = run_unattended_upgrades(root, layer, base / "upper", seed)
    try:
        where = f"{name}, {variant}, seed {seed}:\n{said[-4000:]}"
        utils = f"nvidia-utils-{move.branch}-server"
        held_driver = runner.package_version(root, utils)
        assert "Installing the upgrades failed" not in said, where
        assert runner.package_version(merged, CANARY) == "2.0", where
        installed = runner.selections(merged)
        if variant == "fits":
            for package in (f"linux-image-{move.kernel}", move.modules):
                assert installed.get(package) == "install", f"{package} not installed; {where}"
            assert (merged / move.nvidia_ko).exists(), where
        else:
            assert f"linux-image-{move.kernel}" not in installed, where
            assert not (merged / f"boot/vmlinuz-{move.kernel}").exists(), where
            blacklist = (merged / "etc/apt/apt.conf.d/51nodecert-kernels-without-nvidia-modules").read_text()
            assert f'"linux-image-{move.kernel}$";' in blacklist, blacklist
        assert runner.package_version(merged, utils) == held_driver
        assert installed.get(utils) == "hold"
    finally:
        subprocess.run(["umount", "--lazy", str(merged)], check=False)
