"""`checks.fleet.slurm report FILE --node N` is about one node: a fleet summary given there (it
would drain and resume every host it names) is refused with one line, exit 2, before Slurm is asked."""

from __future__ import annotations

import json

from checks.fleet import slurm
from checks.report import load


def test_a_fleet_summary_with_node_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: nothing may be asked of Slurm
    path = tmp_path / "node07.json"
    path.write_text(json.dumps({"schema": load.FLEET_SCHEMA_NAME, "schema_version": 1, "hosts": {}}))
    code = slurm.main(["report", str(path), "--node", "node07"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "fleet summary" in err[0] and "--node node07 refused" in err[0] and err[0].startswith("error:")
