"""checks/devtools/xid_import.py: the XID codes of a driver's nverror.h against checks/kernlog/xid.yaml.

The headers here are written for the test in the header's define format (codes and names only),
not copies of NVIDIA's file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from checks.devtools import xid_import

TABLE = xid_import.TABLE.read_text()
LAST_ROW = max(int(r["xid"]) for r in yaml.safe_load(TABLE)["xids"])

HEADER = f"""
#define ROBUST_CHANNEL_GR_EXCEPTION                     (13)
#define ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS       (79)
#define INFOROM_PAGE_RETIREMENT_EVENT                   (63)
#define INFOROM_DRAM_RETIREMENT_EVENT                   INFOROM_PAGE_RETIREMENT_EVENT
#define RENAMED_IN_THIS_RELEASE                         (31)
#define BRAND_NEW_ERROR                                 ({LAST_ROW + 1}){' '}
#define ANOTHER_NEW_ERROR                               ({LAST_ROW + 2})
#define ROBUST_CHANNEL_LAST_ERROR                       ({LAST_ROW + 2})
#define ROBUST_CHANNEL_ERROR_RECOVERY_LEVEL_FATAL       (2)
#define NOT_AN_XID                                      ({LAST_ROW + 9})
"""


def test_parse_takes_numeric_defines_and_aliases_up_to_the_last_error() -> None:
    header = xid_import.parse(HEADER, "999.1", "2030-01-02")
    assert header.last == LAST_ROW + 2
    assert header.codes[63] == ["INFOROM_PAGE_RETIREMENT_EVENT", "INFOROM_DRAM_RETIREMENT_EVENT"]
    assert header.codes[LAST_ROW + 1] == ["BRAND_NEW_ERROR"]  # trailing blank after ")"
    assert 2 not in header.codes and LAST_ROW + 9 not in header.codes


def _run(tmp_path: Path, capsys, *extra: str, header: str = HEADER) -> tuple[int, str, str, Path]:
    table = tmp_path / "xid.yaml"
    if not table.exists():
        table.write_text(TABLE)
    source = tmp_path / "nverror.h"
    source.write_text(header)
    code = xid_import.main(["--header", str(source), "--release", "999.1", "--date", "2030-01-02",
                            "--table", str(table), *extra])
    out, err = capsys.readouterr()
    return code, out, err, table


def test_the_diff_names_new_codes_and_renamed_ones(tmp_path, capsys) -> None:
    code, out, err, table = _run(tmp_path, capsys)
    assert code == 0 and err == ""
    assert f"+ {LAST_ROW + 1} BRAND_NEW_ERROR" in out and f"+ {LAST_ROW + 2} ANOTHER_NEW_ERROR" in out
    assert "~ 31 table ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT, driver RENAMED_IN_THIS_RELEASE" in out
    assert "~ 63" not in out and "~ 79" not in out and "~ 13" not in out  # same name (or an alias)
    assert "release 999.1 (2030-01-02)" in out and "2 new" in out
    assert table.read_text() == TABLE  # no --write, no change


def test_write_adds_only_the_missing_rows_and_records_the_release(tmp_path, capsys) -> None:
    code, out, _, table = _run(tmp_path, capsys, "--write")
    assert code == 0 and "wrote 2 rows" in out
    text = table.read_text()
    data = yaml.safe_load(text)
    rows = {int(r["xid"]): r for r in data["xids"]}
    assert sorted(rows) == sorted({*(int(r["xid"]) for r in yaml.safe_load(TABLE)["xids"]),
                                   LAST_ROW + 1, LAST_ROW + 2})
    new = rows[LAST_ROW + 1]
    assert new["name"] == "BRAND_NEW_ERROR" and new["verdict"] == "WARN" and new["source"] == "own"
    assert new["action"] == "" and "nverror.h 999.1 (2030-01-02)" in new["reason"]
    assert "release 999.1 (2030-01-02)" in " ".join(data["sources"]["nverror"].split())
    old = yaml.safe_load(TABLE)
    assert all(rows[int(r["xid"])] == r for r in old["xids"])  # existing rows untouched
    assert {k: v for k, v in data["sources"].items() if k != "nverror"} == {
        k: v for k, v in old["sources"].items() if k != "nverror"}
    code, out, _, _ = _run(tmp_path, capsys, "--write")  # again: nothing left to add
    assert code == 0 and "0 new" in out and table.read_text() == text


def test_the_committed_table_holds_every_code_of_the_recorded_release() -> None:
    """The release named under sources.nverror: its codes are rows (the import ran)."""
    data = yaml.safe_load(TABLE)
    recorded = " ".join(data["sources"]["nverror"].split())
    assert "nverror.h at release 595." in recorded, recorded
    last = int(recorded.split("driver's names, 1-")[1].split()[0])
    assert {int(r["xid"]) for r in data["xids"]} >= set(range(1, last + 1))


@pytest.mark.parametrize(("header", "says"), [
    ("#define SOMETHING (3)\n", "ROBUST_CHANNEL_LAST_ERROR"),
    ("#define ROBUST_CHANNEL_LAST_ERROR (5)\n", "no XID defines"),
])
def test_a_file_that_is_not_the_header_is_one_error_line(tmp_path, capsys, header, says) -> None:
    code, out, err, _ = _run(tmp_path, capsys, header=header)
    assert code == 2 and out == "" and err.startswith("error: ") and says in err
    assert len(err.splitlines()) == 1


def test_usage_errors_exit_2(tmp_path, capsys) -> None:
    for argv in (["--header", "x.h"], ["--git", str(tmp_path)], [],
                 ["--header", "x.h", "--release", "1", "--date", "yesterday"]):
        with pytest.raises(SystemExit) as exc:
            xid_import.main(argv)
        assert exc.value.code == 2
        assert "error:" in capsys.readouterr().err
    table = tmp_path / "missing.yaml"
    code = xid_import.main(["--header", str(tmp_path / "none.h"), "--release", "1", "--date",
                            "2030-01-01", "--table", str(table)])
    assert code == 2 and capsys.readouterr().err.startswith("error: ")


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_reads_the_header_at_a_tag_with_its_date(tmp_path, capsys) -> None:
    repo = tmp_path / "repo"
    path = repo / xid_import.HEADER_PATH
    path.parent.mkdir(parents=True)
    path.write_text(HEADER)
    env = {"GIT_AUTHOR_DATE": "2030-01-02T00:00:00Z", "GIT_COMMITTER_DATE": "2030-01-02T00:00:00Z",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "r"], ["tag", "999.1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=env, capture_output=True)
    table = tmp_path / "xid.yaml"
    table.write_text(TABLE)
    assert xid_import.main(["--git", str(repo), "--tag", "999.1", "--table", str(table)]) == 0
    assert "release 999.1 (2030-01-02)" in capsys.readouterr().out
    assert xid_import.main(["--git", str(repo), "--tag", "no-such-tag", "--table", str(table)]) == 2
    assert capsys.readouterr().err.startswith("error: git show")


def test_the_imported_codes_are_judged_by_their_rows_through_the_cli(run_cli, tmp_path) -> None:
    """A 595 driver's XID 173 fails and 174/176 warn as their rows say, named, not "unclassified".
    The lines are the driver's Xid format (see test_kernlog_policy.py) with these codes."""
    lines = [f"NVRM: Xid (PCI:0000:01:00): {code}, pid=7062, name=python" for code in (173, 174, 176)]
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({
        "description": "test: XID lines of the codes imported from nverror.h",
        "extends": "h100-sxm-8x-healthy", "host": {"kernel_log": lines},
        "gpu_overrides": {0: {"pci_bus_id": "0000:01:00.0"}}}))
    _, report, err = run_cli("--simulate", str(scenario), "--only", "xid-events")
    assert report is not None, err
    (check,) = [c for c in report["checks"] if c["id"] == "xid-events"]
    results = {r["details"]["xid"]: r for r in check["results"]}
    assert {x: r["status"] for x, r in results.items()} == {173: "FAIL", 174: "WARN", 176: "WARN"}
    assert results[173]["details"]["catalog"]["name"] == "C2C_FATAL_LINK_FAILURE"
