"""Root filesystems that stand in for freshly installed hosts.

A root is built once with debootstrap and cached as a tarball under `.cache/e2e/` (git-ignored);
each test host unpacks its own copy in a few seconds.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Bump when the recipe below changes in a way the cache key does not capture.
RECIPE_VERSION = "1"

# What every root gets beyond minbase: Ansible's apt module needs python3-apt; the pytorch role's
# venv needs python3-venv and the pip module needs python3-packaging (the role also asks apt for
# them, so on a real host they come from the archive).
BASE_PACKAGES = ("python3", "python3-apt", "python3-venv", "python3-packaging")


@dataclass(frozen=True)
class Release:
    """One operating system the tests can target."""

    name: str  # e.g. "debian12", used in cache names and test ids
    suite: str  # debootstrap suite
    mirror: str
    # Debian 12 (the machine the tests run on) has no Ubuntu archive keyring (ubuntu-keyring is
    # not packaged for bookworm), so debootstrap cannot verify Ubuntu's Release files:
    # Ubuntu roots are built with --no-check-gpg. Inside the roots apt verifies normally.
    check_gpg: bool
    components: str = "main"
    # debootstrap script when bookworm's debootstrap has none for the suite (noble is newer than
    # it; Ubuntu's scripts for every release since gutsy are the same file).
    script: str = ""

    def release_url(self) -> str:
        return f"{self.mirror.rstrip('/')}/dists/{self.suite}/Release"


def debian_mirror(default: str = "http://deb.debian.org/debian") -> str:
    """The Debian mirror this machine already uses (deb822 or one-line sources)."""
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in candidates:
        uris = suites = None
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "URIs":
                uris = value.split()
            elif key.strip() == "Suites":
                suites = value.split()
        if uris and suites and "bookworm" in suites:
            return uris[0]
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        for line in sources_list.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[0] == "deb" and fields[2] == "bookworm":
                return fields[1]
    return default


DEBIAN_12 = Release("debian12", "bookworm", debian_mirror(), check_gpg=True)
UBUNTU_MIRROR = os.environ.get("NODECERT_E2E_UBUNTU_MIRROR", "http://archive.ubuntu.com/ubuntu")
# Release pocket only (no -updates/-security): what debootstrap fetches is fixed per release.
UBUNTU_2204 = Release("ubuntu2204", "jammy", UBUNTU_MIRROR, check_gpg=False, components="main,universe")
UBUNTU_2404 = Release(
    "ubuntu2404", "noble", UBUNTU_MIRROR, check_gpg=False, components="main,universe", script="gutsy"
)
UBUNTU_2604 = Release(
    "ubuntu2604", "resolute", UBUNTU_MIRROR, check_gpg=False, components="main,universe", script="gutsy"
)


def archive_answers(release: Release, timeout: float = 5.0) -> str | None:
    """None when the release's archive answers; otherwise the reason it does not."""
    try:
        with urllib.request.urlopen(release.release_url(), timeout=timeout) as response:
            if response.status == 200:
                return None
            return f"{release.release_url()} answered HTTP {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{release.release_url()} did not answer: {exc}"


def cached_tarball(release: Release, cache_dir: Path, packages: tuple[str, ...] = BASE_PACKAGES) -> Path:
    """Path of the release's root tarball, building it with debootstrap when it is not cached."""
    extra = [release.components, release.script] if release.components != "main" or release.script else []
    key = hashlib.sha256(
        "\n".join([RECIPE_VERSION, release.suite, release.mirror, *packages, *extra]).encode()
    ).hexdigest()[:12]
    cache_dir.mkdir(parents=True, exist_ok=True)
    tarball = cache_dir / f"rootfs-{release.name}-{key}.tar"
    # Two pytest runs at once must not both build (or read a half-written tarball).
    with open(cache_dir / f".{tarball.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tarball.exists():
            _build(release, packages, tarball)
    return tarball


def _build(release: Release, packages: tuple[str, ...], tarball: Path) -> None:
    work = tarball.with_suffix(".build")
    if work.exists():
        remove_root(work)
    command = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
    ]
    if not release.check_gpg:
        command.append("--no-check-gpg")
    if release.components != "main":
        command.append(f"--components={release.components}")
    command += [release.suite, str(work), release.mirror]
    if release.script:
        command.append(f"/usr/share/debootstrap/scripts/{release.script}")
    proc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        log = work / "debootstrap/debootstrap.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{tail}")
    # Build apt's binary caches now so that merely opening the cache on a host (python-apt does,
    # even in check mode) finds them current and writes nothing.
    subprocess.run(["chroot", str(work), "apt-cache", "stats"], check=True, stdout=subprocess.DEVNULL)
    partial = tarball.with_suffix(".partial")
    subprocess.run(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(work), "-cf", str(partial), "."],
        check=True,
    )
    partial.rename(tarball)
    remove_root(work)


# What a freshly installed Ubuntu cloud image has that debootstrap's minbase lacks: every component
# (main restricted universe multiverse) in the release, -updates and -security pockets, its
# packages upgraded, and a -generic kernel through its meta package linux-image-virtual (as cloud
# images carry it), or linux-image-virtual-hwe-<version> where only the HWE kernel's NVIDIA
# modules are served.
UBUNTU_IMAGE_RECIPE = "4"
IMAGE_NOTE = "var/lib/nodecert-e2e/image"  # what the image got, for the tests (key=value lines)
BRANCH = "580"  # the driver branch whose precompiled modules an image's kernel must have


def modules_for(branch: str = BRANCH) -> str:
    """The precompiled open modules of this -server branch (add -<kernel> or -generic)."""
    return f"linux-modules-nvidia-{branch}-server-open"


# The pockets a cloud image's sources name. RELEASE_POCKET_ONLY is a node installed from the
# release's own media and an archive mirror of that pocket alone (sites that mirror only what they
# certified): its files never change, so Ubuntu's archive serves all of them (the -updates and
# -security pool can lag the index, see ArchiveGap).
ALL_POCKETS = ("", "-updates", "-security")
RELEASE_POCKET_ONLY = ("",)
# A node that takes security updates only (sites that stage -updates, or leave it out): the
# release pocket and -security, which carries each driver and kernel security update with its
# modules.
SECURITY_POCKETS = ("", "-security")


def ubuntu_sources(release: Release, pockets: tuple[str, ...] = ALL_POCKETS) -> tuple[str, str]:
    """(path, content) of the apt sources an Ubuntu image of this release ships."""
    suites = [f"{release.suite}{pocket}" for pocket in pockets]
    components = "main restricted universe multiverse"
    if release.suite == "jammy":
        lines = [f"deb {release.mirror} {suite} {components}" for suite in suites]
        return "etc/apt/sources.list", "\n".join(lines) + "\n"
    return (
        "etc/apt/sources.list.d/ubuntu.sources",
        f"Types: deb\nURIs: {release.mirror}\nSuites: {' '.join(suites)}\nComponents: {components}\n"
        "Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n",
    )


def newest_kernel_meta(release: Release, proxy_url: str, pocket: str = "-updates") -> str:
    """Version of linux-image-virtual in the release's newest pocket the image takes (keys the image
    cache: a new kernel in the archive makes a new image)."""
    import lzma

    url = f"{release.mirror.rstrip('/')}/dists/{release.suite}{pocket}/main/binary-amd64/Packages.xz"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    with opener.open(url, timeout=60) as response:
        text = lzma.decompress(response.read()).decode()
    for stanza in text.split("\n\n"):
        if stanza.startswith("Package: linux-image-virtual\n"):
            return next(line.split(" ", 1)[1] for line in stanza.splitlines() if line.startswith("Version: "))
    raise RuntimeError(f"no linux-image-virtual in {url}")


def use_proxy(root: Path, apt_config: str) -> None:
    (root / "etc/apt/apt.conf.d/00nodecert-e2e-proxy").write_text(apt_config)


def image_note(root: Path) -> dict[str, str]:
    path = root / IMAGE_NOTE
    return dict(line.split("=", 1) for line in path.read_text().splitlines()) if path.exists() else {}


def _chroot(work: Path, *command: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={work}/proc", "chroot", str(work), *command],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} in {work} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return proc


def _fetchable(work: Path, *packages: str) -> str:
    """'' when the mirror serves every .deb apt would fetch for these packages, else the first
    URL it does not (mirrors lag: an index can name files the pool does not have yet)."""
    uris = _chroot(work, "apt-get", "download", "--print-uris", *packages).stdout
    for url in re.findall(r"^'(\S+)'", uris, re.M):
        request = urllib.request.Request(url, method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=30):
                pass
        except (urllib.error.URLError, OSError) as exc:
            return f"{url}: {getattr(exc, 'code', exc)}"
    return ""


class ArchiveGap(RuntimeError):
    """Ubuntu's archive serves a driver of the branch that no kernel has precompiled modules for
    yet: Canonical publishes linux-modules-nvidia-* after the driver (a security update of the
    driver, say), and -updates keeps only the newest driver. Until the modules follow, no image
    with the precompiled path can be built."""


# image tarball name (release, kernel meta version, pockets) -> why no image could be built: asked
# again, said at once.
_GAPS: dict[str, str] = {}


def kernel_flavours(release: Release) -> list[tuple[str, str]]:
    """(kernel meta suffix, NVIDIA modules meta suffix) of the flavours a cloud image can follow,
    in the order tried: the release's GA kernel (linux-image-virtual, ...-generic), then its HWE
    kernel (linux-image-virtual-hwe-22.04, ...-generic-hwe-22.04)."""
    version = f"{release.name[6:8]}.{release.name[8:]}"
    return [("virtual", "generic"), (f"virtual-hwe-{version}", f"generic-hwe-{version}")]


def _pick_kernel(
    work: Path, release: Release, branch: str = BRANCH, driver: str = ""
) -> tuple[list[str], dict[str, str]]:
    """The packages that give the image its kernel, and the note: the kernel meta package of the
    first flavour (kernel_flavours) whose kernel's NVIDIA modules (of this branch) and their meta
    package the mirror serves, else the newest -generic kernel whose modules it serves for the
    archive's current driver, or for `driver` (an upstream version the node's sources serve where
    the archive's newest is not: sitedriver), with no meta package."""
    modules = modules_for(branch)
    missing = ""
    for kernel_meta, modules_flavour in kernel_flavours(release):
        meta = f"{modules}-{modules_flavour}"
        depends = _chroot(work, "apt-cache", "depends", "--important", meta).stdout
        kernel = re.search(rf"{modules}-(\d\S*-generic)", depends)
        reason = (
            _fetchable(
                work, meta, *(f"{p}-{kernel.group(1)}" for p in (modules, "linux-image", "linux-modules"))
            )
            if kernel
            else f"apt offers no {meta}"
        )
        if not reason:
            note = {"kernel": kernel.group(1), "meta": "yes", "flavour": f"{kernel_meta} {modules_flavour}"}
            return [f"linux-image-{kernel_meta}"], note
        missing = missing or reason  # the GA flavour's reason is the one worth saying
    common = _chroot(work, "apt-cache", "policy", f"nvidia-kernel-common-{branch}-server").stdout
    offered = re.search(r"Candidate: ([0-9.]+)-", common)
    if offered is None and not driver:
        raise ArchiveGap(f"the archive offers no nvidia-kernel-common-{branch}-server ({missing})")
    driver = driver or offered.group(1)
    names = _chroot(work, "apt-cache", "pkgnames", f"{modules}-").stdout.split()
    kernels = [
        n.removeprefix(f"{modules}-") for n in names if re.fullmatch(rf"{modules}-\d\S*-generic", n)
    ]
    for candidate in sorted(kernels, key=lambda k: [int(x) for x in re.findall(r"\d+", k)], reverse=True):
        shown = _chroot(work, "apt-cache", "show", "--no-all-versions", f"{modules}-{candidate}").stdout
        if f"nvidia-kernel-common-{branch}-server (>= {driver})" not in shown:
            continue
        if not _fetchable(work, *(f"{p}-{candidate}" for p in (modules, "linux-image", "linux-modules"))):
            note = {"kernel": candidate, "meta": f"no: the mirror does not serve {missing}"}
            return [f"linux-image-{candidate}"], note
    raise ArchiveGap(f"the archive serves nvidia-kernel-common-{branch}-server {driver} but no "
                     f"{modules}-<kernel> built for it that its pool serves yet (Canonical publishes "
                     f"them after the driver, and mirrors can list files their pool lacks: {missing})")


def _dpkg_newer(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b], check=False).returncode == 0


def unserved_driver(
    release: Release, proxy_url: str, pockets: tuple[str, ...] = ALL_POCKETS, branch: str = BRANCH
) -> str:
    """'' when the pool serves the newest nvidia-kernel-common-<branch>-server the image's pockets list,
    else that file's URL and the answer. Seconds, where finding the same gap by building the image
    takes minutes (apt-get update and upgrade first): when the driver itself is not served, no
    kernel's modules can be installed with it."""
    import gzip

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    newest: tuple[str, str] | None = None
    for pocket in pockets:
        dists = f"{release.mirror.rstrip('/')}/dists/{release.suite}{pocket}"
        url = f"{dists}/restricted/binary-amd64/Packages.gz"
        with opener.open(url, timeout=60) as response:
            text = gzip.decompress(response.read()).decode()
        for stanza in text.split("\n\n"):
            if not stanza.startswith(f"Package: nvidia-kernel-common-{branch}-server\n"):
                continue
            fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
            if newest is None or _dpkg_newer(fields["Version"], newest[0]):
                newest = (fields["Version"], fields["Filename"])
    if newest is None:
        return ""  # nothing of the branch listed: _pick_kernel says what is missing
    url = f"{release.mirror.rstrip('/')}/{newest[1]}"
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=30):
            return ""
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'code', exc)}"


def cached_ubuntu_image(
    release: Release,
    cache_dir: Path,
    proxy_url: str,
    apt_config: str,
    pockets: tuple[str, ...] = ALL_POCKETS,
    branch: str = BRANCH,
    driver: str = "",
) -> Path:
    """A tarball of an Ubuntu root that looks like a fresh cloud image (sources and a kernel with
    precompiled modules of the branch, see _pick_kernel), built from the debootstrap root, keyed by
    the archive's current kernel. driver: the upstream version of the branch the node's sources
    serve where the archive's newest is not (the kernel is one whose modules are built for it)."""
    missing = "" if driver else unserved_driver(release, proxy_url, pockets, branch)
    if missing:
        raise ArchiveGap(
            f"the archive lists a driver its pool does not serve ({missing}): no kernel's "
            "precompiled modules can be installed with it"
        )
    base = cached_tarball(release, cache_dir)
    newest_pocket = "-updates" if "-updates" in pockets else pockets[-1]
    meta_version = newest_kernel_meta(release, proxy_url, newest_pocket)
    parts = [UBUNTU_IMAGE_RECIPE, base.name, meta_version, *(() if pockets == ALL_POCKETS else pockets)]
    parts += [] if branch == BRANCH else [f"branch {branch}"]
    parts += [f"driver {driver}"] if driver else []
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    tarball = cache_dir / f"image-{release.name}-{key}.tar"
    with open(cache_dir / f".{tarball.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        if tarball.name in _GAPS:
            raise ArchiveGap(_GAPS[tarball.name])
        work = unpack(base, tarball.with_suffix(".build"))
        path, content = ubuntu_sources(release, pockets)
        (work / "etc/apt/sources.list").write_text("")
        (work / path).write_text(content)
        use_proxy(work, apt_config)
        _chroot(work, "apt-get", "update", "-q")
        # Current, as a freshly published cloud image is (debootstrap took the release pocket).
        _chroot(work, "apt-get", "upgrade", "-y", "-q", "--no-install-recommends")
        try:
            packages, note = _pick_kernel(work, release, branch, driver)
        except ArchiveGap as gap:
            _GAPS[tarball.name] = str(gap)
            remove_root(work)
            raise
        _chroot(work, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages)
        _chroot(work, "apt-get", "clean")
        _chroot(work, "apt-cache", "stats")
        (work / IMAGE_NOTE).parent.mkdir(parents=True, exist_ok=True)
        (work / IMAGE_NOTE).write_text("".join(f"{k}={v}\n" for k, v in note.items()))
        (work / "etc/apt/apt.conf.d/00nodecert-e2e-proxy").unlink()
        partial = tarball.with_suffix(".partial")
        subprocess.run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(work), "-cf", str(partial), "."], check=True
        )
        partial.rename(tarball)
        remove_root(work)
    return tarball


def ubuntu_image_or_fallback(
    release: Release,
    cache_dir: Path,
    proxy_url: str,
    apt_config: str,
    pockets: tuple[str, ...],
    fallback: tuple[str, ...] | None,
    branch: str = BRANCH,
    driver: str = "",
) -> tuple[Path, str]:
    """(cached_ubuntu_image of these pockets, '') -- or, when they list a driver the pool does not
    serve and there is a fallback, the image of the fallback pockets and a note saying why.
    ArchiveGap when neither can be built."""
    try:
        return cached_ubuntu_image(release, cache_dir, proxy_url, apt_config, pockets, branch, driver), ""
    except ArchiveGap as gap:
        if fallback is None:
            raise
        tarball = cached_ubuntu_image(release, cache_dir, proxy_url, apt_config, fallback, branch, driver)
        suites = " ".join(f"{release.suite}{pocket}" for pocket in fallback)
        return tarball, f"built from {suites} alone: {gap}"


def unpack(tarball: Path, dest: Path) -> Path:
    """A fresh copy of the root at dest."""
    if dest.exists():
        remove_root(dest)
    dest.mkdir(parents=True)
    subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(dest), "-xf", str(tarball)], check=True)
    return dest


def remove_root(root: Path) -> None:
    """Delete a root, refusing to descend into anything still mounted inside it."""
    root = root.resolve()
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            mountpoint = line.split()[1]
            if mountpoint == str(root) or mountpoint.startswith(f"{root}/"):
                raise RuntimeError(f"{mountpoint} is still mounted; unmount it before removing {root}")
    shutil.rmtree(root)


def tree_digest(root: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """Map of relative path -> type, mode, owner and content (or link target) digest.

    Compared before and after a run, any difference means the run changed the root.
    """
    result: dict[str, str] = {}
    root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if os.path.normpath(os.path.join(rel_dir, d)) not in exclude)
        for name in [*dirnames, *sorted(filenames)]:
            path = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in exclude:
                continue
            st = os.lstat(path)
            head = f"{stat.filemode(st.st_mode)} {st.st_uid}:{st.st_gid}"
            if stat.S_ISLNK(st.st_mode):
                result[rel] = f"{head} -> {os.readlink(path)}"
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256()
                with open(path, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                result[rel] = f"{head} {digest.hexdigest()}"
            else:
                result[rel] = head
    return result


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths whose tree_digest entries differ (added, removed or changed), sorted."""
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


def pretend_os(root: Path, distribution_id: str, name: str, version_id: str, codename: str) -> None:
    """Make the root claim another OS release (the fault case for an unsupported OS)."""
    os_release = root / "etc/os-release"
    os_release.unlink()
    os_release.write_text(
        f'NAME="{name}"\nVERSION="{version_id}"\nID={distribution_id}\nID_LIKE=debian\n'
        f'PRETTY_NAME="{name} {version_id}"\nVERSION_ID="{version_id}"\nVERSION_CODENAME={codename}\n'
    )
    (root / "etc/debian_version").unlink(missing_ok=True)
