"""The drift rule: a GPU slower than it used to be, judged against its own history.

The straggler rule compares a GPU with its peers in this run; an absolute threshold compares it
with the slowest acceptable part of its model. Neither sees a GPU that was the fastest of its
node at acceptance and has lost 8 % since: it still passes both. Here each figure is compared
with the same GPU's own baseline, followed by UUID wherever the GPU moved (history.py):

- baseline `median`: the median of its values in the last `drift.window` earlier runs (at least
  `drift.min_runs` of them), robust to one bad run;
- baseline `first`: its first recorded value, for figures measured at acceptance (the first
  burn-in) and rarely after (`drift.baseline_by_check`).

With the deficit measured from the baseline in the figure's bad direction (below it for rates,
above it for times): deficit > `drift.fail_pct` → FAIL, > `drift.warn_pct` → WARN. Host-level
figures (P2P bandwidth of the node) are followed by host name instead of UUID. Thresholds come
from the profile of the host's GPU model (checks/profiles/*.yaml, `drift:`).
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from checks import profiles
from checks.report.figures import Figure, higher_is_better
from checks.report.findings import Drift
from checks.report.stragglers import deficit_pct

if TYPE_CHECKING:
    from checks.fleet.history import History
    from checks.report.aggregate import Fleet

BASELINES = ("median", "first")


class DriftConfigError(Exception):
    """A profile's drift: section is malformed (one line)."""


@dataclass(frozen=True)
class Rule:
    warn_pct: float
    fail_pct: float
    min_runs: int
    window: int
    baseline: str
    baseline_by_check: tuple[tuple[str, str], ...]
    checks: tuple[str, ...]

    def baseline_of(self, check: str) -> str:
        return dict(self.baseline_by_check).get(check, self.baseline)

    def classify(self, deficit: float) -> str | None:
        if deficit > self.fail_pct:
            return "FAIL"
        if deficit > self.warn_pct:
            return "WARN"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"warn_pct": self.warn_pct, "fail_pct": self.fail_pct, "min_runs": self.min_runs,
                "window": self.window, "baseline": self.baseline,
                "baseline_by_check": dict(self.baseline_by_check), "checks": list(self.checks)}


def rule_from(profile: profiles.Profile) -> Rule:
    """The profile's `drift:` section, checked (a malformed one raises DriftConfigError)."""
    d = profile.get("drift")
    if not isinstance(d, dict):
        raise DriftConfigError(f"profile {profile.name} has no drift: section")
    try:
        rule = Rule(float(d["warn_pct"]), float(d["fail_pct"]), int(d["min_runs"]),
                    int(d["window"]), str(d["baseline"]),
                    tuple(sorted((str(k), str(v)) for k, v in (d.get("baseline_by_check") or {}).items())),
                    tuple(str(c) for c in d["checks"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DriftConfigError(f"profile {profile.name}: drift: {type(exc).__name__} {exc}") from None
    kinds = {rule.baseline, *(v for _, v in rule.baseline_by_check)}
    if not kinds <= set(BASELINES):
        raise DriftConfigError(f"profile {profile.name}: drift baseline must be one of {BASELINES}")
    if not 0 < rule.warn_pct <= rule.fail_pct or rule.min_runs < 1 or rule.window < rule.min_runs:
        raise DriftConfigError(f"profile {profile.name}: need 0 < drift.warn_pct <= drift.fail_pct "
                               "and 1 <= drift.min_runs <= drift.window")
    return rule


@functools.cache
def rule_for(profile_name: str) -> Rule:
    try:
        profile = profiles.load(profile_name)
    except profiles.ProfileError:
        profile = profiles.load(profiles.GENERIC)
    return rule_from(profile)


def judge(fig: Figure, rule: Rule, earlier: list[float], first: float | None) -> Drift | None:
    """`fig` against its own history: `earlier` values (oldest first), `first` recorded value.
    None when there is no baseline yet (too few earlier runs, or a baseline of 0)."""
    kind = rule.baseline_of(fig.check)
    if kind == "first":
        if first is None:
            return None
        baseline, runs = first, 1
    else:
        recent = earlier[-rule.window:]
        if len(recent) < rule.min_runs:
            return None
        baseline, runs = statistics.median(recent), len(recent)
    if baseline <= 0:
        return None
    deficit = deficit_pct(fig.value, baseline, higher_is_better(fig.name))
    return Drift(fig.host, fig.check, fig.name, fig.gpu, fig.value, baseline, kind, runs, deficit,
                 rule.warn_pct, rule.fail_pct, rule.classify(deficit),
                 tuple([*earlier[-rule.window:], fig.value]))


def _key(fig: Figure) -> str:
    return fig.gpu.uuid if fig.gpu and fig.gpu.uuid else f"host:{fig.host}"


def find(fleet: Fleet, store: History, run_id: str | None = None) -> list[Drift]:
    """Every figure of the drift checks in `fleet`, judged against the history recorded before
    this run (run `run_id` itself, if recorded already, is left out). Returns all judged figures,
    drifting ones (status set) first, worst first."""
    run_id = run_id or fleet.run_id
    profile_of = {h.host: h.profile or profiles.GENERIC for h in fleet.hosts}
    rules = {name: rule_for(name) for name in set(profile_of.values())}
    checks = sorted({c for r in rules.values() for c in r.checks})
    window = max((r.window for r in rules.values()), default=1)
    figures = [f for group in fleet.figure_groups.values() for f in group if f.check in checks]
    if not figures:
        return []
    series = store.figure_series(checks, before=run_id, window=window)
    needs_first = any(r.baseline_of(c) == "first" for r in rules.values() for c in r.checks)
    firsts = store.first_figures(checks, before=run_id) if needs_first else {}
    out = []
    for fig in figures:
        rule = rules[profile_of[fig.host]]
        if fig.check not in rule.checks or (fig.gpu is not None and not fig.gpu.uuid):
            continue
        key = (_key(fig), fig.check, fig.name)
        earlier = [v for _, v in series.get(key, [])]
        first = firsts[key][1] if key in firsts else None
        verdict = judge(fig, rule, earlier, first)
        if verdict is not None:
            out.append(verdict)
    order = {"FAIL": 0, "WARN": 1, None: 2}
    out.sort(key=lambda d: (order[d.status], -d.deficit_pct, d.host, d.check, d.name))
    return out


def drifting(drifts: Iterable[Drift]) -> list[Drift]:
    return [d for d in drifts if d.status]
