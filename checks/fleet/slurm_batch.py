"""`python -m checks.fleet.slurm batch-script --nodes N`: an sbatch script for the multi-node
verification (docs/operations.md). Arguments after `--` reach python -m checks on each node as
positional parameters of the node script, never as text inside it."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from checks.fleet import slurm_control as sl

BATCH = """#!/bin/bash
#SBATCH --job-name=nodecert-verify
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --time={minutes}
#SBATCH --output={out}/%j.log
# Multi-node verification over the nodes Slurm allocated (written by
# `python -m checks.fleet.slurm batch-script`). One task per node: the node's own checks, then
# the cross-host stage (torchrun through python -m checks.node.crosshost_node) with the rendezvous at the
# first node of the allocation, addressed as Slurm knows it (NodeAddr). The batch host then
# builds the fleet report, which names the node or link that broke a group.
set -uo pipefail
python={python}
run={out}/$SLURM_JOB_ID
mkdir -p "$run/crosshost/r0g0"
addr() {{ scontrol show node -o "$1" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'; }}
hosts=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
addresses=$(for h in ${{hosts//,/ }}; do printf '"%s": "%s",' "$h" "$(addr "$h")"; done)
"$python" -m checks.fleet.crosshost_plan --hosts "$hosts" --mode all --base-port {port} \\
  --run-id "nodecert-$SLURM_JOB_ID" --addresses "{{${{addresses%,}}}}" > "$run/crosshost/plan.json"
endpoint=$("$python" -c 'import json,sys; print(json.load(sys.stdin)["rounds"][0][0]["endpoint"])' \\
  < "$run/crosshost/plan.json")
export python run endpoint
# The arguments reach the node script as its positional parameters (count of the checks'
# arguments first), never as text inside the quoted script: nothing in them is expanded.
srun --kill-on-bad-exit=0 --ntasks-per-node=1 bash -c '
  n=$1; shift
  checks_args=("${{@:1:n}}"); node_args=("${{@:n+1}}")
  me=$SLURMD_NODENAME
  local=$(scontrol show node -o "$me" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")
  "$python" -m checks --level {level} --json "$run/$me.json" -q "${{checks_args[@]}}"
  "$python" -m checks.node.crosshost_node --group r0g0 --nnodes "$SLURM_NNODES" \\
    --node-rank "$SLURM_NODEID" --rdzv-endpoint "$endpoint" --rdzv-id "nodecert-$SLURM_JOB_ID-r0g0" \\
    --local-addr "$local" --host "$me" --json "$run/crosshost/r0g0/$me.json" "${{node_args[@]}}"
  true' nodecert-node {n_checks} {checks_args} {node_args}
exec "$python" -m checks.fleet report "$run" --no-history --json "$run/fleet.json"
"""


def batch_script(nodes: int, out: str, port: int, minutes: int, level: str,
                 checks_args: Sequence[str], node_args: Sequence[str]) -> str:
    return BATCH.format(nodes=nodes, out=shlex.quote(out), port=port, minutes=minutes,
                        level=level, python=shlex.quote(sys.executable), n_checks=len(checks_args),
                        checks_args=shlex.join(checks_args), node_args=shlex.join(node_args))


def run(args: argparse.Namespace) -> int:
    if args.nodes < 2:
        raise sl.InputError("--nodes must be at least 2 (the cross-host stage pairs nodes)")
    node_args = [*(["--ifname", args.ifname] if args.ifname else []),
                 *(["--nproc-per-node", str(args.nproc_per_node)] if args.nproc_per_node else [])]
    # Slurm opens --output before the script runs: the directory must exist (on the file system
    # the nodes share).
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = str(Path(args.out).resolve())
    sys.stdout.write(batch_script(args.nodes, out, args.port, args.minutes, args.level,
                                  args.checks_args, node_args))
    return 0
