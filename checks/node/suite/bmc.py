"""The BMC's view of the server through ipmitool: sensor states (`ipmitool sdr`) and the system
event log (`ipmitool sel elist`). A failed PSU or fan precedes GPU power capping and thermal
throttling; NVML sees the effect, the BMC the cause.

SDR status column (ipmitool's sdr list): ok, ns (no reading), nc (non-critical), cr (critical),
nr (non-recoverable); `ipmitool sensor` spells the thresholds lnc/unc/lcr/ucr/lnr/unr. Discrete
sensors can read "ok" while an event is asserted (ipmitool/ipmitool#176: Redundancy Lost), so
the SEL is read as well; its rules are data (checks/node/bmc_events.yaml).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from checks.hw.base import HardwareError, ToolRun
from checks.model import Result, Status, error, passed, skip
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

RULES = Path(__file__).resolve().parents[1] / "bmc_events.yaml"
CRITICAL = {"cr", "nr", "lcr", "ucr", "lnr", "unr"}
NONCRITICAL = {"nc", "lnc", "unc"}
KINDS = (("psu", re.compile(r"power supply|\bps ?\d|psu|pwr unit|power unit", re.I)),
         ("fan", re.compile(r"fan", re.I)),
         ("temperature", re.compile(r"temp", re.I)))
REMEDY = {"psu": "replace or reseat the power supply and check its feed; a node on one PSU "
                 "caps GPU power or shuts down when it fails",
          "fan": "replace the failed fan; GPUs behind it throttle (clock-throttle, "
                 "gpu-temperature) and may shut down",
          "temperature": "check airflow, fans and the inlet temperature before running jobs",
          "other": "look up the sensor in the server vendor's manual (ipmitool sdr elist full)"}
NO_IPMITOOL = "ipmitool is not installed (apt install ipmitool)"
REMEDY_SEL = ("after the cause is fixed, save the log (ipmitool sel elist > file) and clear it "
              "(ipmitool sel clear), or old events keep being reported")


@dataclass(frozen=True)
class Sensor:
    name: str
    reading: str
    status: str


@dataclass(frozen=True)
class SelEvent:
    record: str
    when: str
    sensor: str
    event: str
    asserted: bool


@dataclass(frozen=True)
class SelRule:
    id: str
    sensor: re.Pattern[str]
    event: re.Pattern[str]
    status: Status
    kind: str
    source: str
    example: str


@functools.cache
def rules() -> tuple[SelRule, ...]:
    data = yaml.safe_load(RULES.read_text())
    return tuple(SelRule(id=r["id"], sensor=re.compile(r["sensor"], re.I),
                         event=re.compile(r["event"], re.I), status=Status(r["status"].upper()),
                         kind=r["kind"], source=r["source"], example=r["example"])
                 for r in data["rules"])


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def parse_sdr(text: str) -> list[Sensor]:
    """`ipmitool sdr` (name | reading | status) or `sdr elist` (name | id | status | entity |
    reading); other lines (errors, blank) are passed over."""
    sensors = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) == 3:
            sensors.append(Sensor(fields[0], fields[1], fields[2].lower()))
        elif len(fields) == 5:
            sensors.append(Sensor(fields[0], fields[4], fields[2].lower()))
    return sensors


def parse_sel(text: str) -> list[SelEvent]:
    """`ipmitool sel elist`: id | date | time | sensor | event | Asserted/Deasserted (the last
    column is missing on some records: asserted)."""
    events = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5:
            continue
        direction = fields[5].lower() if len(fields) > 5 else "asserted"
        events.append(SelEvent(fields[0], f"{fields[1]} {fields[2]}", fields[3], fields[4],
                               direction != "deasserted"))
    return events


def judge_sel(events: list[SelEvent]) -> list[tuple[SelRule, SelEvent, bool]]:
    """(rule, last event, still asserted) for each sensor and event a rule matches."""
    latest: dict[tuple[str, str], tuple[SelRule, SelEvent]] = {}
    for ev in events:
        rule = next((r for r in rules() if r.sensor.search(ev.sensor) and
                     r.event.search(ev.event)), None)
        if rule is not None:
            latest[(ev.sensor, ev.event.lower())] = (rule, ev)
    return [(rule, ev, ev.asserted) for rule, ev in latest.values()]


def _run(ctx: Context, args: tuple[str, ...], timeout_s: float) -> ToolRun | Result:
    try:
        run = ctx.hw.ipmi(args, timeout_s)
    except HardwareError as exc:
        return error(f"ipmitool {' '.join(args)}: {exc}")
    if run.timed_out:
        return error(f"ipmitool {' '.join(args)}: no answer within {timeout_s:g} s (the BMC "
                     "does not respond; killed)", remedy="check the BMC (ipmitool mc info; a "
                     "cold reset: ipmitool mc reset cold)")
    if run.returncode != 0:
        why = (run.stderr.strip() or run.stdout.strip() or "no output").splitlines()[0]
        return error(f"ipmitool {' '.join(args)} exited {run.returncode}: {why}")
    return run


@check("bmc-sensors", code="BMC001", title="BMC sensors and event log: PSUs, fans, temperatures",
       stage="host",
       # ipmitool talks to the BMC over KCS: a few seconds for `sdr` and `sel elist`
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=5), source="estimated"))
def bmc_sensors(ctx: Context) -> Iterator[Result]:
    """`ipmitool sdr`: sensors in a critical or non-recoverable state are judged by profile
    bmc.critical_status, non-critical ones by bmc.noncritical_status. `ipmitool sel elist`:
    PSU failures, lost redundancy, fan and temperature threshold events (rules with sources:
    checks/node/bmc_events.yaml). SKIP when ipmitool or the in-band IPMI device is absent;
    ERROR when the BMC does not answer within bmc.timeout_s."""
    tool = ctx.hw.ipmitool()
    if tool is None:
        yield skip(NO_IPMITOOL)
        return
    if not tool.get("device"):
        yield skip("no in-band IPMI device (/dev/ipmi0): load ipmi_devintf and ipmi_si, or "
                   "this host (VM, container without the device) has no BMC to ask")
        return
    timeout_s = float(ctx.profile.require("bmc.timeout_s"))
    critical = Status(str(ctx.profile.require("bmc.critical_status")).upper())
    noncritical = Status(str(ctx.profile.require("bmc.noncritical_status")).upper())
    found = 0
    sdr = _run(ctx, ("sdr",), timeout_s)
    if isinstance(sdr, Result):
        yield sdr
    else:
        sensors = parse_sdr(sdr.stdout)
        if not sensors:
            yield error("ipmitool sdr printed no sensor lines")
        for s in sensors:
            status = critical if s.status in CRITICAL else (
                noncritical if s.status in NONCRITICAL else None)
            if status is None or status is Status.PASS:
                continue
            found += 1
            kind = kind_of(s.name)
            yield Result(status, f"{s.name}: {s.reading}, status {s.status} "
                         f"({'critical' if s.status in CRITICAL else 'non-critical'})",
                         value=s.status, expected="ok", remedy=REMEDY[kind],
                         details={"sensor": s.name, "reading": s.reading, "kind": kind,
                                  "source": "sdr"})
        if sensors and not found:
            yield passed(f"{len(sensors)} sensors, none critical or non-critical",
                         value=len(sensors), unit="sensors")
    sel = _run(ctx, ("sel", "elist"), timeout_s)
    if isinstance(sel, Result):
        yield sel
        return
    events = parse_sel(sel.stdout)
    judged = judge_sel(events)
    for rule, ev, asserted in judged:
        status = rule.status if asserted else Status.WARN
        state = "asserted" if asserted else "deasserted since (it recovered)"
        yield Result(status, f"SEL #{ev.record} {ev.when}: {ev.sensor}: {ev.event}, {state}",
                     value=rule.id, remedy=f"{REMEDY[rule.kind]}; {REMEDY_SEL}",
                     details={"sensor": ev.sensor, "event": ev.event, "rule": rule.id,
                              "kind": rule.kind, "source": "sel", "rule_source": rule.source})
    if not judged:
        yield passed(f"system event log: {len(events)} entries, no PSU, fan or temperature "
                     "fault", value=len(events), unit="entries")

