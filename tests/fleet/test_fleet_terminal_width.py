"""The fleet's terminal report in an 80-column pipe (issue 47: 10 hosts took 230 lines): each fault
to act on is one line with what was seen, the remedy and the commands indented below it; a wide
terminal keeps the table."""

from __future__ import annotations

import io

from rich.console import Console

from checks.devtools import synthetic
from checks.devtools.synthetic import Broken, Slow
from checks.fleet import fleet_terminal
from checks.report import aggregate, load


def _fleet(tmp_path, h100_report):
    run = synthetic.write(synthetic.build(
        10, base=h100_report, run_id="w1", slow=[Slow("node0002", "membw_copy_gbs", 0.5, gpu=1)],
        broken=[Broken("node0001", "ecc-errors", gpu=5, message="GPU5: uncorrectable ECC"),
                Broken("node0004", "nvlink", gpu=2, message="GPU2: 2/18 NVLinks down")]),
        tmp_path / "w1")
    return aggregate.aggregate(load.read_dir(run), run_id="w1")


def _render(fleet, width: int) -> list[str]:
    out = io.StringIO()
    fleet_terminal.render(fleet, Console(file=out, width=width, color_system=None), verbose=False)
    return out.getvalue().splitlines()


def test_ten_hosts_fit_an_80_column_pipe(tmp_path, h100_report):
    lines = _render(_fleet(tmp_path, h100_report), 80)
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 45, "\n".join(lines)
    text = "\n".join(lines)
    assert "node0001  FAIL  GPU002  ecc-errors  GPU5 0000:ab:00.0 serial 1650123000005" in text
    assert "    confirm: nvidia-smi -q -d ECC" in text
    assert "    see: docs/troubleshooting.md#gpu002" in text
    assert "FAIL  run w1: 10 hosts  PASS 7  FAIL 3" in text


def test_a_wide_terminal_keeps_the_table(tmp_path, h100_report):
    lines = _render(_fleet(tmp_path, h100_report), 200)
    assert any("confirm with" in line for line in lines)
