"""Secrets stay out of reports and redacted recordings: the environment is an allow-list (data:
checks/schema/recorded-env.yaml) with secret-looking values masked; `record --redact` removes
serials, UUIDs, host names, IP and MAC addresses, IMEX peers and the kernel command line."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import yaml

from checks import environment, report_schema
from checks.docgen.roles import tasks_of
from checks.hw.fixture import FixtureBackend
from checks.node import node_cli, record
from checks.node.redact import CMDLINE_KEPT, redact_cmdline

ALLOWLIST = yaml.safe_load(environment.ENV_ALLOWLIST_PATH.read_text())


@pytest.mark.parametrize("entry", ALLOWLIST, ids=lambda e: e.get("name") or e.get("prefix"))
def test_every_allow_list_entry_cites_its_source_and_is_recorded(entry) -> None:
    assert set(entry) in ({"name", "source"}, {"prefix", "source"}) and len(entry["source"]) > 20
    name = entry.get("name") or entry["prefix"] + "EXAMPLE"
    assert name.isupper() and report_schema.env_recorded(name)
    assert report_schema.recorded_environment({name: "x"}) == {name: "x"}


SECRETS = {
    "NVIDIA_API_KEY": "nvapi-planted-secret-0001",       # not on the list: dropped
    "HF_TOKEN": "hf_planted_secret_0002",                 # not on the list: dropped
    "AWS_SECRET_ACCESS_KEY": "planted-secret-0003",
    "NCCL_NET_PLUGIN_TOKEN": "planted-secret-0004",       # on the list by prefix: masked
    "TORCH_NCCL_AUTH_KEY": "planted-secret-0005",
    "NCCL_COLLNET_URL": "https://user:planted-secret-0006@store.example/x",  # URL credentials
    "NCCL_DEBUG_FILE": "nvapi-planted-secret-0007",      # a key as a value
    "GLOO_PASSWORD": "planted-secret-0008",
}
KEPT = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "CUDA_VISIBLE_DEVICES": "0,1", "OMP_NUM_THREADS": "8",
        "TORCH_NCCL_BLOCKING_WAIT": "1", "NVIDIA_VISIBLE_DEVICES": "all", "GLOO_SOCKET_IFNAME": "eth0"}


def test_report_environment_is_the_allow_list_with_secrets_masked() -> None:
    env = report_schema.recorded_environment({**SECRETS, **KEPT, "HOME": "/root", "PATH": "/bin",
                                              "NCCL_SOCKET_IFNAME": "bad\udcff"})
    assert {k: v for k, v in env.items() if v != report_schema.MASKED} == {
        **KEPT, "NCCL_SOCKET_IFNAME": "bad\\udcff"}
    assert sorted(k for k, v in env.items() if v == report_schema.MASKED) == [
        "GLOO_PASSWORD", "NCCL_COLLNET_URL", "NCCL_DEBUG_FILE", "NCCL_NET_PLUGIN_TOKEN",
        "TORCH_NCCL_AUTH_KEY"]


def test_a_node_report_carries_no_planted_secret_and_is_private(tmp_path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "description": "test: the healthy H100 node with secrets in its environment",
        "extends": "h100-sxm-8x-healthy", "host": {"env": {**SECRETS, **KEPT}}}))
    out = tmp_path / "r.json"
    assert node_cli.main(["--simulate", str(scenario), "--level", "quick", "--json", str(out), "-q",
                          "--html", str(tmp_path / "r.html"), "--junit", str(tmp_path / "r.xml")]) in (0, 1)
    for path in (out, tmp_path / "r.html", tmp_path / "r.xml"):
        text = path.read_text()
        for value in SECRETS.values():
            assert "planted-secret" not in text and "planted_secret" not in text, (path, value)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(out.read_text())["environment"]["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"


HOST = "gpu-node-42.secret-cluster.example"
GPU_UUID = "GPU-1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d"
FS_UUID = "7f3e2d1c-0b9a-4876-9543-210fedcba987"
PLANTED = {
    "hostname": "gpu-node-42", "fqdn": HOST, "gpu uuid": GPU_UUID[4:], "serial": "1654321098765",
    "filesystem uuid": FS_UUID, "ipv4": "10.77.12.34", "imex peer ipv4": "10.77.12.35",
    "imex peer name": "gpu-node-43.secret-cluster.example", "ipv6": "fd00:77:12::34",
    "link-local ipv6": "fe80::ba3f:d2ff:fe12:3456", "mac": "b8:3f:d2:12:34:56",
    "ipoib hw address": "00:00:10:87:fe:80:00:00:00:00:00:00:b8:3f:d2:03:00:12:34:56",
    "cmdline token": "vault-planted-secret-9", "env key": "nvapi-planted-secret-10",
}
SOURCE = {
    "description": "test: every kind of identity and secret a recording can pick up",
    "extends": "h100-sxm-8x-healthy",
    "gpu_overrides": {0: {"uuid": GPU_UUID, "serial": PLANTED["serial"]}},
    "host": {
        "env": {"NVIDIA_API_KEY": PLANTED["env key"], "NCCL_SOCKET_IFNAME": "ib0",
                "NCCL_IB_GID_INDEX": "3"},
        "imex_nodes": [PLANTED["imex peer ipv4"], PLANTED["imex peer name"]],
        "kernel_log": [
            f"[    0.000000] Command line: BOOT_IMAGE=/vmlinuz root=UUID={FS_UUID} ro "
            f"intel_iommu=on iommu=pt nvidia-drm.modeset=1 vault_token={PLANTED['cmdline token']}",
            f"[    5.000000] {PLANTED['hostname']} kernel: nvidia: module loaded on {HOST}",
            f"[    9.100000] mlx5_core 0000:4b:00.0: nvidia peer ib0 {PLANTED['ipv4']} "
            f"{PLANTED['ipv6']} {PLANTED['link-local ipv6']} link {PLANTED['mac']}",
            f"[    9.200000] nvidia-peermem: IPoIB {PLANTED['ipoib hw address']} NVRM ok",
            f"[    9.300000] NVRM: GPU {GPU_UUID} Board Serial Number: {PLANTED['serial']}",
        ],
    },
}


def test_redacted_recording_keeps_none_of_the_planted_identities(tmp_path) -> None:
    source = tmp_path / "source.yaml"
    source.write_text(yaml.safe_dump(SOURCE))
    out = tmp_path / "rec.yaml"
    rec = record.record(FixtureBackend.from_file(str(source)), host=HOST, redact=True)
    record.write(out, record.render(rec, ".yaml"))
    text = out.read_text()
    for kind, secret in PLANTED.items():
        assert secret.lower() not in text.lower(), f"{kind} {secret} survived --redact"
    data = yaml.safe_load(text)
    cmdline = data["host"]["kernel_log"][0]
    assert cmdline.endswith("intel_iommu=on iommu=pt nvidia-drm.modeset=1 "
                            "[4 parameters removed by --redact]")
    peers = data["host"]["imex_nodes"]
    assert peers[0].startswith("192.0.2.") and peers[1] == "redacted-peer-1"
    assert data["host"]["env"] == {"NCCL_IB_GID_INDEX": "3", "NCCL_SOCKET_IFNAME": "ib0"}
    # The redacted recording still replays to a verdict.
    assert node_cli.main(["--simulate", str(out), "--level", "quick", "--no-json", "-q"]) in (0, 1)


def test_a_plain_recording_masks_secret_kernel_parameters(tmp_path) -> None:
    source = tmp_path / "source.yaml"
    source.write_text(yaml.safe_dump(SOURCE))
    rec = record.record(FixtureBackend.from_file(str(source)), host=HOST)
    line = rec.scenario["host"]["kernel_log"][0]
    assert "vault_token=<masked>" in line and PLANTED["cmdline token"] not in line
    assert "NVIDIA_API_KEY" not in rec.scenario["host"]["env"]


@pytest.mark.parametrize("param", CMDLINE_KEPT)
def test_every_kept_kernel_parameter_is_kept(param) -> None:
    given = f"{param}1=x" if param.endswith("_") else f"{param}=1"
    assert redact_cmdline(f"Kernel command line: secret=1 {given}") == \
        f"Kernel command line: {given} [1 parameters removed by --redact]"


ROLES = Path(__file__).resolve().parents[2] / "playbooks" / "roles"
CREDENTIAL_TASKS = [  # (tasks file, task name, the URL variable it uses)
    ("pytorch/tasks/install.yml", "Install torch for the CUDA release", "pytorch_index_url"),
    ("pytorch/tasks/install.yml", "Install this project and its dependencies", "pytorch_pip_index_url"),
    ("pytorch/tasks/preflight.yml", "Ask the wheel index for torch {{ pytorch_torch_version }}",
     "pytorch_index_url"),
    ("rdma/tasks/install.yml", "Download the DOCA repository key and check its checksum",
     "rdma_doca_ofed_repo_key_url"),
    ("rdma/tasks/install.yml", "Add the DOCA apt source", "rdma_doca_ofed_repo_url"),
    ("cuda_toolkit/tasks/repository.yml", "Download the repository signing key and check its checksum",
     "cuda_toolkit_repo_key_url"),
    ("cuda_toolkit/tasks/repository.yml", "Add the CUDA apt source", "cuda_toolkit_repo_url"),
]


@pytest.mark.parametrize(("path", "name", "variable"), CREDENTIAL_TASKS)
def test_tasks_that_can_carry_url_credentials_hide_their_output(path, name, variable) -> None:
    """no_log when the URL has credentials (user:token@): the output of a failing task stays
    readable for the usual credential-free URL."""
    import jinja2

    task = next(t for t in tasks_of(ROLES / path) if t.get("name") == name)
    expr = task["no_log"]
    assert variable in expr
    env = jinja2.Environment()
    env.tests["search"] = lambda value, pattern: __import__("re").search(pattern, str(value)) is not None
    values = {"pytorch_pip_extra_args": ""}
    hidden = env.from_string(expr).render(**values, **{variable: "https://u:planted-token@idx.example/simple"})
    shown = env.from_string(expr).render(**values, **{variable: "https://pypi.org/simple"})
    assert (hidden, shown) == ("True", "False")


@pytest.mark.parametrize("value", ["https://user:pa/ss@store.example/x", "https://user:p?w:d@store.example",
                                   "https://store.example/x?token=planted", "s3://b/k?X-Amz-Signature=planted",
                                   "https://store.example/x?a=1&password=planted"])
def test_url_secrets_with_slashes_or_in_the_query_are_masked(value) -> None:
    assert environment.env_value("NCCL_COLLNET_URL", value) == environment.MASKED


@pytest.mark.parametrize("value", ["https://store.example:8080/x", "https://store.example/x?page=2",
                                   "/usr/lib"])
def test_urls_without_secrets_are_kept(value) -> None:
    assert environment.env_value("NCCL_COLLNET_URL", value) == value
