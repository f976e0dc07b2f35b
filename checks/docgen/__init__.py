"""Documentation generated from the code's own data, so it cannot drift from it.

roles: playbooks/roles/<role>/README.md from each role's meta/argument_specs.yml.
faults: docs/troubleshooting.md from the check registry and faults.yaml.
"""
