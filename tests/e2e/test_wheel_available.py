"""The pytorch role's preflight module nodecert_wheel_available: which wheel names fit a node's
Python and machine, and what it says when none does (fast; no root, no e2e marker)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

LIBRARY = Path(__file__).resolve().parents[2] / "playbooks/roles/pytorch/library/nodecert_wheel_available.py"


@pytest.fixture(scope="module")
def module():
    spec = importlib.util.spec_from_file_location("nodecert_wheel_available", LIBRARY)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


@pytest.mark.parametrize(
    ("filename", "python", "arch", "fits"),
    [
        ("torch-2.13.0+cu128-cp312-cp312-manylinux_2_28_x86_64.whl", "3.12", "x86_64", True),
        ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "3.11", "x86_64", True),
        ("torch-2.13.0+cu128-cp312-cp312-manylinux_2_28_aarch64.whl", "3.12", "x86_64", False),
        ("torch-2.13.0+cu128-cp313-cp313-manylinux_2_28_x86_64.whl", "3.12", "x86_64", False),
        ("torch-2.12.1+cu128-cp312-cp312-manylinux_2_28_x86_64.whl", "3.12", "x86_64", False),
        ("torch-2.13.0-py3-none-any.whl", "3.10", "x86_64", True),
        ("torchvision-2.13.0-py3-none-any.whl", "3.10", "x86_64", False),
        ("torch-2.13.0.tar.gz", "3.12", "x86_64", False),
    ],
)
def test_fits(module, filename, python, arch, fits):
    assert module.fits(filename, "torch", "2.13.0", python, arch) is fits


def run(module, monkeypatch, capsys, args: dict) -> dict:
    from ansible.module_utils import basic

    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode())
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(sys, "argv", ["nodecert_wheel_available"])
    with pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


def test_finds_the_wheel_in_a_directory(module, monkeypatch, capsys, tmp_path):
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    out = run(
        module,
        monkeypatch,
        capsys,
        {
            "package": "torch",
            "version": "2.13.0",
            "python_version": "3.11",
            "architecture": "x86_64",
            "find_links": [str(tmp_path)],
        },
    )
    assert not out.get("failed")
    assert out["wheels"] == ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]


def test_names_what_there_is_when_nothing_fits(module, monkeypatch, capsys, tmp_path):
    (tmp_path / "torch-2.12.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    out = run(
        module,
        monkeypatch,
        capsys,
        {
            "package": "torch",
            "version": "2.13.0",
            "python_version": "3.12",
            "architecture": "x86_64",
            "find_links": [str(tmp_path)],
        },
    )
    assert out["failed"]
    assert "no torch 2.13.0 wheel for Python 3.12 on x86_64" in out["msg"]
    assert "versions there for this Python and machine: 2.12.0+cpu" in out["msg"]


def test_unreadable_index_is_a_one_line_failure(module, monkeypatch, capsys):
    out = run(
        module,
        monkeypatch,
        capsys,
        {
            "package": "torch",
            "version": "2.13.0",
            "python_version": "3.12",
            "architecture": "x86_64",
            "index_url": "http://127.0.0.1:9/whl",
            "timeout": 2,
        },
    )
    assert out["failed"] and out["msg"].startswith(
        "could not read the wheel index http://127.0.0.1:9/whl/torch/"
    )
