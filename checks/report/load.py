"""Read host reports from disk and validate them against the report schema.

Validation uses one compiled validator for the whole run: jsonschema-rs when it is installed
(about 0.1 ms per report), else the pure-Python jsonschema (about 15 ms per report, so 15 s for
1 000 hosts).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checks import report_schema

FLEET_SCHEMA_NAME = "nodecert-fleet"

Validator = Callable[[Any], "str | None"]


@dataclass
class HostReport:
    """One host's report as found on disk: the parsed document, or why there is none."""

    host: str
    report: dict[str, Any] | None
    error: str | None = None
    path: Path | None = None


def _where(path: Any) -> str:
    return "/".join(str(p) for p in path) or "(top level)"


def _rs_validator(schema: dict[str, Any]) -> Validator | None:
    try:
        import jsonschema_rs
    except ImportError:
        return None
    compiled = jsonschema_rs.validator_for(schema)

    def first_error(doc: Any) -> str | None:
        if compiled.is_valid(doc):
            return None
        err = next(iter(compiled.iter_errors(doc)))
        return f"{_where(err.instance_path)}: {err.message}"

    return first_error


def _py_validator(schema: dict[str, Any]) -> Validator:
    try:
        from jsonschema import Draft202012Validator
    except ImportError:
        raise ImportError("cannot validate reports: install jsonschema-rs or jsonschema") from None

    compiled = Draft202012Validator(schema)

    def first_error(doc: Any) -> str | None:
        err = next(iter(compiled.iter_errors(doc)), None)
        return None if err is None else f"{_where(err.absolute_path)}: {err.message}"

    return first_error


@functools.cache
def validator(backend: str = "auto") -> Validator:
    """A function returning a report's first schema violation, or None when it is valid.
    backend: "auto" (jsonschema-rs if installed), "rs" or "python"."""
    schema = report_schema.schema()
    if backend in ("auto", "rs"):
        fast = _rs_validator(schema)
        if fast is not None:
            return fast
        if backend == "rs":
            raise ImportError("jsonschema-rs is not installed")
    return _py_validator(schema)


MAX_BYTES = 64 << 20  # a real report is tens of kB; 1 000 GPUs' worth is under 10 MB
MAX_DEPTH = 32  # a real report nests about 8 deep


def read_regular(path: Path) -> bytes:
    """The bytes of `path` if it is a regular file: a FIFO, device or socket in the reports
    directory is never waited on (opened non-blocking, refused after fstat)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than the {MAX_BYTES >> 20} MiB a report may have")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(MAX_BYTES + 1)
    finally:
        os.close(fd)


_JSON_STRING = re.compile(rb'"[^"\\\\]*(?:\\\\.[^"\\\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')
_INNERMOST = re.compile(rb"\[\]|\{\}")
# a surrogate reaches a parsed str only from a \\uD800-\\uDFFF escape or from raw bytes ED A0-BF
# (json.loads decodes bytes with "surrogatepass"; any ED byte takes the walk)
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def plainly_fine(raw: bytes) -> bool:
    """True when the JSON text `raw` can hold no problem text_problem finds: brackets (outside
    strings) nested at most MAX_DEPTH deep and nothing that decodes to a surrogate. Done on the bytes
    in C (bytes.translate/replace, regular expressions), ~30x faster than walking the parsed tree;
    False means "walk it"."""
    if json.detect_encoding(raw) != "utf-8" or _MAYBE_SURROGATE.search(raw) or b"\xed" in raw:
        return False
    # Without a backslash before a quote, every quote delimits a string. Keep quotes and brackets:
    # a string without brackets is an adjacent "" pair, removed in one left-to-right pass. A quote
    # left over (a string holding a bracket) or an escaped quote takes the regular expression.
    brackets = raw.translate(None, _NOT_BRACKET_OR_QUOTE).replace(b'""', b"")
    if b'"' in brackets or b'\\"' in raw:
        brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET)
    for _ in range(MAX_DEPTH):  # each pass strips the innermost pairs: passes = nesting depth
        brackets, n = _INNERMOST.subn(b"", brackets)
        if not brackets:
            return True
        if n == 0:
            return False
    return False


def text_problem(doc: Any, raw: bytes | None = None) -> str | None:
    """Nesting deeper than a report has, or a string no renderer can write (a lone surrogate,
    which JSON's \\u escapes can carry but UTF-8 cannot). `raw`, the JSON text `doc` was parsed
    from, lets a plainly fine document skip the walk."""
    if raw is not None and plainly_fine(raw):
        return None
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        if isinstance(node, dict):
            stack.extend((k, depth + 1) for k in node)
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return f"invalid Unicode (lone surrogate) in {node[:40]!r}"
    return None


MAX_INT_DIGITS = 20  # 2**64 has 20 digits; a 4 000-digit integer parses but overflows float()


def _bounded_int(text: str) -> int:
    """json's parse_int: no figure in a report needs more than MAX_INT_DIGITS digits."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def read(path: Path, host: str | None = None, validate: Validator | None = None) -> HostReport | None:
    """The report at `path`, named after the file (reports/<run-id>/<host>.json) unless `host`;
    None for a fleet summary written into the same directory. Whatever is wrong with the file
    (not a regular file, not JSON, too deep, not valid against the schema, a host that is not
    one node name, a verdict its checks do not give) makes it unreadable, with the reason."""
    name = host or path.stem

    def unreadable(why: str) -> HostReport:
        return HostReport(name, None, f"report unreadable: {path.name}: {' '.join(why.split())}", path)

    try:
        raw = read_regular(path)
        doc = json.loads(raw, parse_int=_bounded_int)
    except OSError as exc:
        return unreadable(exc.strerror or str(exc))
    except RecursionError:
        return unreadable("nested too deep")
    except ValueError as exc:
        return unreadable(str(exc)[:200])
    if isinstance(doc, dict) and doc.get("schema") == FLEET_SCHEMA_NAME:
        return None
    problem = (host_name_problem(name) or text_problem(doc, raw) or (validate or validator())(doc)
               or report_schema.host_problem(doc["host"]) or report_schema.consistency_problem(doc)
               or report_schema.time_problem(doc, time.time()))
    if problem:
        return unreadable(problem)
    return HostReport(name, doc, None, path)


def host_name_problem(name: str) -> str | None:
    problem = report_schema.host_problem(name)
    return None if problem is None else f"file name: {problem}"


def flag_duplicates(found: list[HostReport]) -> list[HostReport]:
    """Two reports that claim the same listed host (another file's name): neither is believed, one
    of them is not that host. Hosts that share a name no file has (fresh cloud images all called
    `ubuntu`, chroots of one machine) are told apart by their file names, as verify.yml fetches."""
    listed = {item.host for item in found}
    claims: dict[str, list[HostReport]] = {}
    for item in found:
        if item.report is not None:
            claims.setdefault(item.report["host"], []).append(item)
    for claimed, items in claims.items():
        if len(items) > 1 and claimed in listed:
            files = ", ".join(sorted(i.path.name if i.path else i.host for i in items))
            for item in items:
                item.report = None
                item.error = f"{len(items)} reports claim host {claimed} ({files})"
    return found


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Reports are acyclic trees of fresh objects: the cyclic collector finds nothing in them but
    runs again and again while they are built (1 000 reports load 3-4x faster without it)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def read_dir(directory: Path) -> list[HostReport]:
    validate = validator()
    with gc_paused():
        found = [read(p, validate=validate) for p in sorted(directory.glob("*.json"))]
    return flag_duplicates([f for f in found if f is not None])
