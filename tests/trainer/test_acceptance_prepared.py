"""The acceptance checks' prepare hook for real (this host, 4 gloo ranks): the stage takes the
launcher the hook started, and the hook's end-of-run closer leaves a launcher the stage used
alone (its workdir belongs to the launch: NCCL flight-recorder dumps a FAIL names stay there),
while one the stage never took is closed."""

from __future__ import annotations

from typing import Any

import pytest

from checks import profiles
from checks.hw.linux import LinuxBackend
from checks.node.context import Context, Options
from checks.node.suite import acceptance
from trainer.launcher import PreparedSuite

pytestmark = pytest.mark.slow


def _ctx() -> Context:
    ctx = Context(LinuxBackend(), profiles.load("generic"), Options())
    ctx.selected = {"train-ddp"}
    return ctx


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    real = PreparedSuite.close

    def record(self: PreparedSuite) -> None:
        calls.append(self)
        real(self)

    monkeypatch.setattr(PreparedSuite, "close", record)
    return calls


def test_the_stage_uses_the_prepared_launcher_and_the_closer_leaves_it(closed: list[Any]) -> None:
    ctx = _ctx()
    discard = acceptance.prepare_launch(ctx)
    assert discard is not None
    result = acceptance._job_check(ctx, "ddp")
    assert result.status.name == "PASS", result.message
    assert result.details["launch"]["prepared"] is True
    discard()
    assert closed == []


def test_a_prepared_launcher_the_stage_never_took_is_closed(closed: list[Any]) -> None:
    ctx = _ctx()
    discard = acceptance.prepare_launch(ctx)
    assert discard is not None
    held = acceptance._prepared[ctx]
    discard()
    assert closed == [held] and held.launch.proc.poll() is not None
    assert not held.base.exists()  # the temporary directory it made went with it
