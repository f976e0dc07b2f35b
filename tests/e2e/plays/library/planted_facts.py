#!/usr/bin/python
# Copyright: nodecert contributors
# Apache License 2.0 (see pyproject.toml)
"""Test-only Ansible module: return the given facts as the host's facts (architecture,
distribution...), so the roles' selection logic runs as on such a host without gathering."""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True
    )
    module.exit_json(changed=False, ansible_facts=module.params["facts"])


if __name__ == "__main__":
    main()
