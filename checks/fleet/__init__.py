"""The controller side: the host reports of one verify run aggregated into one report.

Layers: `load` (read and validate reports), `figures`, `stragglers`, `digest_groups`, `nvl72`
(pure logic over report data), `findings` (the value types the report holds), `aggregate` (the
Fleet), `history` (SQLite run history, lemons) and `drift`, and the front ends: `fleet_cli`
(`python -m checks.fleet`), `fleet_terminal`, `fleet_junit`, `slurm` (`python -m
checks.fleet.slurm`), `crosshost_plan` (plans and merges the cross-host stage whose node side is
`checks.node.crosshost_node`). The HTML and Prometheus renderers live in checks.render.

Entry points: `checks.report.aggregate.load(directory)` and `.from_reports(reports)` → `Fleet`.
"""
