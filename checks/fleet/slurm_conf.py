"""The time Slurm gives each script nodecert installs, read from slurm.conf.

    limits = slurm_conf.read(Path("/etc/slurm/slurm.conf"))
    plan = slurm_conf.plan(limits, timeout_s=None, budget_s=None)   # or raises DeadlineError

What Slurm 22.05 documents (slurm.conf(5)), and what follows for nodecert:

- HealthCheckProgram: "killed if it does not terminate normally within 60 seconds", a fixed
  limit no setting changes; slurmd then leaves the node as it was and ignores the exit code.
- Prolog: "expected to complete execution quickly (in less time than MessageTimeout)";
  PrologEpilogTimeout, when set, terminates it (the job is requeued, the node drained).
- Epilog: no limit of its own unless PrologEpilogTimeout is set.

A wrapper has to finish its checks *and* act (`sinfo`, then `scontrol update`, each a round trip
that may take up to MessageTimeout) before that limit, after Python has started. The checks get
what is left; a --timeout or --budget that does not fit is refused.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONF = "/etc/slurm/slurm.conf"
HEALTH_CHECK_LIMIT_S = 60.0  # slurm.conf(5), HealthCheckProgram: fixed in slurmd
MESSAGE_TIMEOUT_DEFAULT_S = 10.0  # slurm.conf(5), MessageTimeout default
PROLOG_EPILOG_TIMEOUT_UNSET = 65534  # slurm.conf(5): the default, "wait indefinitely"
START_RESERVE_S = 5.0  # Python start-up and imports of a wrapper on a loaded node
CHECKS_START_RESERVE_S = 5.0  # python -m checks starting before its --budget clock matters
SLURM_CALLS = 2  # sinfo (the node's state) and scontrol update (drain or resume)
EPILOG_TIMEOUT_UNBOUNDED_S = 300.0  # our own deadline when Slurm sets none for the Epilog
# Lines that describe nodes, partitions or other objects, not cluster-wide parameters.
OBJECT_KEYS = {"nodename", "partitionname", "nodeset", "downnodes", "frontendname", "switchname"}


class DeadlineError(Exception):
    """A time budget that cannot fit the scheduler's limit, or an unreadable slurm.conf."""


@dataclass(frozen=True)
class Limits:
    message_timeout_s: float
    prolog_epilog_timeout_s: float | None  # None: not set (Slurm waits indefinitely)
    scheduler_parameters: tuple[str, ...]
    source: str  # the file read, or "defaults"
    health_check_interval_s: float | None = None  # HealthCheckInterval; None: 0 or unset (off)

    @property
    def nohold_on_prolog_fail(self) -> bool:
        return "nohold_on_prolog_fail" in self.scheduler_parameters


@dataclass(frozen=True)
class Plan:
    """Deadlines baked into the wrappers."""

    check_timeout_s: float  # the check run (health check and epilog), killed after this
    slurm_call_timeout_s: float  # each sinfo / scontrol call of the health check and epilog
    prolog_call_timeout_s: float  # each sinfo / scontrol call of the prolog
    budget_s: float | None
    health_check_max_s: float  # the largest --timeout the health check can take
    epilog_max_s: float
    interval_s: float | None = None  # how often the health check runs (the staleness metric)


def parameters(text: str) -> dict[str, str]:
    """Cluster-wide `Key=Value` parameters of a slurm.conf text, keys in lower case."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        tokens = line.split()
        if not tokens or "=" not in tokens[0]:
            continue
        if tokens[0].split("=", 1)[0].lower() in OBJECT_KEYS:
            continue
        for token in tokens:
            key, sep, value = token.partition("=")
            if sep:
                found[key.lower()] = value
    return found


def _seconds(params: dict[str, str], key: str, default: float | None) -> float | None:
    raw = params.get(key.lower())
    if raw is None:
        return default
    if not re.fullmatch(r"\d+", raw):
        raise DeadlineError(f"slurm.conf: {key}={raw} is not a whole number of seconds")
    return float(raw)


def conf_path(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get("SLURM_CONF") or DEFAULT_CONF)


def read(path: Path | None) -> Limits:
    """The limits of the slurm.conf at `path`; Slurm's defaults when there is none."""
    if path is None or not path.exists():
        return Limits(MESSAGE_TIMEOUT_DEFAULT_S, None, (), "defaults")
    try:
        params = parameters(path.read_text(errors="replace"))
    except OSError as exc:
        raise DeadlineError(f"{path}: {exc.strerror or exc}") from None
    message = _seconds(params, "MessageTimeout", MESSAGE_TIMEOUT_DEFAULT_S)
    prolog_epilog = _seconds(params, "PrologEpilogTimeout", None)
    if prolog_epilog is not None and prolog_epilog >= PROLOG_EPILOG_TIMEOUT_UNSET:
        prolog_epilog = None
    sched = tuple(p.strip().lower() for p in params.get("schedulerparameters", "").split(",") if p)
    assert message is not None
    interval = _seconds(params, "HealthCheckInterval", None) or None  # 0: never runs
    return Limits(message, prolog_epilog, sched, str(path), interval)


def plan(limits: Limits, timeout_s: float | None, budget_s: float | None) -> Plan:
    """Deadlines for the three wrappers, or DeadlineError (one line) naming what does not fit."""
    call = limits.message_timeout_s
    reserve = START_RESERVE_S + SLURM_CALLS * call
    hc_max = HEALTH_CHECK_LIMIT_S - reserve
    why_hc = (f"slurmd kills a HealthCheckProgram after {HEALTH_CHECK_LIMIT_S:g} s; with "
              f"MessageTimeout={call:g} ({SLURM_CALLS} Slurm calls) and {START_RESERVE_S:g} s "
              f"start-up, the checks get at most {hc_max:g} s")
    if hc_max < 1:
        raise DeadlineError(f"no time left for the checks: {why_hc} ({limits.source})")
    if limits.prolog_epilog_timeout_s is None:
        epilog_max = EPILOG_TIMEOUT_UNBOUNDED_S
    else:
        epilog_max = limits.prolog_epilog_timeout_s - reserve
    chosen = min(hc_max, epilog_max) if timeout_s is None else timeout_s
    if not (math.isfinite(chosen) and chosen > 0):
        raise DeadlineError(f"--timeout {chosen:g} s: must be a positive number of seconds")
    if chosen > hc_max:
        raise DeadlineError(f"--timeout {chosen:g} s cannot fit: {why_hc} ({limits.source})")
    if chosen > epilog_max:
        raise DeadlineError(f"--timeout {chosen:g} s cannot fit the Epilog: PrologEpilogTimeout="
                            f"{limits.prolog_epilog_timeout_s:g} leaves {epilog_max:g} s "
                            f"({limits.source})")
    if budget_s is not None and budget_s > chosen - CHECKS_START_RESERVE_S:
        raise DeadlineError(f"--budget {budget_s:g} s cannot fit: the checks are killed after "
                            f"{chosen:g} s and need {CHECKS_START_RESERVE_S:g} s to start "
                            f"(at most {chosen - CHECKS_START_RESERVE_S:g} s); {why_hc}")
    prolog_limit = limits.message_timeout_s
    if limits.prolog_epilog_timeout_s is not None:
        prolog_limit = min(prolog_limit, limits.prolog_epilog_timeout_s)
    prolog_call = max(1.0, (prolog_limit - START_RESERVE_S) / SLURM_CALLS)
    return Plan(chosen, call, prolog_call, budget_s, hc_max, epilog_max,
                limits.health_check_interval_s)


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h' -> seconds (the format of python -m checks --budget)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise DeadlineError(f"invalid duration {text!r} (examples: 30s, 1m)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
