"""Hostile input, round 3 (issue 46): what one report could still do to the whole fleet report,
or what the fleet still took on its word. Each case goes through the fleet CLI (`python -m
checks.fleet report`, its forked readers included) and fails on the code before the fix: a
traceback or exit without output, a poisoned host passing, a host vanishing, a secret kept."""

from __future__ import annotations

import copy
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from checks import environment
from checks.devtools import synthetic
from checks.fleet.fleet_cli import main
from checks.node.redact import mask_cmdline_secrets, redact_cmdline
from checks.report import load


@pytest.fixture(scope="module")
def reports() -> list[dict[str, Any]]:
    """node0000, node0001, node0002: healthy H100 nodes, each with its own GPU UUIDs."""
    return synthetic.build(3, base=synthetic.base_report("h100-sxm-8x-healthy"), run_id="r3")


@pytest.fixture(scope="module")
def trays() -> list[dict[str, Any]]:
    """tray00..tray02: healthy GB200 trays of one NVLink domain."""
    tray = synthetic.base_report("blackwell-gb200-tray-healthy")
    return [{**copy.deepcopy(tray), "host": f"tray{i:02d}"} for i in range(3)]


def _write(directory: Path, docs: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (directory / f"{doc['host']}.json").write_text(json.dumps(doc))
    return directory


def _fleet(run: Path, tmp: Path, *extra: str, history: bool = False) -> tuple[int, dict[str, dict[str, Any]]]:
    """Every output written; exit code and the hosts of fleet.json."""
    out = tmp / "out"
    argv = ["report", str(run), "-q", "--json", str(out / "fleet.json"), "--html", str(out / "fleet.html"),
            "--junit", str(out / "fleet.xml"), "--prometheus-dir", str(out / "prom"), *extra]
    code = main([*argv, *([] if history else ["--no-history"])])
    return code, {h["host"]: h for h in json.loads((out / "fleet.json").read_text())["hosts"]}


def _outputs(tmp: Path) -> bytes:
    out = tmp / "out"
    ET.parse(out / "fleet.xml")  # parses: no character XML forbids
    return b"".join((out / name).read_bytes() for name in ("fleet.json", "fleet.html", "fleet.xml",
                                                           "prom/nodecert-fleet.prom"))


def _healthy(hosts: dict[str, dict[str, Any]], *names: str) -> None:
    for name in names:
        assert hosts[name]["status"] == "PASS", hosts[name]


# --- nesting hidden from the bracket scan -------------------------------------------------------

def _decoy_nest(depth: int) -> list[Any]:
    """Lists nested `depth` deep, each level with strings ending in an escaped backslash: the old
    bracket scan read `\\\\"` as an escaped quote and lost its place among the strings."""
    child: list[Any] = []
    for _ in range(depth):
        child = ["\\\\", child, '\\"', "]\\", "[]"]
    return [child, "[]", "\\\\"]


def test_the_bracket_scan_reads_strings_ending_in_a_backslash() -> None:
    child: list[Any] = []
    for _ in range(600):
        child = ["a\\", "\\\\", child, "a\\", "\\", "\\\\"]
    assert not load.plainly_fine(json.dumps(child).encode())
    assert load.text_problem(json.loads(json.dumps(child)), json.dumps(child).encode())
    assert load.plainly_fine(json.dumps(["a\\", ["\\\\", ['\\"']], "]["]).encode())


@pytest.mark.parametrize(("depth", "jobs"), [(40, "1"), (250, "1"), (600, "1"), (600, "2")])
def test_nesting_behind_escaped_backslashes_is_that_hosts_error(tmp_path, reports, depth, jobs) -> None:
    docs = copy.deepcopy(reports)
    docs[1]["checks"][0]["results"][0]["details"]["x"] = _decoy_nest(depth)
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path, "--jobs", jobs)
    assert code == 1
    assert hosts["node0001"]["status"] == "ERROR"
    assert "nested more than 32 levels deep" in hosts["node0001"]["reason"]
    _healthy(hosts, "node0000", "node0002")


# --- integers past SQLite's 64 bits -------------------------------------------------------------

def _set_device_index(doc: dict[str, Any], value: int) -> None:
    doc["checks"][0]["results"][0]["device"] = {"index": value, "uuid": "GPU-forged"}


def _set_first_figure(doc: dict[str, Any], value: int) -> None:
    for chk in doc["checks"]:
        for result in chk["results"]:
            figures = (result.get("details") or {}).get("figures")
            if figures:
                figures[next(iter(figures))] = value
                return
    raise AssertionError("no figure in the report")


@pytest.mark.parametrize(("plant", "value"), [
    (_set_device_index, 2**64 - 1), (_set_device_index, 2**63), (_set_first_figure, 2**64),
    (_set_first_figure, 2**64 - 1), (_set_first_figure, -2**63 - 1),
], ids=["index-2^64-1", "index-2^63", "figure-2^64", "figure-2^64-1", "figure-below-int64"])
def test_an_integer_past_64_bits_is_that_hosts_error_and_the_history_is_written(tmp_path, reports,
                                                                             plant, value) -> None:
    docs = copy.deepcopy(reports)
    plant(docs[1], value)
    code, hosts = _fleet(_write(tmp_path / "reports" / "run", docs), tmp_path, history=True)
    assert code == 1
    assert hosts["node0001"]["status"] == "ERROR"
    assert "64-bit" in hosts["node0001"]["reason"], hosts["node0001"]
    _healthy(hosts, "node0000", "node0002")
    assert (tmp_path / "reports" / "history.sqlite").is_file()


def test_an_integer_just_inside_64_bits_is_read(tmp_path, reports) -> None:
    docs = copy.deepcopy(reports)
    _set_first_figure(docs[1], 2**63 - 1)
    _, hosts = _fleet(_write(tmp_path / "reports" / "run", docs), tmp_path, history=True)
    assert hosts["node0001"]["status"] in ("PASS", "WARN", "FAIL"), hosts["node0001"]


# --- NVL72 identity of the wrong type -----------------------------------------------------------

def _set_details(doc: dict[str, Any], check: str, key: str, value: Any) -> None:
    for chk in doc["checks"]:
        if chk["id"] == check:
            chk["results"][0]["details"][key] = value
            return
    raise AssertionError(f"no {check} in the report")


@pytest.mark.parametrize(("check", "key", "value"), [
    ("nvl72-fabric", "clique_id", "abc"), ("nvl72-fabric", "clique_id", None),
    ("nvl72-fabric", "clique_id", [1]), ("nvl72-fabric", "clique_id", float("inf")),
    ("nvl72-fabric", "clique_id", True), ("nvl72-fabric", "cluster_uuid", {"a": 1}),
    ("imex-service", "nodes", [1, "a"]), ("imex-service", "nodes", "10.0.0.1"),
], ids=["clique-text", "clique-null", "clique-list", "clique-infinity", "clique-bool", "uuid-object",
        "nodes-mixed", "nodes-text"])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_nvl72_identity_of_the_wrong_type_is_that_trays_error(tmp_path, trays, check, key, value,
                                                                 jobs) -> None:
    docs = copy.deepcopy(trays)
    _set_details(docs[1], check, key, value)
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path, "--jobs", jobs)
    assert code == 1
    assert hosts["tray01"]["status"] == "ERROR", hosts["tray01"]
    assert "nvl72-domain" in hosts["tray01"]["problems"]
    _healthy(hosts, "tray00", "tray02")


# --- encodings other than UTF-8 -----------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"])
def test_a_report_in_another_encoding_than_utf8_is_that_hosts_error(tmp_path, reports, encoding) -> None:
    docs = copy.deepcopy(reports)
    docs[1]["checks"][0]["results"][0]["message"] = "ok \x1b]0;pwned\x07 \u202eevil \x9b31m \u2028"
    run = _write(tmp_path / "run", docs)
    (run / "node0001.json").write_bytes(json.dumps(docs[1], ensure_ascii=False).encode(encoding))
    code, hosts = _fleet(run, tmp_path)
    assert code == 1
    assert hosts["node0001"]["status"] == "ERROR"
    assert "UTF-8" in hosts["node0001"]["reason"], hosts["node0001"]
    _healthy(hosts, "node0000", "node0002")
    text = _outputs(tmp_path)
    for raw in (b"\x1b", b"\x07", "\u202e".encode(), "\x9b".encode(), "\u2028".encode()):
        assert raw not in text


# --- a host report claiming the fleet summary's schema -------------------------------------------

def test_a_host_report_claiming_the_fleet_schema_is_that_hosts_error(tmp_path, reports) -> None:
    docs = copy.deepcopy(reports)
    docs[1]["schema"] = load.FLEET_SCHEMA_NAME
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path)
    assert code == 1
    assert set(hosts) == {"node0000", "node0001", "node0002"}
    assert hosts["node0001"]["status"] == "ERROR" and "fleet summary" in hosts["node0001"]["reason"]


def test_the_fleets_own_summary_in_the_directory_is_skipped(tmp_path, reports) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    assert main(["report", str(run), "--no-history", "-q", "--json", str(run / "fleet.json")]) == 0
    code, hosts = _fleet(run, tmp_path)  # read again with the summary among the reports
    assert code == 0 and set(hosts) == {"node0000", "node0001", "node0002"}


# --- a duration that keeps a report fresh for ever ----------------------------------------------

@pytest.mark.parametrize("duration", [1e300, 1e12, float("inf")])
def test_a_duration_ending_in_the_future_is_that_hosts_error(tmp_path, reports, duration) -> None:
    docs = copy.deepcopy(reports)
    docs[1]["duration_s"] = duration
    code, hosts = _fleet(_write(tmp_path / "reports" / "run", docs), tmp_path, history=True)
    assert code == 1
    assert hosts["node0001"]["status"] == "ERROR" and "duration_s" in hosts["node0001"]["reason"]
    _healthy(hosts, "node0000", "node0002")
    prom = (tmp_path / "out" / "prom" / "nodecert-fleet.prom").read_text()
    values = [float(line.rsplit(" ", 1)[1]) for line in prom.splitlines() if line and line[0] != "#"]
    assert max(values) < 1e10  # no report time past the year 2286


# --- file names that are no node name -----------------------------------------------------------

def test_a_file_name_that_is_not_utf8_is_an_error_row_and_prometheus_is_written(tmp_path, reports) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    name = os.path.join(os.fsencode(run), b"node\xff\xfe.json")
    with open(name, "wb") as f:
        f.write(json.dumps(reports[1]).encode())
    code, hosts = _fleet(run, tmp_path)
    assert code == 1
    bad = [h for h in hosts.values() if h["host"].startswith("node\\")]
    assert len(bad) == 1 and bad[0]["status"] == "ERROR", hosts.keys()
    assert bad[0]["host"] == "node\\xff\\xfe"
    assert "not a node name" in bad[0]["reason"]
    _healthy(hosts, "node0000", "node0001", "node0002")
    assert b"node\\\\xff\\\\xfe" in (tmp_path / "out" / "prom" / "nodecert-fleet.prom").read_bytes()


def test_control_characters_in_a_file_name_reach_no_output(tmp_path, reports) -> None:
    run = _write(tmp_path / "run", copy.deepcopy(reports))
    (run / "node\x1b[31m\x07\u202e.json").write_text(json.dumps(reports[1]))
    code, hosts = _fleet(run, tmp_path)
    assert code == 1
    [bad] = [h for h in hosts.values() if h["status"] == "ERROR"]
    assert bad["host"] == "node\\x1b[31m\\x07\\u202e"
    text = _outputs(tmp_path)
    for raw in (b"\x1b", b"\x07", "\u202e".encode()):
        assert raw not in text


@pytest.mark.parametrize("length", [177, 178, 241, 250])
def test_a_node_name_too_long_for_its_prometheus_file_name_is_written(tmp_path, reports, length) -> None:
    """A node name may have 253 characters; nodecert-<host>.prom (and the temporary it is written
    through) then passes the 255 bytes a file name may have: the whole report ended with `File
    name too long`, exit 2."""
    docs = copy.deepcopy(reports)
    docs[1]["host"] = "n" * length
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path, "--prometheus-host-files")
    assert code == 0 and hosts["n" * length]["status"] == "PASS"
    files = sorted(p.name for p in (tmp_path / "out" / "prom").iterdir())
    assert len(files) == 4 and all(len(name) <= 191 for name in files), files
    assert any(f'host="{"n" * length}"' in (tmp_path / "out" / "prom" / name).read_text() for name in files)


# --- the same GPU on two hosts ------------------------------------------------------------------

def _real(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reports as from real hardware (backend linux), each GPU with its own serial."""
    for i, doc in enumerate(docs):
        doc.update(backend="linux", scenario=None)
        for chk in doc["checks"]:
            for result in chk["results"]:
                device = result.get("device")
                if device and device.get("serial"):
                    result["device"] = {**device, "serial": f"16501230{i:02d}{device['index']:03d}"}
    return docs


def _gpu(doc: dict[str, Any], index: int, **fields: str) -> None:
    for chk in doc["checks"]:
        for result in chk["results"]:
            device = result.get("device")
            if device and device.get("index") == index:
                result["device"] = {**device, **fields}


def _uuid(doc: dict[str, Any], index: int) -> str:
    return next(r["device"]["uuid"] for c in doc["checks"] for r in c["results"]
                if r.get("device") and r["device"].get("index") == index)


@pytest.mark.parametrize("field", ["uuid", "serial"])
def test_one_gpu_reported_by_two_hosts_is_a_finding_on_both(tmp_path, reports, field) -> None:
    docs = _real(copy.deepcopy(reports))
    _real(docs)
    if field == "uuid":
        _gpu(docs[2], 3, uuid=_uuid(docs[0], 5))
    else:
        _gpu(docs[2], 3, serial="1650123000005")
        _gpu(docs[0], 5, serial="1650123000005")
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path)
    assert code == 1
    for name in ("node0000", "node0002"):
        assert hosts[name]["status"] == "FAIL", hosts[name]
        assert "duplicate-gpu" in hosts[name]["problems"]
    _healthy(hosts, "node0001")
    fleet = json.loads((tmp_path / "out" / "fleet.json").read_text())
    [spread] = [c for c in fleet["by_check"] if c["check"] == "duplicate-gpu"]
    messages = {o["host"]: o["message"] for o in spread["hosts"]}
    assert "node0002" in messages["node0000"] and "node0000" in messages["node0002"]


def test_simulated_reports_sharing_their_scenarios_gpus_are_no_finding(tmp_path, reports) -> None:
    docs = copy.deepcopy(reports)
    _gpu(docs[2], 3, uuid=_uuid(docs[0], 5))  # backend fixture: the scenario's UUIDs
    code, hosts = _fleet(_write(tmp_path / "run", docs), tmp_path)
    assert code == 0
    _healthy(hosts, "node0000", "node0001", "node0002")


# --- redaction ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    "ghp_Zx9planted0secret0token0AbCdEf123456", "github_pat_11AAplanted0secret0token0xyz",
    "glpat-planted0secret0token0x", "Authorization: Bearer planted.secret.token",
    "Bearer eyJplanted0secret0token", "hf_plantedSecretTokenAbcdefghijklmnop",
])
def test_token_shaped_values_are_masked_whatever_their_name(value) -> None:
    assert environment.env_value("NCCL_DEBUG_SUBSYS", value) == environment.MASKED


@pytest.mark.parametrize("value", ["INIT,NET", "ghp", "Bearer", "/opt/hf_cache", "eth0"])
def test_ordinary_values_are_kept(value) -> None:
    assert environment.env_value("NCCL_DEBUG_SUBSYS", value) == value


@pytest.mark.parametrize(("param", "kept"), [
    ("http_proxy=https://user:PLANTED@proxy.example/", "http_proxy=<masked>"),
    ('nvidia.NVreg_RegistryDwords="RmApiKey=PLANTED;RMForcePcieConfigSave=1"',
     "nvidia.NVreg_RegistryDwords=<masked>"),
    ("nvidia.NVreg_RegistryDwords=PeerMapping=1", "nvidia.NVreg_RegistryDwords=PeerMapping=1"),
    ("gh=ghp_Zx9PLANTED0token0AbCdEf123456", "gh=<masked>"),
])
def test_kernel_parameters_carrying_a_secret_in_their_value_are_masked(param, kept) -> None:
    line = f"[    0.000000] Command line: BOOT_IMAGE=/vmlinuz ro {param} iommu=pt"
    masked = mask_cmdline_secrets(line)
    assert masked == f"[    0.000000] Command line: BOOT_IMAGE=/vmlinuz ro {kept} iommu=pt"
    assert "PLANTED" not in redact_cmdline(masked)
