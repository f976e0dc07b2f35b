"""Documentation generated from the code's own data, so it cannot drift from it.

`python -m checks.docgen --write` runs every generator below; `--check` exits 1 naming each
stale file (tests/framework/test_docgen.py runs it in CI). Each also runs alone as
`python -m checks.docgen.NAME [--write | --check]`:

roles: playbooks/roles/<role>/README.md from each role's meta/argument_specs.yml.
faults: docs/troubleshooting.md from the check registry and faults.yaml.
catalog: the check catalogue (docs/checks.md) and the scenario list (docs/scenarios.md).
kernlog: docs/kernel-log.md's XID, SXid, AER and corpus tables from checks/kernlog/.
options: the options table of docs/checks.md from `python -m checks`'s argparse parser.
"""

# Run in this order by `python -m checks.docgen`; each is a module with main(argv) -> int.
GENERATORS = ("roles", "faults", "catalog", "kernlog", "options")
