"""GPU memory health from NVML, one result per GPU: ECC counts, retired pages (pre-Ampere),
row remapping (Ampere and later)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from checks.hw.base import NotSupported
from checks.model import Result, fail, passed, warn
from checks.node.context import Context, Gpu
from checks.node.perdevice import each_gpu
from checks.node.registry import Budget, Cost, check

DRIVER = ("driver-loaded",)
REMEDY_RMA = "drain the node and open an RMA for this GPU (quote serial and the fault code)"


@check("ecc-errors", code="GPU002", title="ECC enabled, no uncorrectable errors", needs=DRIVER,
       scope="gpu",
       nvml=("ecc_mode", "ecc_volatile_uncorrected", "ecc_volatile_corrected",
             "ecc_aggregate_uncorrected", "ecc_aggregate_corrected", "ecc_by_location"),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def ecc_errors(ctx: Context) -> Iterator[Result]:
    """Volatile (since boot) uncorrectable ECC errors fail. Where NVML splits counts by location
    (Ampere+), correctable counts are judged per location (SRAM ecc.sram_corrected_warn, DRAM
    ecc.dram_corrected_warn) and aggregate SRAM uncorrectable errors warn (they cannot be
    remapped); otherwise volatile/aggregate totals are judged. The lifetime (aggregate)
    uncorrectable count is always reported."""
    p = ctx.profile

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        if not q("ecc_mode"):
            if p.get("ecc.required"):
                return warn("ECC is disabled", value=False, expected="enabled",
                            remedy="nvidia-smi -e 1 and reboot (datacenter GPUs train with ECC on)")
            return passed("ECC disabled (not required by the profile)", value=False)
        vol_unc = int(q("ecc_volatile_uncorrected"))
        vol_cor = int(q("ecc_volatile_corrected"))
        agg_cor = int(q("ecc_aggregate_corrected"))
        counts: dict[str, Any] = {"volatile_uncorrected": vol_unc, "volatile_corrected": vol_cor,
                                  "aggregate_corrected": agg_cor}
        try:
            agg_unc: int | None = int(q("ecc_aggregate_uncorrected"))
            counts["aggregate_uncorrected"] = agg_unc
        except NotSupported:
            agg_unc = None
        try:
            by_location = dict(q("ecc_by_location"))
            counts["by_location"] = by_location
        except NotSupported:
            by_location = {}
        lifetime = "" if agg_unc is None else f", {agg_unc} uncorrectable lifetime"
        limit = int(p.require("ecc.volatile_uncorrected_max"))
        if vol_unc > limit:
            where = ", ".join(f"{loc.upper()} {c.get('volatile_uncorrected', 0)}"
                              for loc, c in sorted(by_location.items())
                              if c.get("volatile_uncorrected"))
            return fail(f"{vol_unc} uncorrectable ECC error(s) since boot"
                        + (f" ({where})" if where else "") + lifetime, value=vol_unc,
                        expected=f"<= {limit}", details=counts,
                        remedy="drain the node; reset the GPU (nvidia-smi -r) to trigger row "
                               "remapping, re-run; if errors return, " + REMEDY_RMA)
        if by_location:
            sram, dram = by_location.get("sram", {}), by_location.get("dram", {})
            sram_warn = int(p.require("ecc.sram_corrected_warn"))
            dram_warn = int(p.require("ecc.dram_corrected_warn"))
            sram_cor = int(sram.get("aggregate_corrected", sram.get("volatile_corrected", 0)))
            dram_cor = int(dram.get("aggregate_corrected", dram.get("volatile_corrected", 0)))
            sram_unc = int(sram.get("aggregate_uncorrected", 0))
            shown = f"SRAM {sram_cor} / DRAM {dram_cor} correctable{lifetime}"
            if sram_unc > int(p.require("ecc.sram_uncorrected_warn")):
                return warn(f"{sram_unc} uncorrectable SRAM error(s) over the GPU's life; "
                            f"{shown}", value=sram_unc, details=counts,
                            expected=f"SRAM uncorrectable <= {p.require('ecc.sram_uncorrected_warn')}",
                            remedy="SRAM errors cannot be remapped: watch the count; " + REMEDY_RMA)
            if sram_cor > sram_warn or dram_cor > dram_warn:
                return warn(f"high correctable ECC counts: {shown}", value=max(sram_cor, dram_cor),
                            expected=f"SRAM <= {sram_warn}, DRAM <= {dram_warn}", details=counts,
                            remedy="watch the trend; plan an RMA if it keeps rising")
            return passed(f"ECC on, 0 uncorrectable since boot; {shown}", value=vol_unc,
                          expected=f"<= {limit} uncorrectable", details=counts)
        vol_warn, agg_warn = int(p.require("ecc.volatile_corrected_warn")), int(
            p.require("ecc.aggregate_corrected_warn"))
        if vol_cor > vol_warn or agg_cor > agg_warn:
            return warn(f"high correctable ECC counts (volatile {vol_cor}, aggregate {agg_cor})"
                        + lifetime, value=vol_cor,
                        expected=f"volatile <= {vol_warn}, aggregate <= {agg_warn}",
                        details=counts, remedy="watch the trend; plan an RMA if it keeps rising")
        return passed(f"ECC on, 0 uncorrectable, {vol_cor} correctable since boot{lifetime}",
                      value=vol_unc, expected=f"<= {limit} uncorrectable", details=counts)

    yield from each_gpu(ctx, measure)


@check("retired-pages", code="GPU003", title="retired memory pages (pre-Ampere GPUs)",
       needs=DRIVER, scope="gpu", nvml=("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"),
       budget=Budget(value=6, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def retired_pages(ctx: Context) -> Iterator[Result]:
    """Pages retired for ECC errors; pending retirement or more than retired_pages.max fails.
    Ampere and newer remap rows instead (see row-remap) and report SKIP here."""
    limit = int(ctx.profile.require("retired_pages.max"))

    def measure(gpu: Gpu) -> Result:
        q = gpu.handle.query
        sbe, dbe, pending = int(q("retired_pages_sbe")), int(q("retired_pages_dbe")), bool(
            q("retired_pages_pending"))
        total = sbe + dbe
        if pending:
            return fail(f"page retirement pending ({total} retired)", value=total,
                        remedy="reset the GPU or reboot to apply the retirement, then re-verify")
        if total > limit:
            return fail(f"{total} retired pages ({dbe} double-bit)", value=total,
                        expected=f"<= {limit}", remedy=REMEDY_RMA)
        return passed(f"{total} retired pages", value=total, expected=f"<= {limit}")

    yield from each_gpu(ctx, measure)


@check("row-remap", code="GPU004", title="row remapping: nothing pending or failed", needs=DRIVER,
       scope="gpu", nvml=("remapped_rows",),
       budget=Budget(value=10, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def row_remap(ctx: Context) -> Iterator[Result]:
    """Ampere+ remap HBM rows after memory errors. NVIDIA's GPU memory error management guide: a
    remap takes effect at the next GPU reset, and while it is pending unaffected workloads go on
    and new ones can start (error containment keeps the bad row out of use); a remapping failure
    is an RMA condition. So: a failure fails with RMA; a pending remap with uncorrectable remaps
    counted fails (reset the GPU); one pending for correctable errors only warns (reset at the next
    idle window); without anything pending, uncorrectable remaps from row_remap.uncorrectable_warn
    on warn."""
    warn_at = int(ctx.profile.require("row_remap.uncorrectable_warn"))

    def measure(gpu: Gpu) -> Result:
        rows = gpu.handle.query("remapped_rows")
        corr, unc = int(rows.get("correctable", 0)), int(rows.get("uncorrectable", 0))
        counted = f"{unc} uncorrectable, {corr} correctable rows remapped"
        if rows.get("failed"):
            return fail(f"row remapping failed ({counted}): a bank ran out of spare rows, the "
                        "memory can no longer be repaired", value=rows,
                        expected="no remapping failure", remedy=REMEDY_RMA)
        if rows.get("pending") and unc:
            return fail(f"row remap pending after uncorrectable errors ({counted}); it takes "
                        "effect at the next GPU reset", value=rows, expected="no remap pending",
                        remedy="stop the jobs on this GPU and reset it (nvidia-smi -r -i N) or "
                               "reboot, then re-verify that nothing is pending")
        if rows.get("pending"):
            return warn(f"row remap pending for correctable errors only ({counted}); it takes "
                        "effect at the next GPU reset, workloads go on meanwhile", value=rows,
                        expected="no remap pending",
                        remedy="reset the GPU at its next idle window (nvidia-smi -r -i N), then "
                               "re-verify that nothing is pending")
        if unc >= warn_at:
            return warn(f"{unc} rows remapped for uncorrectable errors", value=rows,
                        expected=f"< {warn_at}",
                        remedy="watch the trend; RMA if remaps keep growing")
        return passed(f"no remap pending ({corr} correctable, {unc} uncorrectable remapped)",
                      value=rows)

    yield from each_gpu(ctx, measure)
