"""`python -m checks record FILE`: what the hardware layer reads here, written as a scenario.

    python -m checks record node17.yaml --redact
    python -m checks --simulate node17.yaml --level quick     # same verdict, no machine needed

The recorder asks a `Backend` (LinuxBackend on a real machine, or any other) every question the
checks ask, and writes each answer in the scenario spelling `--simulate` reads: a query NVML does
not support is `not_supported`, a failed one `{error: text}`, a GPU lost at handle lookup
`lost: true`, a GPU on the bus that NVML does not list `nvml_visible: false`. Whatever the format
cannot express is named on stderr and in the file's header, and the exit status is then 1.
Workload measurements are not recorded: they are results of loading the GPUs, not reads.
Format and the path from a recording to a shipped scenario: docs/recording.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from checks import cliutil, safeio
from checks.hw.base import (
    Backend,
)
from checks.hw.fixture import FixtureBackend, ScenarioError
from checks.node.record.reads import CALL_TIMEOUT_S, HexInt
from checks.node.record.recorder import Recording, record

EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2
SUFFIXES = (".yaml", ".yml", ".json")


class UsageError(Exception):
    pass


# -- writing ------------------------------------------------------------------------------------
def render(rec: Recording, fmt: str) -> str:
    if fmt == ".json":
        return json.dumps(rec.scenario, indent=2) + "\n"
    header = ["# A recording of what the nodecert hardware layer read on one machine.",
              "# Replay it: python -m checks --simulate THIS_FILE --level quick",
              "# Format: docs/recording.md (and README.md, \"Scenario files\")."]
    header += [f"# NOT EXPRESSIBLE (left out or approximated): {g}" for g in rec.gaps]
    header += [f"# note: {n}" for n in rec.notes]
    body = yaml.dump(rec.scenario, Dumper=_Dumper, sort_keys=False, width=4096,
                     allow_unicode=True)
    return "\n".join(header) + "\n" + body


class _Dumper(yaml.SafeDumper):
    """Short collections on one line ({speed: ..., width: 16}), long ones one item a line (the
    kernel log, a GPU's fields), device ids in hex: close to a hand-written scenario."""

    def represent_sequence(self, tag: str, sequence: Any, flow_style: Any = None) -> Any:
        return super().represent_sequence(tag, sequence, _fits(sequence))

    def represent_mapping(self, tag: str, mapping: Any, flow_style: Any = None) -> Any:
        return super().represent_mapping(tag, mapping, _fits(mapping))


def _fits(data: Any) -> bool:
    return len(json.dumps(data, default=str)) <= 96


_Dumper.add_representer(HexInt, lambda d, v: d.represent_scalar("tag:yaml.org,2002:int",
                                                                 f"0x{v:x}"))


def check_target(path: Path, force: bool) -> None:
    """Every reason not to write `path`, found before the (slow) recording starts."""
    if path.suffix.lower() not in SUFFIXES:
        raise UsageError(f"{path}: the file name must end in {', '.join(SUFFIXES)}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{parent}: no such directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{parent}: directory is not writable")
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to replace it (the old file is kept as "
                         f"{path.name}.bak)")


def write(path: Path, text: str) -> Path | None:
    """Atomic and private (checks/safeio.py): a temporary file in the same directory, renamed
    over `path`, mode 0600. An existing file is kept as PATH.bak first (written the same way, so
    a pre-created PATH.bak symlink is replaced, never followed). Returns the backup path, if any."""
    backup = None
    if path.exists():
        backup = safeio.write_bytes(path.with_name(path.name + ".bak"), path.read_bytes())
    safeio.write_text(path, text)
    return backup


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m checks record",
        description="Write what the hardware layer reads on this machine (host facts, PCI, "
                    "NVML, kernel log, torch) as a scenario file for --simulate.",
        epilog="Exit status: 0 written, 1 written but some facts could not be expressed (named "
               "on stderr and in the file), 2 bad usage or an unwritable FILE. Docs: "
               "docs/recording.md.")
    p.add_argument("file", metavar="FILE", help="scenario to write (.yaml, .yml or .json)")
    p.add_argument("--redact", action="store_true",
                   help="replace GPU serials, every UUID, the hostname, IP and MAC addresses and "
                        "IMEX peers with stable placeholders, and drop the kernel command line "
                        "but its GPU-relevant parameters (docs/recording.md)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing FILE (the old one is kept as FILE.bak)")
    p.add_argument("--simulate", metavar="FILE|NAME",
                   help="record a scenario instead of this machine (flattens extends: and "
                        "gpu_overrides:)")
    p.add_argument("--timeout", type=float, default=CALL_TIMEOUT_S, metavar="SECONDS",
                   help=f"bound on each hardware read, e.g. an NVML call on a hung GPU "
                        f"(default {CALL_TIMEOUT_S:g}; torch gets at least 120)")
    return p


def _backend(simulate: str | None) -> tuple[Backend, str]:
    if simulate:
        hw = FixtureBackend.from_file(simulate)
        return hw, f"scenario {Path(hw.path).stem} (simulated)"
    from checks.hw.linux import LinuxBackend

    return LinuxBackend(), socket.gethostname()


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    path = Path(args.file)
    try:
        if not args.timeout > 0:
            raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
        check_target(path, args.force)
        hw, host = _backend(args.simulate)
        rec = record(hw, host=host, redact=args.redact, timeout_s=args.timeout)
        backup = write(path, render(rec, path.suffix.lower()))
    except (UsageError, ScenarioError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    _summary(rec, path, backup)
    return EXIT_INCOMPLETE if rec.gaps else EXIT_OK


def _summary(rec: Recording, path: Path, backup: Path | None) -> None:
    gpus = rec.scenario.get("gpus", [])
    switches = rec.scenario.get("nvswitches", [])
    print(f"recorded {len(gpus)} GPU(s), {len(switches)} NVSwitch(es), NVML "
          f"{rec.scenario['driver'].get('nvml')} -> {path}"
          + (f" (previous file kept as {backup})" if backup else ""), file=sys.stderr)
    for line in _lines("warning: not expressible: ", rec.gaps):
        print(line, file=sys.stderr)
    for line in _lines("note: ", rec.notes):
        print(line, file=sys.stderr)


def _lines(prefix: str, items: Iterable[str]) -> list[str]:
    return [f"{prefix}{item}" for item in items]
