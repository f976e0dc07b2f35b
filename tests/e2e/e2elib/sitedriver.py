"""A site's repository of the driver build it certified: Canonical's own .debs of an older version
of a -server branch, copied from Ubuntu's pool, indexed and signed here, served on 127.0.0.1.

Why: Ubuntu's archive lists one version of a package per pocket. On 2026-12-06, as this machine
reaches it, jammy-updates and jammy-security listed nvidia-*-580-server 580.196.07 and answered 404
for every file of it, while the pool still served 580.178.04 (the build Canonical's precompiled
modules for kernel 6.8.0-138 are made for: "nvidia-kernel-common-580-server (>= 580.178.04)"),
which no index listed any more. A node whose sources are that archive plus a repository keeping
the previous build (aptly or Pulp keeping earlier versions, a site mirror of what it certified) sees
both versions, the newest unserved: the situation the nvidia_driver role must handle by installing
the older one (tasks/served.yml). The files are Canonical's, byte for byte; only the index is made
here (apt-ftparchive), since no index of the archive lists them.
"""

from __future__ import annotations

import gzip
import http.server
import re
import shutil
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from e2elib import aptrepo

# Binary packages a node installs from each build: the server build's user space (the role's
# request: headless-no-dkms + utils) and the desktop build (what `ubuntu-drivers install` puts on a
# workstation, the jammy-image host's starting point); their dependencies within the same source
# come along.
ROOTS = {
    "nvidia-graphics-drivers-{branch}-server": ("nvidia-headless-no-dkms-{branch}-server-open",
                                                "nvidia-utils-{branch}-server"),
    "nvidia-graphics-drivers-{branch}": ("nvidia-driver-{branch}-open",),
}


def _stanzas(text: str) -> list[dict[str, str]]:
    out = []
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if "Package" in fields:
            out.append(fields)
    return out


def _dpkg_key(version: str):
    return [int(x) for x in re.findall(r"\d+", version)]


def _served(url: str, opener) -> str:
    """'' when the URL is served, else the answer."""
    try:
        with opener.open(urllib.request.Request(url, method="HEAD"), timeout=30):
            return ""
    except (urllib.error.URLError, OSError) as exc:
        return str(getattr(exc, "code", exc))


@dataclass(frozen=True)
class SiteDriver:
    newest: str  # the newest Debian version the archive lists, unserved
    unserved: str  # its nvidia-kernel-common file and the answer
    version: str  # the newest older Debian version the pool serves
    files: tuple[str, ...]  # pool paths of the build at `version`


def find(mirror: str, suite: str, pockets: tuple[str, ...], proxy_url: str, branch: str) -> SiteDriver | None:
    """None when the pool serves the newest nvidia-kernel-common-<branch>-server the pockets list;
    else the newest older version of the branch whose files the pool still serves (versions from the
    archive's versioned firmware packages, nvidia-firmware-<branch>-server-<version>, one per
    published build) and the files of ROOTS' closure at that version. RuntimeError when the pool
    serves no older build either."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    stanzas: list[dict[str, str]] = []
    for pocket in pockets:
        url = f"{mirror.rstrip('/')}/dists/{suite}{pocket}/restricted/binary-amd64/Packages.gz"
        with opener.open(url, timeout=60) as response:
            stanzas += _stanzas(gzip.decompress(response.read()).decode())
    common = [s for s in stanzas if s["Package"] == f"nvidia-kernel-common-{branch}-server"]
    if not common:
        return None
    newest = max(common, key=lambda s: _dpkg_key(s["Version"]))
    answer = _served(f"{mirror.rstrip('/')}/{newest['Filename']}", opener)
    if not answer:
        return None
    firmware = re.compile(rf"nvidia-firmware-{branch}-server-[0-9.]+")
    versions = sorted(
        {s["Version"] for s in stanzas if firmware.fullmatch(s["Package"])}, key=_dpkg_key, reverse=True
    )
    source = f"nvidia-graphics-drivers-{branch}-server"
    for version in (v for v in versions if _dpkg_key(v) < _dpkg_key(newest["Version"])):
        path = f"pool/restricted/n/{source}/nvidia-kernel-common-{branch}-server_{version}_amd64.deb"
        if _served(f"{mirror.rstrip('/')}/{path}", opener):
            continue
        files = _closure(stanzas, branch, newest["Version"], version)
        return SiteDriver(newest["Version"], f"{newest['Filename']}: {answer}", version, tuple(files))
    raise RuntimeError(f"the pool serves no build of branch {branch} below {newest['Version']} "
                       f"({newest['Filename']}: {answer})")


def _closure(stanzas: list[dict[str, str]], branch: str, newest: str, version: str) -> list[str]:
    """Pool paths, at `version`, of ROOTS and what they depend on within their source (read from
    the newest build's stanzas: the builds of one branch share their package names, but for the
    versioned firmware package)."""
    up_new, up_old = newest.split("-")[0], version.split("-")[0]
    files = []
    for source_pattern, roots in ROOTS.items():
        source = source_pattern.format(branch=branch)
        by_name = {
            s["Package"]: s
            for s in stanzas
            if s.get("Source", "").split(" ")[0] == source and s["Version"].split("-")[0] == up_new
        }
        todo, seen = [r.format(branch=branch) for r in roots], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in by_name:
                continue
            seen.add(name)
            depends = by_name[name].get("Pre-Depends", "") + ", " + by_name[name].get("Depends", "")
            todo += [d.strip().split(" ")[0] for d in re.split(r"[,|]", depends) if d.strip()]
        for name in sorted(seen):
            arch = by_name[name]["Architecture"]
            files.append(f"pool/restricted/n/{source}/{name.replace(up_new, up_old)}_{version}_{arch}.deb")
    return files


@dataclass
class Served:
    url: str
    key: bytes  # armoured signing key
    version: str
    _server: http.server.ThreadingHTTPServer

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def build_and_serve(site: SiteDriver, mirror: str, proxy_url: str, cache: Path, workdir: Path) -> Served:
    """The build's files (downloaded through the proxy once, kept in cache), indexed and signed in
    workdir, served on a free port of 127.0.0.1."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    cache.mkdir(parents=True, exist_ok=True)
    repo = workdir / "site-driver"
    repo.mkdir(parents=True)
    for path in site.files:
        kept = cache / Path(path).name
        if not kept.exists():
            partial = kept.with_suffix(".partial")
            url = f"{mirror.rstrip('/')}/{path}"
            with opener.open(url, timeout=300) as response, open(partial, "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
            partial.rename(kept)
        (repo / kept.name).hardlink_to(kept)
    aptrepo._index(repo, "nodecert site", "driver build the site certified")
    signer = aptrepo.Gpg("nodecert-site-driver")
    try:
        signer.sign_release(repo)
        key = signer.export_armored()
    finally:
        signer.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), aptrepo._quiet_handler(str(repo)))
    threading.Thread(target=server.serve_forever, daemon=True, name="site-driver-repo").start()
    return Served(f"http://127.0.0.1:{port}", key, site.version, server)


def add_to_root(root: Path, served: Served) -> None:
    """The site repository as the node's apt source, verified with its key."""
    (root / "etc/apt/keyrings").mkdir(parents=True, exist_ok=True)
    (root / "etc/apt/keyrings/nodecert-site-driver.asc").write_bytes(served.key)
    (root / "etc/apt/sources.list.d/nodecert-site-driver.list").write_text(
        f"deb [signed-by=/etc/apt/keyrings/nodecert-site-driver.asc] {served.url}/ ./\n"
    )
