"""Each role's README.md is generated from its meta/argument_specs.yml and kept in sync."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from checks.docgen import roles as gen

FIX = "run: python -m checks.docgen.roles --write"


def test_every_role_readme_is_current() -> None:
    all_roles = gen.roles()
    assert {r.name for r in all_roles} == {
        d.name for d in gen.ROLES.iterdir() if (d / "meta" / "argument_specs.yml").exists()}
    stale = gen.stale(all_roles)
    assert not stale, f"role READMEs out of date: {stale}; {FIX}"


def test_every_role_declares_what_it_installs() -> None:
    problems = [p for r in gen.roles() for p in r.problems]
    assert not problems, "\n".join(problems)


def test_real_readme_carries_spec_variables_tags_and_reboot() -> None:
    driver = next(r for r in gen.roles() if r.name == "nvidia_driver")
    text = gen.markdown(driver)
    for name in driver.spec["options"]:
        assert f"| `{name}` |" in text
    assert "| `nvidia_driver_install` |" in text
    assert "Reboot to load the NVIDIA driver" in text and "tasks/load.yml" in text


def test_phase_tags_behind_an_include_are_listed() -> None:
    """Phases that only some hosts need are included (tagged `always`): the README lists the
    phases inside, not `always`."""
    for role, phase, where in [("nvidia_driver", "nvidia_driver_load", "tasks/load.yml"),
                               ("fabric_manager", "fabric_manager_service", "tasks/service.yml"),
                               ("imex", "imex_configure", "tasks/configure.yml")]:
        text = gen.markdown(next(r for r in gen.roles() if r.name == role))
        assert f"| `{phase}` |" in text and where in text, role
        assert "| `always` |" not in text, role


# --- the generator on a made-up role --------------------------------------------------------

SPEC = """\
---
# installs:
#   - apt: C(demo-tool)
argument_specs:
  main:
    short_description: Install C(demo-tool) for <branch>
    description:
      - First paragraph.
      - Second | paragraph.
    options:
      demo_mode:
        type: str
        default: auto
        choices: [auto, fast]
        description: How it runs.
      demo_extra_packages:
        type: list
        elements: str
        default: []
        description: More packages.
      demo_token:
        type: str
        required: true
        description: Must be given.
"""

TASKS_MAIN = """\
---
- name: Install demo
  ansible.builtin.import_tasks: install.yml
  tags: [demo_install]
"""

TASKS_INSTALL = """\
---
- name: Install the packages
  ansible.builtin.apt:
    name: [demo-tool, demo-helper, "{{ demo_extra_packages }}"]
- name: Ask for a reboot
  ansible.builtin.debug:
    msg: reboot
  when: demo_mode == 'fast'
  notify: Reboot the demo node
"""

HANDLERS = """\
---
- name: Reboot the demo node
  ansible.builtin.reboot:
  throttle: 1
- name: Restart demo
  ansible.builtin.systemd_service:
    name: demo
    state: restarted
"""


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    role = tmp_path / "playbooks" / "roles" / "demo"
    for sub, name, text in [("meta", "argument_specs.yml", SPEC), ("tasks", "main.yml", TASKS_MAIN),
                            ("tasks", "install.yml", TASKS_INSTALL),
                            ("handlers", "main.yml", HANDLERS)]:
        (role / sub).mkdir(parents=True, exist_ok=True)
        (role / sub / name).write_text(text)
    (tmp_path / "playbooks" / "site.yml").write_text(
        "- hosts: all\n  roles:\n    - role: demo\n      tags: [demo]\n")
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "ROLES", tmp_path / "playbooks" / "roles")
    monkeypatch.setattr(gen, "PLAYBOOKS", tmp_path / "playbooks")
    return role


def test_generated_readme_sections(tree: Path) -> None:
    (role,) = gen.roles()
    text = gen.markdown(role)
    assert "**Install `demo-tool` for &lt;branch&gt;**" in text
    assert "First paragraph.\n\nSecond | paragraph." in text
    assert "| `demo_mode` | str | `auto` | `auto`, `fast` | How it runs. |" in text
    assert "| `demo_extra_packages` | list of str | `[]` | - | More packages. |" in text
    assert "| `demo_token` | str | **required** | - | Must be given. |" in text
    assert "- apt: `demo-tool`" in text
    assert "| `demo` | the whole role | playbooks/site.yml |" in text
    assert "| `demo_install` | Install demo | tasks/install.yml |" in text
    assert ("Handler **Reboot the demo node** (`ansible.builtin.reboot`, 1 host at a time); "
            "task *Ask for a reboot* (tasks/install.yml) notifies it when `demo_mode == 'fast'`."
            in text)
    assert "Restart demo" not in text  # not a reboot


def test_installs_block_must_name_what_the_tasks_install(tree: Path) -> None:
    (role,) = gen.roles()
    assert role.problems == [
        "playbooks/roles/demo/meta/argument_specs.yml: '# installs:' does not name demo-helper "
        "(installed in tasks/install.yml)",
        "playbooks/roles/demo/meta/argument_specs.yml: '# installs:' does not name the variable "
        "demo_extra_packages"]


def test_role_without_installs_block_or_reboot(tree: Path) -> None:
    spec = tree / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace("# installs:\n#   - apt: C(demo-tool)\n", ""))
    (tree / "handlers" / "main.yml").unlink()
    (role,) = gen.roles()
    assert role.installs is None
    assert "no '# installs:' comment block" in role.problems[0]
    text = gen.markdown(role)
    assert "Not declared" in text and "Never reboots the node." in text


def test_installs_nothing() -> None:
    assert gen.installs_block("---\n# installs: nothing (asserts only)\nx: 1\n") == [
        "nothing (asserts only)"]
    assert gen.installs_block("# installs:\n#   - a\n#     b\n#   - c\nx: 1\n") == ["a b", "c"]


def test_check_and_write_cli(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tree / "meta" / "argument_specs.yml"
    spec.write_text(spec.read_text().replace(
        "C(demo-tool)\n", "C(demo-tool), C(demo-helper), C(demo_extra_packages)\n"))
    assert gen.main(["--check"]) == 1
    assert FIX in capsys.readouterr().err
    assert gen.main(["--write"]) == 0
    assert (tree / "README.md").read_text() == gen.markdown(gen.roles()[0])
    assert gen.main(["--check"]) == 0
    assert gen.main([]) == 0 and "demo: current" in capsys.readouterr().out
    spec.write_text(spec.read_text().replace("How it runs.", "How it runs now."))
    assert gen.main(["--check"]) == 1


@pytest.mark.parametrize("argv", [["--bogus"], ["--write", "--check"]])
def test_bad_usage_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert gen.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage:") and err.count("\n") == 1


def test_broken_spec_is_one_line_exit_2(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "meta" / "argument_specs.yml").write_text(textwrap.dedent("""\
        argument_specs:
          main: [unclosed
        """))
    assert gen.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: playbooks/roles/demo/meta/argument_specs.yml") and err.count("\n") == 1
