"""The environment a user's shell gives `make`: without make's own variables and what the
Makefile exports to its recipes, which a test run under `make test` would otherwise pass on
(ARGS="--junitxml ..." reached a target's own command line; VENV kept a default from applying)."""

from __future__ import annotations

import os

MAKE_ENV = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "INVENTORY", "LEVEL", "ARGS", "CHECK", "VENV",
            "TEST_JOBS", "PYTHON", "TORCH_PIN")


def user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in MAKE_ENV}
