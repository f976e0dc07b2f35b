"""Output files are written so that no other user's file is ever touched and nothing half-written
or temporary stays behind: a private temporary (mkstemp) in the target directory, fsync, rename,
mode 0600; a full or read-only directory is exit 2 with one line."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks import safeio
from checks.fleet.fleet_cli import main as fleet_main
from checks.node import node_cli, record

SCENARIO = "h100-sxm-8x-healthy"


def _report(path: Path, *extra: str) -> int:
    return node_cli.main(["--simulate", SCENARIO, "--level", "quick", "--json", str(path), "-q", *extra])


def test_a_planted_tmp_symlink_is_never_followed(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("root-owned content\n")
    out = tmp_path / "reports"
    out.mkdir()
    (out / "node.json.tmp").symlink_to(victim)          # the old predictable name
    (out / ".node.json.tmp").symlink_to(victim)
    assert _report(out / "node.json", "--junit", str(out / "node.xml"),
                   "--html", str(out / "node.html")) == 0
    assert victim.read_text() == "root-owned content\n"
    assert json.loads((out / "node.json").read_text())["verdict"] == "PASS"
    for name in ("node.json", "node.xml", "node.html"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert sorted(p.name for p in out.iterdir()) == [
        ".node.json.tmp", "node.html", "node.json", "node.json.tmp", "node.xml"]


def test_a_symlink_named_as_the_report_is_refused_not_followed(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target = tmp_path / "node.json"
    target.symlink_to(victim)
    assert _report(target) == 2
    assert victim.read_text() == "keep\n" and target.is_symlink()


def test_record_backup_does_not_follow_a_planted_bak(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path = tmp_path / "rec.yaml"
    path.write_text("old\n")
    (tmp_path / "rec.yaml.bak").symlink_to(victim)
    assert record.write(path, "new\n") == tmp_path / "rec.yaml.bak"
    assert victim.read_text() == "keep\n"
    assert (tmp_path / "rec.yaml.bak").read_text() == "old\n" and path.read_text() == "new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@contextlib.contextmanager
def _tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.parametrize(("options", "reason"), [
    ("ro,size=1m", "Read-only file system"),
    ("size=8k", "No space left on device"),
])
def test_a_full_or_read_only_directory_is_one_line_and_leaves_nothing(tmp_path, capsys, options,
                                                                     reason) -> None:
    with _tmpfs(tmp_path / "mnt", options) as mnt:
        assert _report(mnt / "node.json") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and reason in err and str(mnt / "node.json") in err, err
        assert list(mnt.iterdir()) == []  # no 0-byte temporary, no partial report


def test_fleet_outputs_to_a_read_only_directory_exit_2(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert _report(run / "node0000.json") == 0
    with _tmpfs(tmp_path / "mnt", "ro,size=1m") as mnt:
        assert fleet_main(["report", str(run), "--no-history", "--json", str(mnt / "f.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: Read-only file system") and err.count("\n") == 1, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode 0555 directory anyway")
def test_an_unwritable_directory_is_one_line(tmp_path, capsys) -> None:
    out = tmp_path / "ro"
    out.mkdir(mode=0o555)
    assert _report(out / "node.json") == 2
    assert "Permission denied" in capsys.readouterr().err and list(out.iterdir()) == []


def test_concurrent_writers_of_one_report_never_leave_a_mixed_or_partial_file(tmp_path) -> None:
    target = tmp_path / "node.json"
    docs = {w: json.dumps({"writer": w, "pad": w * 200_000}) for w in "ab"}
    seen: set[str] = set()
    barrier = threading.Barrier(3)

    def writer(w: str) -> None:
        barrier.wait()
        for _ in range(30):
            safeio.write_text(target, docs[w])

    def reader() -> None:
        barrier.wait()
        for _ in range(200):
            with contextlib.suppress(FileNotFoundError):
                seen.add(json.loads(target.read_text())["writer"])  # always one whole document

    threads = [threading.Thread(target=writer, args=(w,)) for w in "ab"] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert json.loads(target.read_text())["writer"] in "ab"
    assert seen <= {"a", "b"}
    assert [p.name for p in tmp_path.iterdir()] == ["node.json"]


@pytest.mark.parametrize("name", ["../escape.prom", "a/b.prom", "..", ".hidden", "", "x\0y"])
def test_a_name_from_data_cannot_leave_its_directory(tmp_path, name) -> None:
    with pytest.raises(safeio.UnsafePath):
        safeio.confined(tmp_path, name)
