"""What runs on a node is what is tested: the wheel built exactly as the pytorch role builds it
(the role's sources packed into a tar, `pip wheel --no-deps --no-build-isolation` with a fixed
SOURCE_DATE_EPOCH), installed into a fresh virtual environment, and run from outside the source
tree with no PYTHONPATH: the suite at each level through a shipped scenario, `--budget`,
`record`, the fleet report and the Slurm wrappers. The dependencies (torch, rich, ...) come from
the test environment's own site-packages, added to the new environment by a .pth line; the
project itself is only the installed wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE_TASKS = ROOT / "playbooks/roles/pytorch/tasks/install.yml"
SOURCES_VARS = ROOT / "playbooks/roles/preflight/vars/main.yml"
SCENARIO = "h100-sxm-8x-healthy"

pytestmark = pytest.mark.slow


def _role_sources() -> list[str]:
    """The paths the role packs, read from its task (and the list it names) so that the two
    cannot drift."""
    tasks = yaml.safe_load(ROLE_TASKS.read_text())
    for task in tasks:
        for inner in task.get("block", []):
            if inner.get("name") == "Pack the sources to build":
                path = inner["community.general.archive"]["path"]
                assert path.split("|")[0].strip(" {\n") == "_preflight_nodecert_sources", path
                return list(yaml.safe_load(SOURCES_VARS.read_text())["_preflight_nodecert_sources"])
    raise AssertionError(f"{ROLE_TASKS}: no 'Pack the sources to build' task")


def _build_wheel(work: Path) -> Path:
    tar = work / "nodecert-src.tar"
    with tarfile.open(tar, "w") as out:
        for name in _role_sources():
            out.add(ROOT / name, arcname=name,
                    filter=lambda info: None if "__pycache__" in info.name or info.name.endswith(".pyc")
                    else info)
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(dist), str(tar)],
                   check=True, env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"}, cwd=work)
    [wheel] = dist.glob("nodecert-*.whl")
    return wheel


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A fresh venv holding only the wheel (plus a path to the test venv's dependencies)."""
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(work)
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", purelib], check=True, capture_output=True,
                               text=True).stdout.strip())
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    (site / "zz-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run_dir = work / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONSAFEPATH"] = "1"

    def run(*args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        done = subprocess.run([str(python), *args], cwd=run_dir, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode in ok, (f"{args}: exit {done.returncode}\n{done.stdout[-3000:]}\n"
                                       f"{done.stderr[-3000:]}")
        return done

    return {"wheel": wheel, "site": site, "run": run, "dir": run_dir}


def test_the_wheel_holds_every_data_file_the_product_reads(node):
    names = set(zipfile.ZipFile(node["wheel"]).namelist())
    wanted = {str(p.relative_to(ROOT)) for pkg in ("checks", "trainer") for p in (ROOT / pkg).rglob("*")
              if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
              and "docgen" not in p.parts and "devtools" not in p.parts}
    assert wanted, "no data files found in the source tree"
    assert not wanted - names, f"data files missing from the wheel: {sorted(wanted - names)}"
    assert not [n for n in names if n.startswith(("checks/docgen/", "checks/devtools/"))], \
        "doc generators and synthetic fleets are not product"


def test_runs_from_the_install_not_the_source_tree(node):
    where = node["run"]("-c", "import checks, trainer; print(checks.__file__, trainer.__file__)").stdout
    assert str(ROOT) not in where and str(node["site"]) in where, where


def test_quick_level_from_the_wheel(node):
    node["run"]("-m", "checks", "--simulate", SCENARIO, "--level", "quick", "--json", "quick.json", "-q")
    report = json.loads((node["dir"] / "quick.json").read_text())
    assert report["verdict"] == "PASS"
    assert {c["id"] for c in report["checks"]} >= {"gpu-count", "xid-events"}


def test_a_failing_scenario_exits_1_from_the_wheel(node):
    node["run"]("-m", "checks", "--simulate", "fault-xid-79", "--level", "quick", "--no-json", "-q", ok=(1,))


def test_standard_and_burn_in_plans_and_a_torch_check_from_the_wheel(node):
    for level in ("standard", "burn-in"):
        listed = node["run"]("-m", "checks", "--simulate", SCENARIO, "--level", level, "--list").stdout
        assert "gpu-count" in listed
    # one check that starts torch processes of its own, from the installed package
    node["run"]("-m", "checks", "--simulate", "cpu-only-healthy", "--only", "reference-digest",
                "--json", "digest.json", "-q", ok=(0, 1))
    report = json.loads((node["dir"] / "digest.json").read_text())
    [digest] = [c for c in report["checks"] if c["id"] == "reference-digest"]
    assert digest["status"] in ("PASS", "SKIP"), digest


def test_budget_from_the_wheel(node):
    listed = node["run"]("-m", "checks", "--simulate", SCENARIO, "--budget", "5m", "--list").stdout
    assert "gpu-count" in listed


def test_record_from_the_wheel(node):
    node["run"]("-m", "checks", "record", "--simulate", SCENARIO, "--redact", "rec.yaml")
    node["run"]("-m", "checks", "--simulate", str(node["dir"] / "rec.yaml"), "--level", "quick", "--no-json",
                "-q")


def test_fleet_report_and_slurm_wrappers_from_the_wheel(node):
    reports = node["dir"] / "reports"
    reports.mkdir()
    node["run"]("-m", "checks", "--simulate", SCENARIO, "--level", "quick", "--json",
                str(reports / "node001.json"), "-q")
    node["run"]("-m", "checks.fleet", "report", str(reports))
    node["run"]("-m", "checks.fleet.slurm", "scripts", str(node["dir"] / "slurm"))
    assert (node["dir"] / "slurm").is_dir() and any((node["dir"] / "slurm").iterdir())
    node["run"]("-c", "import checks.docgen", ok=(1,))
    node["run"]("-c", "import checks.devtools.synthetic", ok=(1,))
    # the rows to act on carry the commands that confirm a fault: the catalogue is package data
    node["run"]("-c", "from checks.report import act_on; assert 'nvidia-smi -L' in "
                      "act_on.confirm_commands('INV004')")
