"""What a GPU lost from the bus leaves unmeasured on its host, from the check declarations
(@check scope, needs, gated_by) rather than a list kept by hand: a new per-GPU check joins it
by declaring scope="gpu". tests/framework/test_registry_declarations.py holds the declarations
to what the checks do on the node-gpu-lost scenario."""

from __future__ import annotations

from checks.node import registry


def dependents(level: str = "standard") -> list[str]:
    """The checks the fleet folds under gpu-count for a lost GPU, in report order: those that
    read each GPU (scope gpu or gpus) report it as not measured '(see gpu-count)'; those the
    gpu-occupied gate holds back SKIP instead, since the gate could not measure it either."""
    held = set(registry.depends_on("gpu-occupied"))
    return [c.id for c in registry.select(level) if c.scope != "host" and c.id not in held]
