"""Writing output files so that nobody else's file is ever written, and no half file is ever read.

Every report, HTML page, JUnit file and textfile goes through `write_text`:
  - a private temporary in the target directory (mkstemp: O_CREAT|O_EXCL, mode 0600, random
    name), so a name another user pre-created or symlinked there is never opened;
  - written, fsync'd, then renamed over the target (rename replaces a symlink, it never follows
    it), so readers see the old file or the new one, never a part;
  - mode 0600 unless the caller asks for more (a report names the host, its GPUs' serials and
    its environment);
  - an advisory lock (flock on the directory) around the rename, so concurrent writers of one
    report take turns;
  - on any failure (full disk, read-only directory, ...) the temporary is removed and the
    OSError raised, for the CLI to print as one line with exit 2.
  - a device node, FIFO, socket or directory at the target is refused, never replaced (as root,
    `--json /dev/null` would otherwise turn /dev/null into a 0600 regular file), and so is an
    empty name; a symlink is replaced, never followed (the CLIs refuse one named as an output:
    cliutil.output_file).
`confined(directory, name)` turns a name that comes from data (a host name) into a path that
cannot leave `directory`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

PRIVATE = 0o600


class UnsafePath(ValueError):
    """A name from data would put a file outside its directory."""


def confined(directory: str | Path, name: str) -> Path:
    """directory/name, refusing a name that is empty, hidden, has a path separator or `..`, or a
    NUL: such a name comes from data (a host name) and must not choose where a file lands."""
    if (not name or name in (".", "..") or name.startswith(".") or "/" in name
            or "\\" in name or "\0" in name or ".." in name):
        raise UnsafePath(f"refusing to write a file named {name!r} (not a plain file name)")
    return Path(directory) / name


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _refuse_unless_regular(text: str, path: Path) -> None:
    if not text:
        raise OSError(errno.EINVAL, "empty file name", text)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError:
        return  # unreadable parent etc.: the write below fails and says why
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        raise OSError(errno.EEXIST, "not a regular file; only regular files are replaced", text)


def write_bytes(path: str | Path, data: bytes, *, mode: int = PRIVATE) -> Path:
    _refuse_unless_regular(os.fspath(path), Path(path))
    path = Path(path)
    try:
        return _write(path, data, mode)
    except OSError as exc:  # name the file asked for, not the temporary
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def _write(path: Path, data: bytes, mode: int) -> Path:
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            if mode != PRIVATE:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        with _dir_lock(parent):
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    return path


def write_text(path: str | Path, text: str, *, mode: int = PRIVATE) -> Path:
    """Write `text` (UTF-8; a lone surrogate is written as its backslash escape, never an error)."""
    return write_bytes(path, text.encode("utf-8", errors="backslashreplace"), mode=mode)
