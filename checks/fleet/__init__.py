"""Fleet mode: the host reports of one verify run aggregated into one report.

Layers, as in the rest of `checks`: `load` (read and validate reports), `figures` and
`stragglers` (pure logic over report data), `aggregate` (the Fleet), `history` (SQLite run
history, lemons), and the front ends: `cli` (`python -m checks.fleet`), `terminal`, `junit` and
`slurm` (`python -m checks.fleet.slurm`). The HTML and Prometheus renderers live in checks.render.

Entry points: `checks.fleet.aggregate.load(directory)` and `.from_reports(reports)` → `Fleet`.
"""
