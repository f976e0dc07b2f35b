"""The Ubuntu LTS releases in support (shared/notes/releases.md: 22.04 jammy, 24.04 noble,
26.04 resolute with kernel 7.0) are releases the node checks know: `os-supported` PASSes on each
through the fixture backend, and an end-of-support one (20.04) is a WARN that names the list."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

RELEASES = {
    "22.04": ("Ubuntu 22.04.5 LTS", "jammy", "5.15.0-160-generic"),
    "24.04": ("Ubuntu 24.04.3 LTS", "noble", "6.8.0-90-generic"),
    "26.04": ("Ubuntu 26.04 LTS", "resolute", "7.0.0-14-generic"),
}


def node_on(tmp_path: Path, version: str, pretty: str, codename: str, kernel: str) -> str:
    path = tmp_path / f"ubuntu-{version}.yaml"
    path.write_text(yaml.safe_dump({
        "extends": "h100-sxm-8x-healthy",
        "description": f"h100-sxm-8x-healthy on {pretty} (kernel {kernel})",
        "host": {"os_release": {"ID": "ubuntu", "VERSION_ID": version, "PRETTY_NAME": pretty,
                                "VERSION_CODENAME": codename},
                 "kernel": kernel},
    }))
    return str(path)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_lts_release_in_support_is_known(run_cli, tmp_path, version) -> None:
    scenario = node_on(tmp_path, version, *RELEASES[version])
    code, report, err = run_cli("--simulate", scenario, "--only", "os-supported")
    assert code == 0, err
    (check,) = report["checks"]
    assert check["status"] == "PASS", check
    assert RELEASES[version][2] in check["results"][0]["message"]


def test_an_ended_release_is_a_warning_naming_the_supported_ones(run_cli, tmp_path) -> None:
    scenario = node_on(tmp_path, "20.04", "Ubuntu 20.04.6 LTS", "focal", "5.4.0-200-generic")
    code, report, err = run_cli("--simulate", scenario, "--only", "os-supported")
    assert code == 0, err
    (check,) = report["checks"]
    assert check["status"] == "WARN"
    expected = check["results"][0]["expected"]
    assert all(version in expected for version in RELEASES), expected
