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
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checks import report_schema

try:
    import orjson as _orjson
except ImportError:  # json alone reads every report, 2-4x slower
    _orjson = None  # type: ignore[assignment]

FLEET_SCHEMA_NAME = "nodecert-fleet"
# The name the fleet summary has when written into the reports directory (docs/fleet.md): the one
# file there skipped for holding a fleet summary; any other that claims the schema is a host's ERROR.
FLEET_FILE_NAMES = frozenset({"fleet.json"})

Validator = Callable[[Any], "str | None"]


@dataclass
class HostReport:
    """One host's report as found on disk: the parsed document, or why there is none."""

    host: str
    report: dict[str, Any] | None
    error: str | None = None
    path: Path | None = None
    # read(keep_text=True): the file's bytes when `report` is exactly what orjson reads from them
    # (no key, value or string changed by the loader), else None
    text: bytes | None = field(default=None, repr=False)


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
        # os.read of what fstat says (and on until EOF, at most MAX_BYTES + 1): a buffered
        # read(MAX_BYTES + 1) allocated 64 MiB per report first (60 us a report, against 8)
        pieces, got = [], 0
        while got <= MAX_BYTES:
            piece = os.read(fd, min(max(info.st_size + 1 - got, 1 << 16), MAX_BYTES + 1 - got))
            if not piece:
                break
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)
    finally:
        os.close(fd)


# a JSON string: a quote, then characters other than a quote or backslash, or a backslash and
# the one character it escapes, then a quote (in rb'' text `\\` is the regular expression's
# escaped backslash: one backslash of the input)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')
# { and } read as [ and ]: in a text that parsed, brackets outside strings pair up by kind anyway,
# and one kind lets bytes.replace strip the innermost pairs (~4x the regular expression \[\]|\{\})
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
# a surrogate reaches a parsed str only from a \\uD800-\\uDFFF escape or from raw bytes ED A0-BF
# (json.loads decodes bytes with "surrogatepass"; any ED byte takes the walk)
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def plainly_fine(raw: bytes) -> bool:
    """True when the JSON text `raw` can hold no problem text_problem finds: brackets (outside
    strings) nested at most MAX_DEPTH deep and nothing that decodes to a surrogate. Done on the bytes
    in C (bytes.translate/replace, regular expressions), ~30x faster than walking the parsed tree;
    False means "walk it"."""
    # every escape starts with a backslash: a text without one (a report, mostly) skips the
    # searches for escapes (a two-byte `in` scans 68 kB in ~60 us, the one-byte test in ~3 us)
    escapes = b"\\" in raw
    if (json.detect_encoding(raw) != "utf-8" or (escapes and _MAYBE_SURROGATE.search(raw))
            or b"\xed" in raw):
        return False
    # Without a backslash before a quote, every quote delimits a string. Keep quotes and brackets:
    # a string without brackets is an adjacent "" pair, removed in one left-to-right pass. A quote
    # left over (a string holding a bracket) or an escaped quote takes the regular expression.
    brackets = raw.translate(_ONE_KIND, _NOT_BRACKET_OR_QUOTE).replace(b'""', b"")
    if b'"' in brackets or (escapes and b'\\"' in raw):
        brackets = _JSON_STRING.sub(b"", raw).translate(_ONE_KIND, _NOT_BRACKET)
    for _ in range(MAX_DEPTH):  # each pass strips the innermost pairs: passes = nesting depth
        shorter = brackets.replace(b"[]", b"")
        if not shorter:
            return True
        if len(shorter) == len(brackets):
            return False
        brackets = shorter
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
# An integer of a host report fits a signed 64-bit integer: what the history (SQLite INTEGER)
# stores; 2**63 and up made sqlite3 raise OverflowError mid-recording.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


def _bounded_int(text: str) -> int:
    """json's parse_int: no figure in a report needs more than MAX_INT_DIGITS digits."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def _int64(text: str) -> int:
    """A host report's parse_int: _bounded_int, within a signed 64-bit integer."""
    value = _bounded_int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise ValueError(f"the integer {value} is outside the signed 64-bit range of a report's "
                         "integers")
    return value


class DuplicateKey(ValueError):
    """One JSON object names a key twice: json keeps the last value silently, so a second
    `"verdict"` could stand in for the first."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(f"duplicate key {clean(key)!r} in one object")
            seen.add(key)
    return obj


# orjson parses a report 2-4x faster than json with the two hooks below (about 1.5 ms of the
# 2.7 ms json takes for a 68 kB report on the 2-core benchmark machine). It reads what json reads
# into the same values, but for what the fast path below hands to json instead: an integer past
# 64 bits (orjson reads it as a float; json's parse_int judges it), NaN and infinities, lone
# surrogates, other encodings than UTF-8 and any text it refuses (json then gives the error), and
# a key named twice, which orjson keeps silently (the last one). Its floats are json's: the same
# correctly rounded doubles (random decimals of up to 80 digits, tests/fleet).
_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


def _fast(raw: bytes) -> Any:
    """The document orjson reads from `raw`, or None where json must decide. Both are judged on
    orjson's text of the document it read. An integer past 64 bits became a float of magnitude
    9.2e18 or more, which orjson writes with an exponent (`1.8446744073709552e+19`): a text with
    `e+` anywhere (a float of 1e16 or more, or those two characters in a string) takes json's
    path. An integer past 53 bits (orjson reads up to 2**64 - 1 as one) makes dumps refuse the
    document (OPT_STRICT_INTEGER): json's parse_int judges its range. A duplicate key is seen by
    counting colons: orjson's text has as many as `raw` unless a key was dropped with its value
    (every key brings one; orjson writes a colon in a string as `:`, so a colon written `\\u003a`
    in `raw` takes json's path)."""
    if _orjson is None or (b"\\" in raw and _ESCAPED_COLON.search(raw)):
        return None
    try:
        doc = _orjson.loads(raw)
        text = _orjson.dumps(doc, option=_orjson.OPT_STRICT_INTEGER)
    except (_orjson.JSONDecodeError, _orjson.JSONEncodeError):  # dumps nests 254 deep, loads 1024
        return None
    if doc is None or _exponent(text) or text.count(b":") != raw.count(b":"):
        return None
    return doc


def _exponent(text: bytes) -> bool:
    """Whether `text` holds `e+`: b"e+" in text, found from the few `+` by memchr (~3 us for a
    report, where the two-byte search takes ~50, and a scan for runs of digits in `raw` ~55)."""
    at = text.find(b"+")
    while at != -1:
        if at and text[at - 1] == 0x65:  # e
            return True
        at = text.find(b"+", at + 1)
    return False


def parse_json(raw: bytes | str) -> Any:
    """Every JSON file the fleet reads from a run directory (host reports, cross-host files):
    UTF-8 only, integers bounded (MAX_INT_DIGITS, signed 64 bits), a key named twice in one
    object refused (DuplicateKey); ValueError for anything else json refuses, never
    RecursionError."""
    return _parse(raw)[0]


def _parse(raw: bytes | str, parse_int: Callable[[str], int] = _bounded_int) -> tuple[Any, bool]:
    """parse_json's document, and whether orjson.loads(raw) reads it (the fast path: every
    integer within 53 bits). `parse_int` judges the integers of json's path."""
    if isinstance(raw, bytes):
        doc = _fast(raw)  # orjson reads UTF-8 only
        if doc is not None:
            return doc, True
        # JSON exchanged between systems is UTF-8 (RFC 8259, section 8.1); json.loads would
        # decode UTF-16 and UTF-32 too, whose text the byte patterns below (plainly_fine,
        # _maybe_unsafe) cannot see into: a control character would reach every renderer raw
        encoding = json.detect_encoding(raw)
        if encoding not in ("utf-8", "utf-8-sig"):
            raise ValueError(f"{encoding.upper()} text: a report is UTF-8 (RFC 8259)")
    try:
        return json.loads(raw, parse_int=parse_int, object_pairs_hook=_unique_keys), False
    except RecursionError:
        raise ValueError("nested too deep") from None


# Characters no renderer may pass on raw: C0 controls but tab and newline (ESC starts terminal
# sequences, BEL rings, NUL truncates C strings and is not XML), DEL, C1 controls (U+009B is a
# one-byte CSI), and the Unicode bidirectional controls that reorder what follows them on screen
# (U+202A-U+202E, U+2066-U+2069, the marks U+200E, U+200F, U+061C; Unicode Standard Annex #9,
# "Explicit Directional Formatting Characters"), and the line/paragraph separators U+2028/U+2029.
# Each is written as its escape (`\x1b`, `\u202e`), so the text still says what was there.
_UNSAFE = [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), 0x061C, 0x200E, 0x200F,
           *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}
# what in a JSON text may decode to one of them: a \u escape of U+0000-U+001F, U+007F-U+009F,
# U+061C, U+200E/F, U+202A-E, U+2028/9, U+2066-9, the escapes \b \f \r, raw DEL, or the UTF-8
# bytes of a C1 control or a bidirectional control (a false alarm only costs the walk)
_MAYBE_UNSAFE = re.compile(
    rb"(?i:\\u(?:00[01]|007f|008|009|061c|200[ef]|202[89a-e]|206[6-9]))|\\[bfr]|\x7f"
    rb"|\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def _maybe_unsafe(raw: bytes) -> bool:
    """_MAYBE_UNSAFE.search(raw), judged first on what every match needs: a backslash, DEL or a
    byte past ASCII (a typical report has none; the alternation scans 68 kB in about 1 ms)."""
    if b"\\" not in raw and b"\x7f" not in raw and raw.isascii():
        return False
    return _MAYBE_UNSAFE.search(raw) is not None


def clean(text: str) -> str:
    """`text` with every character of _UNSAFE written as its escape."""
    return text.translate(_ESCAPES)


def _cleaned(node: Any) -> Any:
    if isinstance(node, str):
        return node.translate(_ESCAPES)
    if isinstance(node, dict):
        return {k.translate(_ESCAPES): _cleaned(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_cleaned(v) for v in node]
    return node


def cleaned(doc: Any, raw: bytes | None = None) -> Any:
    """`doc` with every string (keys too) made safe for every renderer (clean), sanitised once
    here so the terminal, HTML, JUnit and Prometheus writers never see a raw control. Call after
    text_problem (the walk recurses: depth must be bounded). `raw`, the JSON text, lets a
    document that holds none of them skip the walk."""
    if raw is not None and not _maybe_unsafe(raw):
        return doc
    return _cleaned(doc)


def read(path: Path, host: str | None = None, validate: Validator | None = None,
         keep_text: bool = False, summary_names: Collection[str] | None = None) -> HostReport | None:
    """The report at `path`, named after the file (reports/<run-id>/<host>.json) unless `host`;
    None for a fleet summary: one a file of the reports directory holds under one of
    `summary_names` (FLEET_FILE_NAMES), any when None (a file given by its path). Whatever is
    wrong with the file (not a regular file, not UTF-8 JSON, too deep, an integer past 64 bits,
    not valid against the schema, a file name or host that is not one node name, a verdict its
    checks do not give) makes it unreadable, with the reason; a file name that is no node name
    is shown escaped (shown_name). `keep_text`: the report's `text` is the file's bytes where
    orjson reads them into the report unchanged (HostReport.text)."""
    name = host or path.stem

    def unreadable(why: str) -> HostReport:
        why = clean(" ".join(why.split())).encode("utf-8", "backslashreplace").decode("utf-8")
        return HostReport(shown_name(name), None, f"report unreadable: {shown_name(path.name)}: {why}",
                          path)

    try:
        raw = read_regular(path)
        doc, by_orjson = _parse(raw, _int64)
    except OSError as exc:
        return unreadable(exc.strerror or str(exc))
    except ValueError as exc:
        return unreadable(str(exc)[:200])
    if isinstance(doc, dict) and doc.get("schema") == FLEET_SCHEMA_NAME:
        if summary_names is None or path.name in summary_names:
            return None
        return unreadable(f"a fleet summary (schema {FLEET_SCHEMA_NAME}), not a host report: only "
                          f"{', '.join(sorted(summary_names))} is taken for the fleet's own")
    problem = host_name_problem(name) or text_problem(doc, raw)
    if problem:
        return unreadable(problem)
    read_as_is = doc
    doc = cleaned(doc, raw)  # the same object when nothing needed cleaning
    problem = ((validate or validator())(doc) or reported_host_problem(doc["host"])
               or report_schema.consistency_problem(doc) or report_schema.time_problem(doc, time.time()))
    if problem:
        return unreadable(problem)
    return HostReport(name, doc, None, path, raw if keep_text and by_orjson and doc is read_as_is else None)


# What scontrol expands into every node; the other reserved names (fleet, meta, crosshost,
# history, none) are names of files and directories in a run directory, refused as file names
# (host_name_problem) but fine as the name a node reports for itself: the Slurm wrapper reads its
# own node's report (as report.json), and a node called `fleet` must not be drained by its own
# health check for its name.
SCONTROL_RESERVED = frozenset({"all"})


def reported_host_problem(name: object) -> str | None:
    """Why the `host` a report gives is not one node name: report_schema.host_problem, except
    that the run directory's own names are allowed (only ALL, which scontrol expands, is not)."""
    problem = report_schema.host_problem(name)
    if (problem and isinstance(name, str) and name.lower() in report_schema.RESERVED_HOST_NAMES
            and name.lower() not in SCONTROL_RESERVED):
        return None
    return problem


def host_name_problem(name: str) -> str | None:
    problem = report_schema.host_problem(name)
    return None if problem is None else f"file name: {problem}"


def shown_name(name: str) -> str:
    """A file name as the fleet may show it: a node name as it is; any other with its bytes
    that are not UTF-8 (os.fsdecode's surrogates) as `\\xff`, its backslashes doubled and its
    control and bidirectional characters escaped (clean). Never a valid node name then, so it
    cannot stand for a host, and fit for every renderer (Prometheus labels must be UTF-8)."""
    escaped = os.fsencode(name).replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    return clean(escaped)


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
        found = [read(p, validate=validate, summary_names=FLEET_FILE_NAMES)
                 for p in sorted(directory.glob("*.json"))]
    return flag_duplicates([f for f in found if f is not None])
