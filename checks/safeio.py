"""Writing output files so that nobody else's file is ever written, and no half file is ever read.

Every report, HTML page, JUnit file and textfile goes through `write_text`:
  - a private temporary in the target directory (mkstemp: O_CREAT|O_EXCL, mode 0600, random
    name), so a name another user pre-created or symlinked there is never opened;
  - written, fsync'd, then renamed over the target (rename replaces a symlink, it never follows
    it), so readers see the old file or the new one, never a part;
  - mode 0600 unless the caller asks for more (a report names the host, its GPUs' serials and
    its environment);
  - an advisory lock (flock on the directory) around the rename, so concurrent writers of one
    report take turns; it is tried without blocking until LOCK_WAIT_S has passed, then the write
    fails with one line (any local user can flock a shared directory such as /tmp: a run must not
    hang on it);
  - a file another run wrote after this run named it as its output (`remember`, called when the
    CLI's options are parsed: cliutil.output_file) is never replaced: two runs writing one
    report would otherwise keep the one that finished last, a PASS hiding a FAIL. The later run
    keeps its own file beside it, `<name>.concurrent-<pid>-<time>` (not read as a report), and
    fails with one line naming both (ConcurrentWrite);
  - on any failure (full disk, read-only directory, ...) the temporary is removed and the
    OSError raised, for the CLI to print as one line with exit 2.
  - a device node, FIFO, socket or directory at the target is refused, never replaced (as root,
    `--json /dev/null` would otherwise turn /dev/null into a 0600 regular file), and so is an
    empty name; a symlink is replaced, never followed (the CLIs refuse one named as an output:
    cliutil.output_file).
`confined(directory, name)` turns a name that comes from data (a host name) into a path that
cannot leave `directory`.

`refuse_untrusted(path)`: run as root, nodecert refuses to read or write a reports tree, history
or Slurm state directory that another user could change under it: one that they own, or that
their group or everyone may write without the sticky bit (so they could rename, replace or
symlink what is in it), or such a directory above it (docs/operations.md, "Who may write").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

PRIVATE = 0o600
LOCK_WAIT_S = 10.0  # a rename takes microseconds: a lock held longer is not another writer of ours
_LOCK_POLL_S = 0.05

Identity = tuple[int, int, int, int] | None  # (device, inode, mtime ns, size); None: no file
# output path (absolute) -> the file there when this run named it, or last wrote it itself
_expected: dict[str, Identity] = {}


class ConcurrentWrite(OSError):
    """Another run wrote the output after this run named it: not replaced."""


def _identity(path: str | Path) -> Identity:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)


def remember(path: str | Path) -> None:
    """Note the file at `path` now (or that there is none): a write to `path` by this process
    refuses to replace anything another process put there since (ConcurrentWrite). Called once
    per run, when its options are parsed; an unreadable path is not remembered (the write says
    why it fails)."""
    with contextlib.suppress(OSError):
        _expected[os.path.abspath(path)] = _identity(path)


class UntrustedPath(OSError):
    """As root: a directory or file another user can change (one line)."""


def _euid() -> int:
    """The effective uid the trust rule is applied for (a function so tests can play root)."""
    return os.geteuid()


def trust_problem(path: str | Path) -> str | None:
    """Why root should not trust `path`: it, or a directory above it, is owned by a user other
    than root or us, or writable by group or others (above the directory holding `path`, the
    sticky bit makes that fine: /tmp), or a symlink on the way belongs to another user. None
    when it is fine, when we do not run as root (the permissions then protect us), or for parts
    that do not exist yet (they are created private)."""
    if _euid() != 0:
        return None
    ours = {0, os.geteuid()}
    given = Path(os.path.abspath(path))
    for part in [given, *given.parents]:  # a symlink on the way must be ours too
        with contextlib.suppress(OSError):
            link = os.lstat(part)
            if stat.S_ISLNK(link.st_mode) and link.st_uid not in ours:
                return f"{part} is a symlink owned by uid {link.st_uid}, not root"
    target = Path(os.path.realpath(path))
    holder_seen = False  # the directory that holds what we read: no sticky-bit exception for it
    for part in [target, *target.parents]:
        try:
            info = os.stat(part)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{part}: {exc.strerror or exc}"
        if info.st_uid not in ours:
            return f"{part} is owned by uid {info.st_uid}, not root"
        # sticky (/tmp) only protects the entries of others; in the directory we read from, anyone
        # could still add a report, a history or SQLite's -wal file of their own
        sticky = holder_seen and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
        holder_seen = holder_seen or stat.S_ISDIR(info.st_mode)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
            who = "everyone" if info.st_mode & stat.S_IWOTH else f"group {info.st_gid}"
            return f"{part} is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def refuse_untrusted(path: str | Path, what: str) -> None:
    """UntrustedPath (an OSError: the CLIs print it as one line, exit 2) when trust_problem."""
    problem = trust_problem(path)
    if problem:
        raise UntrustedPath(errno.EPERM, f"refusing {what} as root: {problem}; another user could "
                            "plant files or symlinks there (make it root's, chmod go-w)", str(path))


class UnsafePath(ValueError):
    """A name from data would put a file outside its directory."""


def confined(directory: str | Path, name: str) -> Path:
    """directory/name, refusing a name that is empty, hidden, has a path separator or `..`, or a
    NUL: such a name comes from data (a host name) and must not choose where a file lands."""
    if (not name or name in (".", "..") or name.startswith(".") or "/" in name
            or "\\" in name or "\0" in name or ".." in name):
        raise UnsafePath(f"refusing to write a file named {name!r} (not a plain file name)")
    return Path(directory) / name


def flock_within(fd: int, wait_s: float, poll_s: float = _LOCK_POLL_S) -> bool:
    """Take an exclusive flock on fd, trying without blocking until wait_s has passed: True when
    taken, False when another process held it all that time (a lock anyone can take on a shared
    directory must never hang a run)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


@contextlib.contextmanager
def _dir_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if not flock_within(fd, LOCK_WAIT_S):
            raise OSError(errno.EWOULDBLOCK, f"another process has held a lock on the "
                          f"directory for more than {LOCK_WAIT_S:g} s (flock); not written "
                          "(write into a directory only you can write)")
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _keep_beside(tmp: str, path: Path) -> Path:
    """The later run's file, renamed next to the target under a name no reader takes for it."""
    beside = path.with_name(f"{path.name}.concurrent-{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(tmp, beside)
    return beside


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


def write_bytes(path: str | Path, data: bytes | Iterable[bytes], *, mode: int = PRIVATE) -> Path:
    """Replace `path` with `data`: bytes, or the file's bytes in pieces, written as they come (a
    large output is never held whole); the file appears complete or not at all."""
    _refuse_unless_regular(os.fspath(path), Path(path))
    path = Path(path)
    try:
        return _write(path, data, mode)
    except OSError as exc:  # name the file asked for, not the temporary
        kind = ConcurrentWrite if isinstance(exc, ConcurrentWrite) else OSError
        raise kind(exc.errno, exc.strerror or str(exc), str(path)) from None


def _write(path: Path, data: bytes | Iterable[bytes], mode: int) -> Path:
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            if mode != PRIVATE:
                os.fchmod(fd, mode)
            for piece in [data] if isinstance(data, bytes) else data:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        key = os.path.abspath(path)
        with _dir_lock(parent):
            if key in _expected and _identity(path) != _expected[key]:
                beside = _keep_beside(tmp, path)
                raise ConcurrentWrite(errno.EBUSY, "another run wrote it after this run started; "
                                      f"not replaced: this run's file is {beside}")
            os.replace(tmp, path)
            if key in _expected:
                _expected[key] = _identity(path)
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
