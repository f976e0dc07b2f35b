"""Measurements on the machine behind the workload checks (collectives, P2P, DataLoader, compute,
burn-in, reference digests): part of the hardware layer, reached only through
`Backend.workload()`.

Nothing here decides PASS or FAIL (the rules are in `checks.node`). On a real host `local.run`
measures, anything that creates a CUDA context in a child process (`isolate` → `isolate_child`);
on the fixture backend `scenario` turns a scenario's `measurements:` into the same shapes. Ranks of
collectives run `collective_rank` under `checks.supervise`.
"""
