"""This boot's kernel messages, from the first source that can actually give them.

Order: `journalctl -k -b` (this boot only, survives ring-buffer wrap), then `dmesg --kernel`
(the ring buffer), then /dev/kmsg read directly (what dmesg reads, for hosts without util-linux).
A source that answers with nothing is treated as failed, never as "no messages": the kernel
always logs its own boot banner, so an empty answer means no access, not a quiet kernel.
Known empty answers: journalctl prints "-- No entries --" and exits 0 without journal access
(systemd#17442) or when the journal was vacuumed; dmesg exits 1 with "Operation not permitted"
under kernel.dmesg_restrict=1 and in containers.

Everything that touches the machine is a parameter (command names resolved on PATH, the kmsg
path), so tests drive the chain with fake executables and a temporary file or FIFO.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from checks.hw.base import HardwareError

KMSG = Path("/dev/kmsg")
JOURNALCTL_ARGS = ("-k", "-b", "--no-pager", "-o", "short-monotonic")
DMESG_ARGS = ("--kernel",)
# journalctl's own notes ("-- No entries --", "-- Logs begin at ... --", "-- Boot ... --").
_JOURNAL_NOTE = re.compile(r"^-- .* --$")
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
KMSG_READ_SIZE = 8192  # one record per read() on the device; larger than any record
KMSG_MAX_BYTES = 64 << 20  # stop even if something keeps writing
KMSG_DEADLINE_S = 10.0


class KernelLog(list[str]):
    """The lines, plus which source gave them and why the ones before it did not."""

    def __init__(self, lines: list[str], source: str, skipped: list[str] | None = None) -> None:
        super().__init__(lines)
        self.source = source
        self.skipped = list(skipped or [])


@dataclass
class _Attempt:
    lines: list[str] | None
    why: str  # why it failed (empty on success)


def read_kernel_log(journalctl: str = "journalctl", dmesg: str = "dmesg",
                    kmsg: Path = KMSG, timeout_s: float = 30.0) -> KernelLog:
    """Kernel messages of this boot; HardwareError naming every source tried when none answers."""
    return chain((
        (f"{journalctl} {' '.join(JOURNALCTL_ARGS[:2])}",
         lambda: _journalctl(journalctl, timeout_s)),
        (f"{dmesg} {' '.join(DMESG_ARGS)}", lambda: _dmesg(dmesg, timeout_s)),
        (str(kmsg), lambda: _kmsg(kmsg)),
    ))


def chain(sources: Sequence[tuple[str, Callable[[], _Attempt]]]) -> KernelLog:
    """The first source that gives lines; the fixture backend feeds recorded answers through
    the same chain, so a scenario's "-- No entries --" is judged as on a real host."""
    tried: list[str] = []
    for name, read in sources:
        attempt = read()
        if attempt.lines:
            return KernelLog(attempt.lines, name, tried)
        tried.append(f"{name}: {attempt.why}")
    raise HardwareError("cannot read this boot's kernel log: " + "; ".join(tried)
                        + " (run as root or in the adm/systemd-journal group, "
                          "or set kernel.dmesg_restrict=0)")


def _run(command: str, args: tuple[str, ...], timeout_s: float) -> subprocess.CompletedProcess[str] | str:
    """The finished process, or a one-line reason it could not run."""
    path = shutil.which(command)
    if path is None:
        return "not installed"
    try:
        return subprocess.run([path, *args], capture_output=True, text=True, errors="replace",
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _journalctl(command: str, timeout_s: float) -> _Attempt:
    proc = _run(command, JOURNALCTL_ARGS, timeout_s)
    if isinstance(proc, str):
        return _Attempt(None, proc)
    return journal_answer(proc)


def journal_answer(proc: subprocess.CompletedProcess[str]) -> _Attempt:
    """What journalctl's exit status and output mean."""
    lines = [line for line in proc.stdout.splitlines() if not _JOURNAL_NOTE.match(line.strip())]
    if proc.returncode != 0:
        return _Attempt(None, f"exit {proc.returncode}: "
                              f"{_first_line(proc.stderr) or _first_line(proc.stdout)}")
    if not any(line.strip() for line in lines):
        note = _first_line(proc.stdout) or "no output"
        hint = _first_line(proc.stderr)
        return _Attempt(None, f"{note} (no journal access, or the journal holds nothing for this "
                              f"boot{': ' + hint if hint else ''})")
    return _Attempt(lines, "")


def _dmesg(command: str, timeout_s: float) -> _Attempt:
    proc = _run(command, DMESG_ARGS, timeout_s)
    if isinstance(proc, str):
        return _Attempt(None, proc)
    return dmesg_answer(proc)


def dmesg_answer(proc: subprocess.CompletedProcess[str]) -> _Attempt:
    """What dmesg's exit status and output mean."""
    if proc.returncode != 0:
        return _Attempt(None, f"exit {proc.returncode}: "
                              f"{_first_line(proc.stderr) or 'no message'}")
    lines = proc.stdout.splitlines()
    if not any(line.strip() for line in lines):
        return _Attempt(None, "printed nothing")
    return _Attempt(lines, "")


def _kmsg(path: Path) -> _Attempt:
    """Read every record now in the buffer: non-blocking reads until EAGAIN (the device) or
    end of file (a plain file in tests); EPIPE means a record was overwritten, read on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return _Attempt(None, "not present (containers often have no /dev/kmsg)")
    except PermissionError:
        return _Attempt(None, "permission denied (kernel.dmesg_restrict=1?)")
    except OSError as exc:
        return _Attempt(None, exc.strerror or str(exc))
    chunks: list[bytes] = []
    total = 0
    deadline = time.monotonic() + KMSG_DEADLINE_S
    try:
        while total < KMSG_MAX_BYTES and time.monotonic() < deadline:
            try:
                chunk = os.read(fd, KMSG_READ_SIZE)
            except BlockingIOError:
                break  # EAGAIN: every record present has been read
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # the next record was overwritten while we read; go on
                if exc.errno == errno.EPERM:
                    return _Attempt(None, "permission denied (kernel.dmesg_restrict=1?)")
                return _Attempt(None, exc.strerror or str(exc))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    lines = parse_kmsg(b"".join(chunks).decode("utf-8", errors="replace"))
    if not lines:
        return _Attempt(None, "no kernel records")
    return _Attempt(lines, "")


def _decode(message: str) -> list[str]:
    """The text of one record as the kernel meant it: \\xNN escapes (the kernel escapes every
    byte below 0x20, 0x7f and above, and the backslash) back to bytes, UTF-8 decoded; an escaped
    newline splits the record into lines (the driver logs some messages as one multi-line
    record); other control characters stay escaped so they cannot forge a line."""
    out = bytearray()
    pos = 0
    for match in _KMSG_ESCAPE.finditer(message):
        out += message[pos:match.start()].encode("utf-8", errors="replace")
        code = int(match[1], 16)
        out += (bytes([code]) if code == 0x0A or code == 0x09 or 0x20 <= code != 0x7F
                else match[0].encode())
        pos = match.end()
    out += message[pos:].encode("utf-8", errors="replace")
    lines = out.decode("utf-8", errors="replace").split("\n")
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    return lines


def _kmsg_header(head: str) -> tuple[int, int, str] | None:
    """(priority, microseconds, flags) of "prio,seq,usec,flags[,more]", None if it is not one."""
    fields = head.split(",", 4)
    if len(fields) < 4 or not all(f.isascii() and f.isdigit() and len(f) <= 20
                                  for f in fields[:3]):
        return None
    return int(fields[0]), int(fields[2]), fields[3]


def parse_kmsg(text: str) -> list[str]:
    """/dev/kmsg records as dmesg prints them ("[ seconds.micro] message"), kernel facility
    only (like `dmesg --kernel`). A record is "prio,seq,usec,flags;text" (the kernel's
    Documentation/ABI/testing/dev-kmsg); lines starting with a space are its dictionary
    (SUBSYSTEM=, DEVICE=), not messages; a multi-line record gives one line per line of text,
    each with the record's time; a "+" record (continuation fragment, older kernels) is appended
    to the line it continues. Anything else is skipped."""
    lines: list[str] = []
    continuing = False
    for raw in text.splitlines():
        if raw.startswith(" "):
            continue
        head, found, message = raw.partition(";")
        header = _kmsg_header(head) if found else None
        if header is None:
            continue
        prio, usec, flags = header
        if prio >> 3 != 0:  # facility: 0 is the kernel; user-space writes to /dev/kmsg are not
            continuing = False
            continue
        parts = _decode(message)
        if flags.startswith("+") and continuing and lines:
            lines[-1] += parts.pop(0)
        stamp = f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}]"
        lines.extend(f"{stamp} {part}" for part in parts)
        continuing = flags.startswith(("c", "+"))
    return lines


# --- GPU reset markers -------------------------------------------------------------------------
# The remediation loop (checks/fleet/remediate_actions.py) resets a GPU and records a marker: this boot's
# id, the kernel clock when the reset had finished, the GPU. A line that names that GPU's PCI
# address and was logged before its reset belongs to the fault the reset cured: the kernel-log
# checks set it aside (and say so), so the XID that caused the reset does not fail every check
# until the next reboot. Lines without a timestamp and lines naming no GPU address are kept.

ENV_STATE_DIR = "NODECERT_STATE_DIR"  # the Slurm wrappers' --state-dir, which they export
DEFAULT_STATE_DIR = "/var/lib/nodecert"
RESETS = "gpu-resets.json"
RESETS_KEPT = 64  # markers kept per file; only this boot's count
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_CLOCK = re.compile(r"^\s*\[\s*(\d{1,10}\.\d{1,9})\]")
_BUS = re.compile(r"^(?:([0-9a-f]{4,5}):)?([0-9a-f]{2}):([0-9a-f]{2})(?:\.[0-7])?$")


@dataclass(frozen=True)
class ResetMarker:
    boot_id: str
    clock_s: float  # the kernel log's clock when the reset had finished
    uuid: str
    pci: str  # dddd:bb:dd.f, as NVML and the kernel print it
    at: str  # wall-clock time, for people


def line_clock(line: str) -> float | None:
    """The seconds-since-boot stamp of a dmesg or journalctl -o short-monotonic line."""
    match = _CLOCK.match(line)
    return float(match[1]) if match else None


def boot_id(path: Path = BOOT_ID) -> str:
    """This boot's id (a reboot makes every earlier marker void); "" when unreadable."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def state_dir() -> Path:
    return Path(os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR)


def _read_markers(directory: Path) -> list[dict[str, object]]:
    try:
        data = json.loads((directory / RESETS).read_text())
    except (OSError, ValueError):
        return []
    return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []


def reset_markers(directory: Path | None = None, boot: str | None = None) -> list[ResetMarker]:
    """This boot's reset markers in the state directory (none when it has no file, or an
    unreadable one: then every line is judged)."""
    boot = boot_id() if boot is None else boot
    found = []
    for m in _read_markers(directory or state_dir()):
        try:
            marker = ResetMarker(str(m["boot_id"]), float(m["clock_s"]),  # type: ignore[arg-type]
                                 str(m["uuid"]), str(m["pci"]).lower(), str(m.get("at", "")))
        except (KeyError, TypeError, ValueError):
            continue
        if boot and marker.boot_id == boot and _BUS.match(marker.pci):
            found.append(marker)
    return found


def record_reset(directory: Path, marker: ResetMarker) -> None:
    """Add a marker (the file replaced atomically; earlier boots' markers dropped)."""
    kept = [m for m in _read_markers(directory) if m.get("boot_id") == marker.boot_id]
    kept.append(dict(marker.__dict__))
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{RESETS}.{os.getpid()}"
    tmp.write_text(json.dumps(kept[-RESETS_KEPT:]))
    os.replace(tmp, directory / RESETS)


def _names(line: str, marker: ResetMarker) -> bool:
    match = _BUS.match(marker.pci)
    assert match is not None  # reset_markers keeps only readable addresses
    domain, bus, dev = match.groups()
    pattern = rf"(?<![0-9a-f])(?:{domain}:)?{bus}:{dev}(?![0-9a-f:])"
    return re.search(pattern, line.lower()) is not None


def since_resets(lines: list[str], markers: list[ResetMarker]) -> tuple[list[str], list[str]]:
    """(lines judged, lines set aside): a line is set aside when it names a reset GPU's address
    and its stamp is not after that GPU's last reset. A KernelLog keeps its source."""
    if not markers:
        return lines, []
    last: dict[str, ResetMarker] = {}
    for marker in markers:
        if marker.pci not in last or marker.clock_s > last[marker.pci].clock_s:
            last[marker.pci] = marker
    kept: list[str] = []
    aside: list[str] = []
    for line in lines:
        clock = line_clock(line)
        before = clock is not None and any(
            clock <= m.clock_s and _names(line[:4096], m) for m in last.values())
        (aside if before else kept).append(line)
    if isinstance(lines, KernelLog):
        return KernelLog(kept, lines.source, lines.skipped), aside
    return kept, aside


def after_resets(lines: list[str]) -> tuple[list[str], dict[str, object] | None]:
    """What a kernel-log check judges: `lines` less those set aside by this boot's reset markers
    (the state directory of $NODECERT_STATE_DIR, else /var/lib/nodecert), and, when any were,
    the details that say so (which resets, how many lines)."""
    markers = reset_markers()
    judged, aside = since_resets(lines, markers)
    if not aside:
        return judged, None
    return judged, {"lines_before_gpu_reset": len(aside),
                    "gpu_resets": [{"uuid": m.uuid, "pci": m.pci, "clock_s": m.clock_s,
                                    "at": m.at} for m in markers]}
