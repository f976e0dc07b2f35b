"""Cross-host stage: the collective check and the `ddp` job across hosts (torchrun c10d).

Run on every host of a group at about the same time (`playbooks/verify.yml` runs it as one
synchronous task per round on every host, so it needs a fork count of at least the number of
hosts, in pairs mode too: it refuses to start otherwise), with the first host's cluster address as
the rendezvous endpoint and one rendezvous id per group:

    python -m checks.node.crosshost_node --nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 \\
        --rdzv-id run42-g0 --json reports/run42/crosshost/g0/host-a.json
    python -m checks.node.crosshost_node --nnodes 2 --node-rank 1 --rdzv-endpoint 10.0.0.1:29400 \\
        --rdzv-id run42-g0 --json reports/run42/crosshost/g0/host-b.json

Each node writes a host report (same schema as `python -m checks`) with two checks,
`xhost-collective` and `xhost-ddp`; the controller (`checks.fleet.crosshost_plan`) compares the
nodes' reports to name the host that did not join, hung or crashed, and in pairwise mode the
bad link. The controller plans the groups (all hosts at once, or pairs then shifted pairs):
`python -m checks.fleet.crosshost_plan --hosts a,b,c,d --mode pairs`.

The endpoint is the first host's inventory address, never 0.0.0.0; choose the interface with
--ifname (sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME).

Per-rail runs (checks/node/rails.py): `python -m checks.fleet.crosshost_plan --hosts ... --rails
rail0=mlx5_0/ens1,rail1=mlx5_1/ens2` plans the mode's groups once per rail; each node then runs
with `--rail rail1 --hca mlx5_1 --ifname ens2` (NCCL_IB_HCA, the socket interfaces and, on GPU
hosts, one rank on the GPU nearest that NIC), and the controller names the host and rail that is
slow or broken.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import itertools
import json
import math
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from checks import cliutil
from checks import report_schema as report
from checks.hw.base import Backend, HardwareError
from checks.hw.measure import nccl_log
from checks.model import CheckOutcome, Result, Status, error
from checks.node.rails import Rail, nearest_gpu, rail_env

STAGES = ("collective", "ddp")
EXIT_USAGE = 2


@functools.cache
def _hardware() -> Backend:
    """This machine, read only through the hardware layer (a fixture backend can stand in)."""
    from checks.hw.linux import LinuxBackend

    return LinuxBackend()


def _platform(hw: Backend | None = None) -> tuple[bool, int]:
    hw = hw or _hardware()
    # No NVIDIA driver on this host: CUDA cannot be available, and importing torch here only to
    # learn that costs seconds per node (the ranks import it anyway).
    if hw.proc_driver_version() is None and not hw.gpu_device_nodes():
        return False, 0
    info = hw.torch()
    gpus = info.device_count if info.cuda_available else 0
    return gpus > 0, gpus


# What the rank processes and the launcher hand back (heartbeat files, result files, the log
# tail) is read like a report (checks/report/load.py): bounded and typed, so a rank that wrote
# nonsense, or a huge or hostile text, costs one field, never the stage or the node report.
MAX_RANKS = 4096  # global ranks recorded per stage (a 512-node, 8-GPU group)
MAX_TEXT = 500  # characters kept of one text field of a rank
MAX_LOG_TAIL = 64 << 10  # characters of the launcher's log searched for the rendezvous error
_TEXT_FIELDS = ("state", "phase", "error", "host")
_INT_FIELDS = ("seq", "exitcode")


def _short(value: Any) -> str | None:
    """A text field as one bounded printable line (controls and bidirectional marks escaped), or
    None when it is not text."""
    if not isinstance(value, str):
        return None
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value[:MAX_TEXT])


def _small_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63 else None


def _finite(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return value
    return None


def _rank_view(ranks: Any) -> dict[str, dict[str, Any]]:
    """What the controller needs to compare nodes: per global rank, progress and fate. At most
    MAX_RANKS ranks; each field of its type or None; a rank that is not a mapping is recorded
    as unreadable."""
    if not isinstance(ranks, dict):
        return {}
    view: dict[str, dict[str, Any]] = {}
    for r, v in itertools.islice(ranks.items(), MAX_RANKS):
        key = _short(str(r)) or "?"
        if not isinstance(v, dict):
            view[key] = {**dict.fromkeys((*_TEXT_FIELDS, *_INT_FIELDS)), "state": "unreadable"}
            continue
        view[key] = {**{k: _short(v.get(k)) for k in _TEXT_FIELDS},
                     **{k: _small_int(v.get(k)) for k in _INT_FIELDS}}
    return view


def rendezvous_view(log_tail: str, endpoint: str) -> str:
    """'unreachable' when this host's agent could not connect to the rendezvous endpoint at all
    (torch's c10d client logs 'failed to connect to any network address of (HOST, PORT)' or
    'failed to connect/validate to host HOST:PORT' while it retries), else 'reached'. The
    controller blames such a host before the ones that waited for it."""
    host, _, port = endpoint.rpartition(":")
    marks = (f"failed to connect to any network address of ({host}, {port})",
             f"failed to connect/validate to host {host}:{port}")
    tail = log_tail[-MAX_LOG_TAIL:] if isinstance(log_tail, str) else ""
    return "unreachable" if any(m in tail for m in marks) else "reached"


def address_view(endpoint: str, ifname: str | None, hw: Backend | None = None) -> dict[str, Any]:
    """Which address this host's gloo/NCCL sockets would advertise, against the one it reaches the
    rendezvous from: with --ifname, that interface's address; without, the address the hostname
    resolves to (what NCCL and gloo fall back to; on a multi-homed node, or with Debian's
    `127.0.1.1 hostname` line, an address the other hosts may not reach). A mismatch on a failed
    stage names this host. Read through the hardware layer, so a scenario can play it."""
    hw = hw or _hardware()
    host, _, port = endpoint.rpartition(":")
    view: dict[str, Any] = {"ifname": ifname}
    try:
        view["route_source"] = hw.route_source(host, int(port))
    except (HardwareError, ValueError) as exc:
        view["route_source"] = None
        view["route_error"] = str(exc)
    view["hostname_addresses"] = hw.hostname_addresses()
    if ifname:
        view["ifname_address"] = hw.interface_address(ifname)
        advertised = [view["ifname_address"]] if view["ifname_address"] else []
    else:
        advertised = view["hostname_addresses"]
    view["mismatch"] = bool(view["route_source"] and view["route_source"] not in advertised)
    return view


def collective_stage(args: argparse.Namespace, on_gpu: bool, nproc: int) -> Result:
    from checks.hw.measure import collective_run as collective
    from checks.node.suite.collective import judge_collectives

    sweep = {"min_bytes": 8, "max_bytes": 256 << 20 if on_gpu else 1 << 20, "factor": 4,
             "warmup": 3 if on_gpu else 1, "iters": 10 if on_gpu else 3, "check_iters": 5,
             "check_elems": 4096}
    # NCCL's INFO log (INIT,NET,GRAPH) says which transport each channel used: proof that the
    # hosts talked over RDMA with GPUDirect, not TCP sockets (judged by transport_verdict).
    env = {**_socket_env(args), **(nccl_log.debug_env() if on_gpu else {})}
    with nccl_log.capture(None, on_gpu) as cap:
        m = collective.run(nproc=nproc, sweep=sweep, backend="nccl" if on_gpu else "gloo",
                           timeout_s=args.timeout, stall_s=args.stall,
                           start_timeout_s=args.join_timeout, env=env, nnodes=args.nnodes,
                           node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                           rdzv_id=f"{args.rdzv_id}-collective", local_addr=args.local_addr,
                           workdir=cap.workdir)
        log = cap.parse(m)
    result = judge_collectives(m, None, on_gpu)
    result.details["ranks"] = _rank_view(m.get("ranks") or {})
    if log is not None and m.get("ok"):
        result = transport_verdict(result, log, _rdma_ports_up())
        if args.rail:
            result = pinned_rail_verdict(result, log, args.hca, args.ifname)
    if not m.get("ok"):
        result.details["rendezvous"] = rendezvous_view(m.get("log_tail") or "",
                                                       args.rdzv_endpoint)
        result.details["address"] = address_view(args.rdzv_endpoint, args.ifname)
    if m.get("ok") and "figures" in result.details:
        figures = result.details["figures"]
        peak = _finite(figures.get("allreduce_busbw_gbs")) if isinstance(figures, dict) else None
        result.details["figures"] = {"xhost_allreduce_busbw_gbs": peak} if peak is not None else {}
    return result


def _rdma_ports_up() -> tuple[str, ...]:
    from checks.node.suite.fabric_links import active_ports

    try:
        return active_ports(_hardware().rdma_devices())
    except HardwareError:
        return ()


def transport_verdict(result: Result, log: Any, rdma_up: tuple[str, ...]) -> Result:
    """A cross-host collective that finished is still a FAIL when it moved over TCP sockets
    while RDMA ports are up, or over IB without GPUDirect RDMA; an unreadable log is an ERROR.
    The transports go into the details (the fleet report lists them per host)."""
    from checks.node.suite.fabric_transport import TransportExpectation, judge_transport

    verdict = judge_transport(log, TransportExpectation(cross_host=True, rdma_up=rdma_up,
                                                        nvlink=False, nvls=False))
    result.details["transports"] = log.kinds
    result.details["nccl_transport"] = {"status": str(verdict.status),
                                        "message": verdict.message,
                                        **verdict.details.get("nccl", {})}
    if verdict.status.severity > result.status.severity and verdict.status is not Status.SKIP:
        result.status = verdict.status
        result.message = f"{result.message}; transport: {verdict.message}"
        result.remedy = verdict.remedy
    return result


def pinned_rail_verdict(result: Result, log: Any, hca: str | None, ifname: str | None) -> Result:
    """A per-rail run proves that rail only if NCCL used nothing else: its `NET/IB : Using` list
    names only the pinned HCA (NCCL_IB_HCA==<hca>), or, on a plain interface, `NET/Socket : Using`
    names only that interface. Anything more means the pin did not take (an old NCCL without
    the `=` syntax, a plugin that ignores it) and the run measured other rails too: FAIL."""
    if hca:
        others = sorted({d.split(":")[0] for d in log.ib_devices} - {hca})
        used, pinned = log.ib_devices, hca
    elif ifname:
        others = sorted({d.split(":")[0] for d in log.socket_interfaces} - {ifname})
        used, pinned = log.socket_interfaces, ifname
    else:
        return result
    result.details["rail_devices"] = list(used)
    if others and result.status.severity < Status.FAIL.severity:
        result.status = Status.FAIL
        result.message = (f"{result.message}; pinned to {pinned} but NCCL used "
                          f"{', '.join(used)}: this run measured more than its rail")
        result.remedy = ("NCCL ignored the pin: look for NCCL_IB_HCA or NCCL_SOCKET_IFNAME set "
                         "elsewhere (/etc/nccl.conf, ~/.nccl.conf), a network plugin that picks "
                         "its own devices, or an NCCL that does not know the exact-match '='")
    return result


def ddp_stage(args: argparse.Namespace, on_gpu: bool, nproc: int) -> Result:
    from trainer.launcher import run_ddp_multinode

    job = run_ddp_multinode(args.rdzv_endpoint, args.nnodes, args.node_rank, nproc=nproc,
                            rdzv_id=f"{args.rdzv_id}-ddp", local_addr=args.local_addr,
                            timeout_s=args.timeout, stall_s=args.stall,
                            start_timeout_s=args.join_timeout, env=_socket_env(args))
    details = dict(job.details) if isinstance(job.details, dict) else {}
    if isinstance(job.figures, dict) and job.figures:
        details["figures"] = {f"xhost_{_short(k)}": _finite(v) for k, v in job.figures.items()
                              if isinstance(k, str) and _finite(v) is not None}
    status = {"PASS": Status.PASS, "FAIL": Status.FAIL, "SKIP": Status.SKIP}.get(job.status,
                                                                                Status.ERROR)
    if status is not Status.PASS and status is not Status.SKIP:
        details["rendezvous"] = rendezvous_view(str(details.get("log_tail") or ""),
                                                args.rdzv_endpoint)
        details["address"] = address_view(args.rdzv_endpoint, args.ifname)
    phases = details.get("phases")
    if isinstance(phases, dict) and phases:
        details["ranks"] = {_short(str(r)) or "?": {"phase": _short(p)}
                            for r, p in itertools.islice(phases.items(), MAX_RANKS)}
    return Result(status, f"ddp across {args.nnodes} hosts: {job.message}", details=details,
                  remedy=None if status is Status.PASS else
                  "compare with the xhost-collective result and the other hosts' reports; "
                  "check NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME and the firewall between hosts")


def _socket_env(args: argparse.Namespace) -> dict[str, str]:
    rail = _rail(args)
    if rail is not None:
        return rail_env(rail, args.rail_gpu)
    return {"NCCL_SOCKET_IFNAME": args.ifname, "GLOO_SOCKET_IFNAME": args.ifname} \
        if args.ifname else {}


def _rail(args: argparse.Namespace) -> Rail | None:
    if not getattr(args, "rail", None):
        return None
    return Rail(args.rail, args.hca, args.ifname, args.rail_gpu)


RUNNERS = {"collective": ("xhost-collective", "XHOST001", "collectives across hosts",
                          collective_stage),
           "ddp": ("xhost-ddp", "XHOST002", "DistributedDataParallel across hosts", ddp_stage)}


def _validate(args: argparse.Namespace) -> None:
    """One ValueError (a one-line usage error) for options that cannot work together."""
    if not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank {args.node_rank} is not in 0..{args.nnodes - 1}")
    host, port = args.rdzv_endpoint.rsplit(":", 1) if ":" in args.rdzv_endpoint else ("", "")
    if not host or not port.isdigit() or host in ("0.0.0.0", "::"):
        raise ValueError(f"--rdzv-endpoint {args.rdzv_endpoint!r} must be HOST:PORT with the "
                         "first host's cluster address (never 0.0.0.0)")
    if args.rail and not args.ifname:
        raise ValueError(f"--rail {args.rail} needs --ifname (the rail's network interface)")
    if (args.hca or args.rail_gpu is not None) and not args.rail:
        raise ValueError("--hca and --rail-gpu belong to a per-rail run: give --rail NAME too")


def _ranks_per_node(args: argparse.Namespace, on_gpu: bool, gpus: int) -> int:
    if not args.rail:
        return int(args.nproc_per_node or gpus or 1)
    # One rank per node on the rail's GPU (HGX rails pair GPU k with NIC k): the rails of a
    # node are compared with each other, not with a run over all NICs.
    if on_gpu and args.rail_gpu is None and args.hca:
        args.rail_gpu = nearest_gpu(_hardware(), args.hca)
    if on_gpu and args.rail_gpu is None:
        raise ValueError(f"cannot tell which GPU uses rail {args.rail} (no HCA, or "
                         f"{args.hca} not found on the PCI bus): give --rail-gpu N")
    if args.rail_gpu is not None and on_gpu and args.rail_gpu >= gpus:
        raise ValueError(f"--rail-gpu {args.rail_gpu}: this host has {gpus} GPU(s)")
    return int(args.nproc_per_node or 1)


def _run_stage(stage: str, args: argparse.Namespace, on_gpu: bool, nproc: int) -> CheckOutcome:
    cid, code, title, runner = RUNNERS[stage]
    s0 = time.monotonic()
    try:
        result = runner(args, on_gpu, nproc)
    except Exception as exc:  # a stage that breaks is this stage's ERROR, the next one runs
        result = error(f"{stage} stage crashed: {type(exc).__name__}: {exc}")
    result.details.update(nnodes=args.nnodes, node_rank=args.node_rank,
                          rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                          group=args.group, nproc_per_node=nproc)
    if args.rail:
        result.details["rail"] = Rail(args.rail, args.hca, args.ifname,
                                      args.rail_gpu if on_gpu else None).to_dict()
    if result.status in (Status.FAIL, Status.WARN):
        result.fault_code = code
    elif result.status is Status.ERROR:
        result.fault_code = f"{code}-E"
    return CheckOutcome(cid, code, title, "standard", ("crosshost",), [result], time.monotonic() - s0)


def node(args: argparse.Namespace) -> int:
    _validate(args)
    on_gpu, gpus = _platform()
    nproc = _ranks_per_node(args, on_gpu, gpus)
    started = dt.datetime.now(dt.timezone.utc).isoformat()
    t0 = time.monotonic()
    outcomes = [_run_stage(stage, args, on_gpu, nproc) for stage in args.stages]
    doc = report.build(outcomes, meta={
        "host": args.host or socket.gethostname(), "run_id": args.rdzv_id, "started_at": started,
        "duration_s": time.monotonic() - t0, "level": "standard", "backend": "linux",
        "profile": {"name": "generic", "reason": "cross-host stage"},
        "options": {"nnodes": args.nnodes, "node_rank": args.node_rank, "group": args.group},
        "environment": report.recorded_environment()})
    if args.json:
        report.write(doc, args.json)
    else:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    for o in outcomes:
        print(f"{o.id}: {o.status} {o.results[0].message}", file=sys.stderr)
    return int(doc["exit_code"])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m checks.node.crosshost_node",
                                description="This host's part of one group of the cross-host stage: "
                                            "the collective and DDP through torchrun's c10d "
                                            "rendezvous (the controller plans the groups: python -m "
                                            "checks.fleet.crosshost_plan).")
    n = p
    n.add_argument("--nnodes", type=int, required=True, help="hosts in the group")
    n.add_argument("--node-rank", type=int, required=True, help="this host's index in the group")
    n.add_argument("--rdzv-endpoint", required=True, metavar="HOST:PORT",
                   help="the first host's cluster address and a free port")
    n.add_argument("--rdzv-id", required=True, help="the same id on every host of the group")
    n.add_argument("--group", default="all", help="label of the group (recorded)")
    n.add_argument("--nproc-per-node", type=int, help="ranks on this host (default: GPUs, or 1)")
    n.add_argument("--stages", type=lambda s: [x for x in s.split(",") if x], default=list(STAGES),
                   help=f"comma-separated, from {', '.join(STAGES)}")
    n.add_argument("--ifname", help="network interface for NCCL and gloo sockets (with --rail: "
                                    "the rail's interface)")
    n.add_argument("--rail", metavar="NAME", help="per-rail run: the rail's name (recorded)")
    n.add_argument("--hca", help="per-rail run: the rail's RDMA device (NCCL_IB_HCA=<exact>)")
    n.add_argument("--rail-gpu", type=int, metavar="N",
                   help="per-rail run on GPUs: the GPU's CUDA ordinal in PCI bus order "
                        "(default: the GPU nearest the HCA)")
    n.add_argument("--local-addr", help="this host's address as the others reach it")
    n.add_argument("--host", help="name to record (default: the hostname)")
    n.add_argument("--timeout", type=float, default=600.0, help="hard limit per stage, seconds")
    n.add_argument("--stall", type=float, default=60.0, help="no progress for this long = hang")
    n.add_argument("--join-timeout", type=float, default=120.0,
                   help="seconds to wait for every host to join")
    n.add_argument("--json", type=cliutil.output_file, metavar="FILE",
                   help="write the report here (default: stdout)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = cliutil.parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        bad = [s for s in args.stages if s not in STAGES]
        if bad or not args.stages:
            raise ValueError(f"unknown stage(s) {bad}; choose from {', '.join(STAGES)}")
        return node(args)
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

