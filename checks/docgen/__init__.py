"""Documentation generated from the code's own data, so it cannot drift from it.

`python -m checks.docgen --write` runs every generator; `--check` exits 1 naming each stale file
(tests/framework/test_docgen.py runs it in CI). Each also runs alone as
`python -m checks.docgen.NAME [--write | --check]`:

roles: playbooks/roles/<role>/README.md from each role's meta/argument_specs.yml.
faults: docs/troubleshooting.md from the check registry and faults.yaml.
catalog: the check catalogue (docs/checks.md) and the scenario list (docs/scenarios.md).
kernlog: docs/kernel-log.md's XID, SXid, AER and corpus tables from checks/kernlog/.
options: the options table of docs/checks.md from `python -m checks`'s argparse parser.
gpu_models: the GPU-model lists of README.md, docs/checks.md, docs/blackwell.md and
    docs/scenarios.md from checks/profiles/*.yaml and the shipped scenarios.
trainer_tables: docs/trainer.md's `--size large` cost and traced-memory tables from
    trainer/sizes.py, the profiles and benchmarks/large_memory.json.
profile_digests: checks/schema/profile-digests.json, the shipped profiles the tests validated
    (a profile whose text is listed there is not validated again at run time).
check_index: docs/checks.md's "Where a check lives" (each check's module and the scenarios that
    show it failing), threshold-default and peer-check tables, and docs/scenarios.md's fault
    table, from the registry, the checks' source and real runs of the shipped scenarios.
gpu_fields: docs/hardware-layer.md's GPU-field table (NVML functions, the checks that read each
    field) and docs/scenarios.md's list of scenario keys.
example_output: README.md's example output and docs/fleet.md's compact line, from a real run
    of the node-gpu-lost scenario.
preflight_models: the preflight role's GPU-model and platform tables from the profiles.

A new module here is a generator too (it needs `main(argv) -> int` taking [], ["--write"] or
["--check"]); only the modules of HELPERS are not.
"""

import pkgutil

# Run first, in this order; any other module of the package runs after them, by name.
GENERATORS = ("roles", "faults", "catalog", "kernlog", "options", "gpu_models", "trainer_tables")
HELPERS = ("regions", "derive")


def generators() -> tuple[str, ...]:
    """Every generator module of this package: GENERATORS, then the others by name."""
    found = {m.name for m in pkgutil.iter_modules(__path__)} - set(HELPERS) - {"__main__"}
    return (*[g for g in GENERATORS if g in found], *sorted(found - set(GENERATORS)))
