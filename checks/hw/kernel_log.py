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
# A /dev/kmsg record: "prio,seq,usec,flags[,more];message", continuation lines start with " ".
_KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
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


def _unescape(match: re.Match[str]) -> str:
    """kmsg writes bytes outside printable ASCII as \\xNN; keep control characters escaped."""
    code = int(match[1], 16)
    return chr(code) if 0x20 <= code < 0x7F else match[0]


def parse_kmsg(text: str) -> list[str]:
    """/dev/kmsg records as dmesg prints them ("[ seconds.micro] message"), kernel facility
    only (like `dmesg --kernel`); dictionary lines (leading space) and junk are skipped."""
    lines = []
    for raw in text.splitlines():
        match = _KMSG_RECORD.match(raw)
        if not match:
            continue
        prio, _seq, usec, message = int(match[1]), match[2], int(match[3]), match[4]
        if prio >> 3 != 0:  # facility: 0 is the kernel; user-space writes to /dev/kmsg are not
            continue
        message = _KMSG_ESCAPE.sub(_unescape, message)
        lines.append(f"[{usec // 1_000_000:5d}.{usec % 1_000_000:06d}] {message}")
    return lines
