"""Measurement code behind the workload checks (collectives, P2P, DataLoader, compute, burn-in).

Nothing here decides PASS or FAIL. Modules that touch torch or the machine (`collective_rank`,
`collective`, `compute`, `burn`, `dataloader`) are reached only through `hw.Backend.workload()`
(`local.run` on a real host); `scenario` turns a scenario's `measurements:` into the same shapes;
`busbw`, `rules` and `verdict` are pure functions the checks and the rank program share.
"""
