"""The suite against NVIDIA's real libnvidia-ml.so.1 on this driverless machine.

Canonical ships NVIDIA's user-space libraries in Ubuntu's archive (restricted component). The
test takes the NVML library from one of those packages, checked against the SHA256 in the
archive's Packages index, and runs the suite with it in a subprocess while a fake sysfs tree
shows one H100 on the PCI bus. With no kernel module and no /dev/nvidia*, the real library must
answer DRIVER_NOT_LOADED, driver-loaded must FAIL saying so, and nothing may crash.
Skipped, with the reason, when the archive does not answer.

Run as root, NVIDIA's library creates /dev/nvidiactl when it is missing (seen on this machine).
So as root the subprocess runs in a user namespace (`unshare --user --map-root-user`), where
it cannot create device nodes; the test checks that /dev gained no nvidia node.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import fakesys
import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "nvml-lib"  # git-ignored (.cache/)
ARCHIVE = os.environ.get("NODECERT_UBUNTU_ARCHIVE", "http://archive.ubuntu.com/ubuntu")
# Where the package is taken from, first served first: noble's current build, else 26.04's release
# pocket (580.126.20), whose files never change, so the test runs on a day when noble-updates
# lists a build its pool does not serve yet.
INDEXES = (
    "dists/noble-updates/restricted/binary-amd64/Packages.gz",
    "dists/resolute/restricted/binary-amd64/Packages.gz",
)
PACKAGE = "libnvidia-compute-580-server"  # Provides: libnvidia-ml.so.1
LIBDIR = "usr/lib/x86_64-linux-gnu"

pytestmark = pytest.mark.slow


def _fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _stanza(index: bytes, package: str, name: str) -> dict[str, str]:
    for block in gzip.decompress(index).decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines()
                      if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package:
            return fields
    raise LookupError(f"{package} is not in {name}")


def _served_deb() -> tuple[dict[str, str], Path]:
    """The index entry of PACKAGE and its verified .deb, from the first of INDEXES whose pool
    serves it (cached)."""
    unserved = []
    for name in INDEXES:
        try:
            index = _fetch(f"{ARCHIVE}/{name}", timeout=20)
        except (urllib.error.URLError, OSError) as exc:
            pytest.skip(f"Ubuntu archive {ARCHIVE} does not answer: {exc}")
        entry = _stanza(index, PACKAGE, name)
        deb = CACHE / Path(entry["Filename"]).name
        if deb.exists() and hashlib.sha256(deb.read_bytes()).hexdigest() == entry["SHA256"]:
            return entry, deb
        CACHE.mkdir(parents=True, exist_ok=True)
        part = deb.with_suffix(".part")
        try:
            part.write_bytes(_fetch(f"{ARCHIVE}/{entry['Filename']}", timeout=600))
        except (urllib.error.URLError, OSError) as exc:
            # The index can name a file the mirror does not serve (2026-12-04: noble-updates listed
            # 580.196.07 and its pool answered 404; 570-server and 535-server had become
            # transitional packages depending on it): the archive's state, not this code's.
            unserved.append(f"{entry['Filename']}: {exc}")
            continue
        digest = hashlib.sha256(part.read_bytes()).hexdigest()
        assert digest == entry["SHA256"], f"{deb.name}: SHA256 {digest}, index says {entry['SHA256']}"
        part.rename(deb)
        return entry, deb
    pytest.skip(f"Ubuntu archive {ARCHIVE} serves none of: {'; '.join(unserved)}")


@pytest.fixture(scope="module")
def nvml_libdir() -> Path:
    """A directory holding the real libnvidia-ml.so.1, verified and extracted once."""
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    entry, deb = _served_deb()
    libdir = CACHE / entry["Version"]
    if (libdir / "libnvidia-ml.so.1").exists():
        return libdir
    # Only the NVML files of the package (dpkg-deb -x would unpack all ~330 MB).
    staging = CACHE / f"{entry['Version']}.part"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    tar = subprocess.run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -x -C '{staging}' "
                         f"--wildcards './{LIBDIR}/libnvidia-ml.so*'", shell=True,
                         capture_output=True, text=True, check=False)
    assert tar.returncode == 0, tar.stderr
    (staging / LIBDIR).rename(libdir)
    shutil.rmtree(staging)
    assert (libdir / "libnvidia-ml.so.1").exists(), sorted(p.name for p in libdir.iterdir())
    return libdir


def _env(libdir: Path) -> dict[str, str]:
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir), "PYTHONPATH": str(ROOT)}


def _unprivileged(argv: list[str]) -> list[str]:
    """argv as a process that cannot create /dev nodes."""
    if os.geteuid() != 0:
        return argv
    wrap = ["unshare", "--user", "--map-root-user"]
    if shutil.which("unshare") is None or subprocess.run(
            [*wrap, "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("running as root without user namespaces: NVIDIA's library would create "
                    "/dev/nvidiactl on this machine")
    return [*wrap, *argv]


def _nvidia_nodes() -> set[str]:
    return {p.name for p in Path("/dev").glob("nvidia*")}


@pytest.fixture(autouse=True)
def no_device_node_created() -> Iterator[None]:
    before = _nvidia_nodes()
    yield
    assert _nvidia_nodes() == before, "the NVML library created device nodes in /dev"


def test_real_library_answers_driver_not_loaded(nvml_libdir: Path) -> None:
    probe = ("import pynvml\n"
             "try:\n    pynvml.nvmlInit()\n"
             "except pynvml.NVMLError as exc:\n    print(exc.value, exc)\n"
             "else:\n    print('initialised')\n"
             "print(pynvml.nvmlLib._name)\n"
             "print(*[l.split()[-1] for l in open('/proc/self/maps') if 'libnvidia-ml' in l][:1])\n")
    proc = subprocess.run(_unprivileged([sys.executable, "-c", probe]), env=_env(nvml_libdir),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    answer, name, mapped = proc.stdout.splitlines()
    assert answer == "9 Driver Not Loaded"  # NVML_ERROR_DRIVER_NOT_LOADED
    assert name == "libnvidia-ml.so.1" and mapped.startswith(str(nvml_libdir))


def test_suite_with_the_real_library_and_no_driver(nvml_libdir: Path, tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has the NVIDIA kernel driver loaded")
    sys_pci = tmp_path / "sys-pci"
    fakesys.gpu(sys_pci, "0000:18:00.0", 0x2330)  # H100 SXM5 80GB
    report = tmp_path / "report.json"
    proc = subprocess.run(
        _unprivileged([sys.executable, str(ROOT / "tests" / "hw" / "run_on_sysfs.py"),
                       str(sys_pci), "--level", "quick", "--json", str(report), "--quiet"]),
        env=_env(nvml_libdir), cwd=tmp_path, capture_output=True, text=True, timeout=300,
        check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stderr
    checks = {c["id"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["pci-gpus"]["status"] == "PASS"
    loaded = checks["driver-loaded"]
    assert loaded["status"] == "FAIL"
    (result,) = loaded["results"]
    assert "the NVIDIA kernel driver is not loaded" in result["message"]
    assert result["value"] == "driver_not_loaded"
    crashed = [(c["id"], r["message"]) for c in checks.values() for r in c["results"]
               if "crashed" in r["message"] or "did not finish" in r["message"]]
    assert crashed == []
    assert checks["nvlink"]["status"] == "SKIP"  # blocked by driver-loaded, not PASS
