"""`python -m checks`: run the check suite on this host (or a scenario) and report.

Exit codes: 0 all PASS/WARN/SKIP, 1 any FAIL or ERROR, 2 bad usage or configuration,
128 + N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP), after killing every process of
the run (checks/node/watchdog.py, checks/supervise/procs.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import math
import os
import re
import socket
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from checks import cliutil, profiles, render, site
from checks import report_schema as report
from checks.hw.base import Backend, HardwareError
from checks.hw.fixture import FixtureBackend, ScenarioError, shipped
from checks.model import CheckOutcome
from checks.node import budget, expectations, registry, runner, watchdog
from checks.node.context import Context, Options
from checks.supervise import procs

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

EXIT_USAGE = 2


class UsageError(Exception):
    pass


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h' -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (examples: 90s, 10m, 1h)")
    seconds = float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:  # 0 s measures nothing; inf is not JSON
        raise argparse.ArgumentTypeError(f"duration must be more than 0 and finite: {text!r}")
    return seconds


def _driver(text: str) -> str:
    """--expect-driver: a branch ("580") or a full version ("580.95.05"), as the expectations file."""
    if not expectations.DRIVER.match(text):
        raise argparse.ArgumentTypeError(f"must look like 580 or 580.95.05: {text!r}")
    return text


def _cuda(text: str) -> str:
    if not expectations.CUDA.match(text):
        raise argparse.ArgumentTypeError(f"must look like 12.8: {text!r}")
    return text


def _names(values: list[str] | None) -> list[str]:
    return [n.strip() for v in values or [] for n in v.split(",") if n.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m checks",
        description="Verify that this host can train with PyTorch on its NVIDIA GPUs.",
        epilog="Exit status: 0 all checks PASS/WARN/SKIP, 1 any FAIL or ERROR, 2 bad usage or "
               "configuration, 128+N stopped by signal N (130 SIGINT, 143 SIGTERM). "
               "Docs: docs/checks.md (options, every check), docs/scenarios.md (scenario "
               "format), docs/report.md (report schema). "
               "`python -m checks record FILE` writes this machine as a scenario "
               "(docs/recording.md).")
    p.add_argument("--level", choices=registry.LEVELS, default=None,
                   help="quick: inventory and health (seconds); standard: adds collectives, "
                        "DataLoader, compute and the acceptance training jobs; burn-in: adds "
                        "sustained load (see --duration). Default: standard, or burn-in with "
                        "--budget (the budget then decides)")
    p.add_argument("--budget", type=parse_duration, metavar="TIME",
                   help="time budget, e.g. 5m: run the checks and sizes that fit, most valuable "
                        "first; the plan (and what it left out) goes into the report "
                        "(each check declares its value and cost in its @check). It is also "
                        "the run's deadline, as --deadline")
    p.add_argument("--deadline", type=parse_duration, metavar="TIME",
                   help="end the run this long after it started, whatever the estimates said: "
                        "a check still running then is stopped (ERROR) and the checks not "
                        "started are SKIP 'not run'; the report is written either way")
    p.add_argument("--only", action="append", metavar="ID|TAG",
                   help="run only these checks (ids or tags, comma-separated, repeatable); "
                        "ignores --level")
    p.add_argument("--skip", action="append", metavar="ID|TAG",
                   help="do not run these checks (ids or tags, comma-separated, repeatable)")
    p.add_argument("--json", type=cliutil.output_file, metavar="FILE",
                   help="JSON report path (default: reports/<hostname>.json); '-' for stdout")
    p.add_argument("--no-json", action="store_true", help="do not write a JSON report")
    p.add_argument("--junit", type=cliutil.output_file, metavar="FILE",
                   help="also write JUnit XML here")
    p.add_argument("--html", type=cliutil.output_file, metavar="FILE",
                   help="also write a self-contained HTML report here")
    p.add_argument("--prometheus", type=cliutil.output_file, metavar="FILE",
                   help="also write node_exporter textfile metrics (.prom) here, atomically")
    p.add_argument("--simulate", metavar="FILE|NAME",
                   help="read the hardware from a scenario file (YAML/JSON) instead of this "
                        f"machine; shipped scenarios: {', '.join(shipped())}")
    p.add_argument("--site", metavar="FILE",
                   help="this site's policy over the model profiles: thresholds, checks it never "
                        f"runs (default: ${site.ENV}, else {site.DEFAULT} when it exists; "
                        "docs/checks.md, 'Tuning for your site')")
    p.add_argument("--profile", metavar="NAME",
                   help="GPU model profile with the thresholds (default: detected from the GPUs; "
                        f"available: {', '.join(profiles.available())})")
    p.add_argument("--expect-gpus", type=cliutil.number(int, minimum=0), metavar="N",
                   help="number of GPUs this host must have (default: what provisioning counted, from "
                        "/etc/nodecert/expect.yaml; without it, what the PCI bus shows)")
    p.add_argument("--expect-gpu-ids", type=_gpu_ids, metavar="ID[,ID]",
                   help="PCI IDs (vendor:device, as lspci -n prints them) every GPU must have, "
                        "e.g. 10de:2330 for H100 SXM (default: the model provisioning saw)")
    p.add_argument("--expect-driver", type=_driver, metavar="VERSION",
                   help="driver branch (e.g. 580) or exact version the host must run (default: the "
                        "branch provisioning installed)")
    p.add_argument("--expect-cuda", type=_cuda, metavar="X.Y",
                   help="minimum CUDA version the driver must support (default: the CUDA release "
                        "provisioning installed)")
    p.add_argument("--expect-nvlink", type=cliutil.number(int, minimum=0), metavar="N",
                   help="NVLink links that must be up on every GPU (default: inferred from the "
                        "model profile, NVSwitches on the bus and the links in use; set it for "
                        "NVLink-bridged PCIe SKUs, where a pair with every link down looks unbridged)")
    p.add_argument("--expect-rdma-rate", type=cliutil.number(float, above=0), metavar="GBPS",
                   help="rate every RDMA port must run at, e.g. 400 (default: the profile's)")
    p.add_argument("--expect-rdma-nics", type=cliutil.number(int, minimum=0), metavar="N",
                   help="compute NICs (RDMA devices) this host must have (default: profile)")
    p.add_argument("--duration", type=parse_duration, default=600.0, metavar="TIME",
                   help="burn-in duration, e.g. 90s, 10m, 1h (default 10m)")
    p.add_argument("--nproc", type=cliutil.number(int, minimum=1), metavar="N",
                   help="processes for the collective and acceptance stages (default: one per "
                        "GPU, or 2 on a host without GPUs)")
    p.add_argument("--run-id", metavar="ID", help="identifier recorded in the report")
    p.add_argument("--list", action="store_true",
                   help="list the checks selected by --level/--only/--skip and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="show every per-GPU result")
    p.add_argument("-q", "--quiet", action="store_true", help="no table, no progress display")
    return p


def make_backend(simulate: str | None) -> Backend:
    if simulate:
        return FixtureBackend.from_file(simulate)
    from checks.hw.linux import LinuxBackend

    return LinuxBackend()


def choose_profile(hw: Backend, name: str | None) -> profiles.Profile:
    if name:
        profile = profiles.load(name)
        profile.reason = "chosen with --profile"
        return profile
    try:
        ids = [d.device for d in hw.pci_devices() if d.is_nvidia_gpu]
    except HardwareError:
        ids = []
    names: list[str] = []
    try:
        nvml = hw.nvml()
        names = [str(nvml.gpu(i).query("name")) for i in range(nvml.device_count())]
    except HardwareError:
        pass
    return profiles.detect(ids, names)


def system_facts(hw: Backend) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    for key, read in (("os", lambda: hw.os_release().get("PRETTY_NAME")),
                      ("kernel", hw.kernel_release),
                      ("cpus", hw.cpu_count),
                      ("torch", lambda: hw.torch_build()[0]),  # imports no torch: see
                      ("torch_cuda", lambda: hw.torch_build()[1]),  # checks/hw/torchview.py
                      ("driver", lambda: hw.nvml().driver_version())):
        try:
            facts[key] = read()
        except (HardwareError, OSError):
            facts[key] = None
    facts["gpu_firmware"] = gpu_firmware(hw)
    return facts


def gpu_firmware(hw: Backend) -> list[dict[str, Any]] | None:
    """VBIOS and InfoROM image of every GPU NVML lists, for comparing nodes across a fleet
    (check gpu-firmware compares them within the node). None without NVML; a value NVML does
    not give is None."""
    try:
        nvml = hw.nvml()
        count = nvml.device_count()
    except HardwareError:
        return None
    found: list[dict[str, Any]] = []
    for index in range(count):
        entry: dict[str, Any] = {"index": index}
        try:
            gpu = nvml.gpu(index)
        except HardwareError:
            found.append({**entry, "lost": True})
            continue
        for key, field_name in (("name", "name"), ("uuid", "uuid"), ("vbios", "vbios_version"),
                                ("inforom", "inforom_image_version")):
            try:
                entry[key] = gpu.query(field_name)
            except HardwareError:
                entry[key] = None
        found.append(entry)
    return found


class PlainConsole:
    """What a `-q` run prints (one-line errors, `--list`) without rich: rich's console and
    progress cost ~3 MB and ~30 ms, and a quiet run (the Slurm health check, cron) shows neither
    (issue 47: the quick level within 30 MB resident)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    @property
    def is_terminal(self) -> bool:
        return self.stream.isatty()

    def print(self, text: str = "", **_style: Any) -> None:
        self.stream.write(f"{text}\n")
        self.stream.flush()


def consoles(quiet: bool) -> tuple[Any, Any]:
    """(stdout, stderr) consoles: rich's, or PlainConsole for a quiet run."""
    if quiet:
        return PlainConsole(sys.stdout), PlainConsole(sys.stderr)
    from rich.console import Console

    return (Console(emoji=False, highlight=False),
            Console(stderr=True, emoji=False, highlight=False))


def _progress_listener(progress: Progress, total: int) -> runner.Listener:
    task = progress.add_task("checks", total=total)

    def listener(chk: registry.Check, outcome: CheckOutcome | None) -> None:
        if outcome is None:
            progress.update(task, description=f"{chk.id}")
        else:
            progress.advance(task)

    return listener


def _line_listener(console: Console, total: int) -> runner.Listener:
    done = [0]

    def listener(chk: registry.Check, outcome: CheckOutcome | None) -> None:
        if outcome is not None:
            done[0] += 1
            console.print(f"[{done[0]}/{total}] {chk.id}: {outcome.status} "
                          f"({outcome.duration_s:.1f} s)", highlight=False)

    return listener


def _gpu_count(hw: Backend) -> int:
    try:
        return sum(1 for d in hw.pci_devices() if d.is_nvidia_gpu)
    except HardwareError:
        return 0


def _gpu_ids(text: str) -> tuple[str, ...]:
    """argparse `type=` of --expect-gpu-ids: the rule of the expectations file's gpu_ids."""
    try:
        return expectations.gpu_ids(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _first(option: Any, provisioned: Any) -> Any:
    return option if option is not None else provisioned


def _provisioned(args: argparse.Namespace) -> expectations.Expectations:
    """What provisioning installed (checks/node/expectations.py); a scenario is not this node."""
    if args.simulate:
        return expectations.Expectations()
    named = os.environ.get(expectations.ENV)
    if named and not os.path.exists(named):  # a typo must not mean "expect nothing"
        raise UsageError(f"{expectations.ENV}={named}: no such file")
    try:
        return expectations.load()
    except expectations.ExpectationsError as exc:
        raise UsageError(str(exc)) from None


def _plan(args: argparse.Namespace, selected: list[Any]) -> tuple[list[Any], Any, Backend | None]:
    """The checks a --budget leaves in, its plan and the backend it counted GPUs on."""
    if args.budget is None:
        return selected, None, None
    hw = make_backend(args.simulate)
    try:
        plan = budget.make([c.id for c in selected], args.budget, gpus=_gpu_count(hw),
                           duration_s=args.duration,
                           required=[c.id for c in selected if c.level == "quick"])
    except budget.BudgetError as exc:
        raise UsageError(str(exc)) from None
    if not plan.chosen:  # nothing would run, and "no problem found" would read as PASS
        cheapest = min((x["cost_s"] for x in plan.left_out), default=0)
        raise UsageError(f"--budget {args.budget:g} s holds none of the selected checks "
                         f"(the cheapest needs ~{cheapest:.0f} s)")
    if plan.duration_s is not None:
        args.duration = plan.duration_s
    return [c for c in selected if c.id in plan.ids], plan, hw


def _list(console: Console, selected: list[Any], plan: Any) -> int:
    sizes = {c.id: f"{c.size} ~{c.cost_s:.0f}s" for c in plan.chosen} if plan else {}
    for chk in selected:
        console.print(f"{chk.id:24} {chk.code:8} {chk.level:8} {sizes.get(chk.id, ''):14} "
                      f"{chk.title}", highlight=False)
    for out in plan.left_out if plan else []:
        console.print(f"left out: {out['id']} ({out['reason']})", highlight=False)
    return 0


def _options(args: argparse.Namespace, provisioned: expectations.Expectations) -> Options:
    for flag, value in (("--expect-rdma-rate", args.expect_rdma_rate),
                        ("--expect-rdma-nics", args.expect_rdma_nics)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, got {value:g}")
    return Options(level=args.level, expect_gpus=_first(args.expect_gpus, provisioned.gpus),
                   expect_gpu_ids=_first(args.expect_gpu_ids, provisioned.gpu_ids),
                   expect_driver=_first(args.expect_driver, provisioned.driver),
                   expect_cuda=_first(args.expect_cuda, provisioned.cuda),
                   expect_nvlink=args.expect_nvlink,
                   duration_s=args.duration, nproc=args.nproc,
                   extra={k: v for k, v in (("expect_rdma_rate", args.expect_rdma_rate),
                                            ("expect_rdma_nics", args.expect_rdma_nics))
                          if v is not None})


def _deadline(args: argparse.Namespace, started: float) -> watchdog.Deadline | None:
    """--deadline, else --budget, counted from the command's start (the report is written after)."""
    for flag in ("deadline", "budget"):
        seconds = getattr(args, flag)
        if seconds is not None:
            return watchdog.Deadline(started + seconds, f"--{flag} {seconds:g} s")
    return None


def _run_checks(selected: list[Any], ctx: Context, args: argparse.Namespace, err: Console,
                deadline: watchdog.Deadline | None = None) -> list[Any]:
    if args.quiet:
        return watchdog.run(selected, ctx, deadline=deadline)
    if err.is_terminal:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description:24}"), BarColumn(),
                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                      console=err, transient=True) as progress:
            return watchdog.run(selected, ctx, _progress_listener(progress, len(selected)),
                                deadline)
    return watchdog.run(selected, ctx, _line_listener(err, len(selected)), deadline)


def _write_outputs(doc: dict[str, Any], args: argparse.Namespace, console: Console, err: Console) -> None:
    if args.json == "-":
        sys.stdout.write(__import__("json").dumps(doc, indent=2, default=str) + "\n")
    elif not args.no_json:
        path = report.write(doc, args.json or f"reports/{doc['host']}.json")
        if not args.quiet:
            err.print(f"report: {path}", highlight=False)
    for kind in ("junit", "html", "prometheus"):
        if getattr(args, kind):
            render.write(kind, [doc], getattr(args, kind))
    if not args.quiet and args.json != "-":
        from checks.render import terminal

        terminal.render(doc, console, verbose=args.verbose)


def _check_names(flag: str, names: list[str]) -> None:
    """Every --only/--skip name is a check id or tag; a level name or a typo selects nothing and
    the run would PASS having checked nothing. The nearest id or tag is suggested."""
    checks = registry.load_all().values()
    known = sorted({c.id for c in checks} | {t for c in checks for t in c.tags})
    for name in names:
        if name in known:
            continue
        if name in registry.LEVELS:
            raise UsageError(f"{flag} {name}: '{name}' is a level, not a check id or tag "
                             f"(use --level {name})")
        near = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        raise UsageError(f"{flag}: unknown check id or tag: {name} ({hint}see --list)")


def _select(args: argparse.Namespace, policy: site.Site | None = None) -> list[Any]:
    only, skip = _names(args.only), _names(args.skip)
    if policy is not None and policy.skip:
        _check_names(f"{policy.path}: skip:", policy.skip)
        skip += policy.skip
    _check_names("--only", only)
    _check_names("--skip", skip)
    selected = registry.select(args.level, only, skip)
    if not selected:
        raise UsageError("--only/--skip select no check: nothing would be checked")
    return selected


def run(args: argparse.Namespace, console: Console, err: Console,
        started: float | None = None) -> int:
    started = time.monotonic() if started is None else started
    args.level = args.level or ("burn-in" if args.budget else "standard")
    policy = site.load(args.site, simulated=bool(args.simulate))
    selected = _select(args, policy)
    selected, plan, hw = _plan(args, selected)
    if args.list:
        return _list(console, selected, plan)
    provisioned = _provisioned(args)
    options = _options(args, provisioned)
    hw = hw or make_backend(args.simulate)
    profile = choose_profile(hw, args.profile)
    if policy is not None:
        profile.data = profiles.merge(profile.data, policy.overlay(profile.name))
    if plan is not None:
        budget.apply_overrides(profile.data, plan.profile_overrides)
        if not args.quiet:
            err.print(plan.summary(), highlight=False, markup=False, soft_wrap=True)
    ctx = Context(hw, profile, options)
    ctx.selected = {chk.id for chk in selected}
    started_at = dt.datetime.now(dt.timezone.utc).isoformat()
    t0 = time.monotonic()
    outcomes = _run_checks(selected, ctx, args, err, _deadline(args, started))
    meta = {
        "host": socket.gethostname(), "run_id": args.run_id, "started_at": started_at,
        "duration_s": time.monotonic() - t0, "level": args.level, "backend": hw.name,
        "scenario": getattr(hw, "path", None),
        "profile": {"name": profile.name, "description": profile.description,
                    "reason": profile.reason, "unknown_models": profile.unknown_models},
        "options": {k: v for k, v in vars(options).items() if v not in (None, {}, [])},
        "system": system_facts(hw), "environment": report.recorded_environment(dict(hw.environ())),
    }
    if provisioned.source:
        meta["options"]["expectations_file"] = provisioned.source
    if plan is not None:
        meta["options"]["budget"] = plan.to_dict()
    if args.deadline is not None:
        meta["options"]["deadline_s"] = args.deadline
    if policy is not None:
        meta["options"]["site"] = policy.record(profile.name)
    doc = report.build(outcomes, meta=meta)
    _write_outputs(doc, args, console, err)
    return int(doc["exit_code"])


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:  # `python -m checks record FILE`: checks/node/record.py
        from checks.node import record

        return record.main(argv[1:])
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    console, err = consoles(args.quiet)
    try:
        return run(args, console, err, started)
    except (UsageError, ScenarioError, profiles.ProfileError, budget.BudgetError,
            site.SiteError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USAGE
    except procs.Terminated as exc:  # SIGINT/SIGTERM/SIGHUP, handlers set by __main__
        print(f"stopped by {exc.name}: every process of the run was killed, no report written",
              file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # an output that cannot be written: full or read-only disk, ...
        print(f"error: cannot write {exc.filename or 'output'}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stopped by SIGINT: every process of the run was killed, no report written",
              file=sys.stderr)
        return 128 + 2
