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

A new module here is a generator too (it needs `main(argv) -> int` taking [], ["--write"] or
["--check"]); only the modules of HELPERS are not.
"""

import pkgutil

# Run first, in this order; any other module of the package runs after them, by name.
GENERATORS = ("roles", "faults", "catalog", "kernlog", "options", "gpu_models", "trainer_tables")
HELPERS = ("regions",)


def generators() -> tuple[str, ...]:
    """Every generator module of this package: GENERATORS, then the others by name."""
    found = {m.name for m in pkgutil.iter_modules(__path__)} - set(HELPERS) - {"__main__"}
    return (*[g for g in GENERATORS if g in found], *sorted(found - set(GENERATORS)))
