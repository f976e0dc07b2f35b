"""NVIDIA DCGM's own diagnostic, when DCGM is installed: `dcgmi diag -r N -j`, bounded by the
level's time budget, its JSON mapped to one result per test and GPU.

The JSON layout changed between DCGM versions: 3.x wraps it in "DCGM GPU Diagnostic" with
"gpu_id"/"gpu_ids" per result and display names; 4.x in "DCGM Diagnostic" with entity ids,
plugin names and a "test_summary", and some 4.x builds put "tests" at the top level. Test names
are mapped through checks/node/dcgm_tests.yaml; results DCGM gets wrong (a Pass with an
allocation error, NVIDIA/DCGM#284) are handled there too. Tests DCGM skipped at the level asked
for are never a pass (NVIDIA/DCGM#55).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from checks.hw.base import HardwareError, NotSupported
from checks.model import Device, Result, Status, error, passed, skip
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

TABLE = Path(__file__).resolve().parents[1] / "dcgm_tests.yaml"
STATUS = {"pass": Status.PASS, "passed": Status.PASS, "fail": Status.FAIL,
          "failed": Status.FAIL, "warn": Status.WARN, "warning": Status.WARN,
          "skip": Status.SKIP, "skipped": Status.SKIP, "not run": Status.SKIP}
REMEDY_SKIPPED = ("DCGM skipped tests of this level: a GPU model DCGM does not list as allowed "
                  "skips every test past level 1 until its diag configuration allows it "
                  "(NVIDIA/DCGM#55: is_allowed); run `dcgmi diag -r <level> -v` to see why")


class DiagParseError(Exception):
    """The output is not a dcgmi diag JSON document (one line saying why)."""


@dataclass
class TestResult:
    name: str  # as DCGM printed it
    key: str  # dcgm_tests.yaml key, or the normalised name when unknown
    status: Status
    gpus: tuple[int, ...] | None  # None: for every GPU (deployment checks, test_summary)
    warnings: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


@dataclass
class Diag:
    version: str | None
    runtime_error: str | None
    results: list[TestResult]


def _norm(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.strip().lower())


@functools.cache
def table() -> dict[str, Any]:
    data = yaml.safe_load(TABLE.read_text())
    aliases = {_norm(n): key for key, spec in data["tests"].items() for n in spec["names"]}
    return {"tests": data["tests"], "aliases": aliases,
            "false_positives": data.get("false_positives") or []}


def _texts(value: Any) -> list[str]:
    """warnings/info: a string, a list of strings, or a list of {warning|message|...: text}."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value.strip() else []
    out = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, dict):
            text = item.get("warning") or item.get("message") or item.get("info") or ""
            code = item.get("error_id", item.get("error_code"))
            out.append(f"{text} (error id {code})" if code not in (None, "") else str(text))
        elif item is not None:
            out.append(str(item))
    return out


def _gpus(result: dict[str, Any]) -> tuple[int, ...] | None:
    if str(result.get("entity_group", "GPU")).upper() != "GPU":
        return ()
    for key in ("gpu_id", "gpu_ids", "entity_id"):
        if key in result:
            raw = result[key]
            ids = raw if isinstance(raw, list) else str(raw).split(",")
            try:
                return tuple(int(str(i).strip()) for i in ids if str(i).strip())
            except ValueError:
                return None
    return None


def parse_diag(text: str) -> Diag:
    """Any dcgmi diag -j document (3.x or 4.x layout); text before the first '{' (dcgmi prints
    warnings there) and after the document is ignored."""
    start = text.find("{")
    if start < 0:
        first = text.strip().splitlines()[0] if text.strip() else "no output"
        raise DiagParseError(f"no JSON in the output: {first[:160]}")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise DiagParseError(f"output is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DiagParseError("the JSON document is not an object")
    root = data.get("DCGM Diagnostic", data.get("DCGM GPU Diagnostic", data))
    if not isinstance(root, dict):
        raise DiagParseError("the diagnostic section is not an object")
    meta: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
    version = root.get("version") or meta.get("version") or meta.get("DCGM Version")
    runtime = root.get("runtime_error") or data.get("runtime_error")
    categories = [c for c in root.get("test_categories") or [] if isinstance(c, dict)]
    if isinstance(root.get("tests"), list):
        categories.append({"category": None, "tests": root["tests"]})
    aliases = table()["aliases"]
    results: list[TestResult] = []
    for category in categories:
        for test in category.get("tests") or []:
            if not isinstance(test, dict) or not test.get("name"):
                continue  # DCGM 3.1 printed null between tests
            name = str(test["name"])
            key = aliases.get(_norm(name), _norm(name))
            entries = [r for r in test.get("results") or [] if isinstance(r, dict)]
            if not entries and isinstance(test.get("test_summary"), dict):
                entries = [{**test["test_summary"], "entity_group": "GPU"}]
                entries[0].pop("gpu_id", None)
            for entry in entries:
                raw = str(entry.get("status", "")).strip().lower()
                status = STATUS.get(raw)
                warnings = _texts(entry.get("warnings")) + _texts(entry.get("errors"))
                if status is None:
                    status = Status.ERROR
                    warnings.append(f"DCGM status {entry.get('status')!r} is not one this "
                                    "tool knows")
                gpus = _gpus(entry)
                if gpus == ():
                    continue  # a result about another entity (NVSwitch, CPU)
                results.append(TestResult(name, key, status, gpus, warnings,
                                          _texts(entry.get("info"))))
    return Diag(str(version) if version else None, str(runtime) if runtime else None, results)


def judge(result: TestResult) -> tuple[Status, str | None]:
    """DCGM's status, corrected by the false-positive rules: (status, why it was changed)."""
    for rule in table()["false_positives"]:
        if result.key != rule["test"] or result.status is not Status.PASS:
            continue
        if any(re.search(rule["warning"], w, re.I) for w in result.warnings):
            return Status(rule["status"].upper()), (
                f"DCGM reported Pass with {rule['id']} ({rule['source']}): not trusted")
    return result.status, None


def _levels(ctx: Context) -> tuple[str, float]:
    level = ctx.options.level
    runs = ctx.profile.require("dcgm.run_by_level")
    budgets = ctx.profile.require("dcgm.timeout_s_by_level")
    if level not in runs or level not in budgets:
        raise NotSupported(f"no DCGM run configured for level {level}")
    return str(runs[level]), float(budgets[level])


def _diagnose(ctx: Context) -> tuple[Any, str, str] | Result:
    """Run `dcgmi diag` at the level's depth and parse it: (diag, label, run level), or the one
    result that says why there is nothing to judge."""
    try:
        run_level, budget = _levels(ctx)
    except NotSupported as exc:
        return skip(str(exc))
    try:
        run = ctx.hw.dcgm_diag(run_level, budget)
    except HardwareError as exc:
        return error(f"dcgmi diag -r {run_level}: {exc}")
    label = f"dcgmi diag -r {run_level}"
    if run.timed_out:
        return error(f"{label} did not finish within {budget:g} s (the {ctx.options.level} "
                     "level's budget) and was killed", value=budget, unit="s",
                     remedy="a hung diagnostic (NVIDIA/DCGM#136, #247): check nv-hostengine "
                            "and /var/log/nvidia-dcgm/nvvs.log; the GPUs may need a reset; "
                            "raise dcgm.timeout_s_by_level only for a known slow level")
    try:
        diag = parse_diag(run.stdout)
    except DiagParseError as exc:
        stderr = (run.stderr.strip().splitlines() or [""])[0]
        return error(f"{label} exited {run.returncode}: {exc}" + (f"; stderr: {stderr}" if stderr
                                                                  else ""))
    if diag.runtime_error:
        return error(f"{label}: DCGM runtime error: {diag.runtime_error}")
    if not diag.results:
        return error(f"{label} exited {run.returncode} with no test results")
    return diag, label, run_level


@check("dcgm-diag", code="DCGM001", title="DCGM diagnostic (dcgmi diag) within the level's budget",
       level="standard", needs=("driver-loaded",), timeout_s=3600,
       # dcgmi diag -r 2 (standard): "~2 min" (field-reference.md); without DCGM it SKIPs at once
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=150), source="estimated"))
def dcgm_diag(ctx: Context) -> Iterator[Result]:
    """When DCGM is installed: `dcgmi diag -r N -j` with N and its deadline from the profile
    (dcgm.run_by_level, dcgm.timeout_s_by_level); killed at the deadline: ERROR. Each test's
    result per GPU becomes one result (names of DCGM 3.x and 4.x mapped by
    checks/node/dcgm_tests.yaml); a Pass DCGM contradicts with its own allocation error
    (NVIDIA/DCGM#284) FAILs; tests skipped at the level asked for are dcgm.skipped_status."""
    path = ctx.hw.dcgmi()
    if path is None:
        yield skip("DCGM is not installed (no dcgmi): nothing to run")
        return
    outcome = _diagnose(ctx)
    if isinstance(outcome, Result):
        yield outcome
        return
    diag, label, run_level = outcome
    devices = _devices(ctx)
    tests = table()["tests"]
    skipped_status = Status(str(ctx.profile.require("dcgm.skipped_status")).upper())
    passed_tests: set[str] = set()
    flagged = 0
    details_common: dict[str, Any] = {"dcgm_version": diag.version, "run_level": run_level}
    for res in diag.results:
        status, reason = judge(res)
        spec = tests.get(res.key, {})
        if status is Status.PASS:
            passed_tests.add(res.name)
            continue
        if status is Status.SKIP:
            expected_here = int(spec.get("level", 99)) <= int(run_level)
            if not expected_here:
                continue  # not part of this level: not DCGM's omission
            status = skipped_status
        where = "all GPUs" if res.gpus is None else ", ".join(f"GPU {g}" for g in res.gpus)
        said = "; ".join(res.warnings) or "no detail given"
        message = f"{res.name} ({where}): DCGM {res.status.value.lower()}"
        if reason:
            message += f", judged {status.value}: {reason}"
        message += f": {said[:300]}"
        remedy = REMEDY_SKIPPED if res.status is Status.SKIP else spec.get(
            "action", "read DCGM's message and nvvs.log (/var/log/nvidia-dcgm)")
        targets = [devices.get(g) for g in res.gpus] if res.gpus else [None]
        flagged += 1
        for device in targets:
            yield Result(status, message, value=res.key, expected="Pass", remedy=remedy,
                         device=device,
                         details={**details_common, "test": res.name, "test_key": res.key,
                                  "dcgm_status": res.status.value, "warnings": res.warnings})
    if passed_tests:
        yield passed(f"{label} (DCGM {diag.version or 'version not printed'}): passed "
                     f"{', '.join(sorted(passed_tests))}", value=len(passed_tests), unit="tests",
                     details=details_common)
    elif not flagged:
        yield skip(f"{label}: DCGM reported only tests beyond level {run_level}, all skipped",
                   details=details_common)


def _devices(ctx: Context) -> dict[int, Device]:
    """DCGM numbers GPUs as NVML does."""
    try:
        return {g.device.index: g.device for g in ctx.gpus if g.device.index is not None}
    except HardwareError:
        return {}
