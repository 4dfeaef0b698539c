"""The standard launcher: every node's agent runs `accelerate launch` with its own
machine-rank config, which the node writes itself (the head launcher program, shipped in the
agent's spec with one ClusterConfig spec per machine); workers start once the main port
answers. Pure."""

from __future__ import annotations

import json
import shlex

from orchestrator.plan.accel_config import cluster_config_fields, config_header
from orchestrator.plan.launch_plan import (
    HEAD_LAUNCHER_NAME,
    Destination,
    HeadContext,
    JobShape,
    Launch,
    PlannedFile,
    node_side,
)
from orchestrator.remote import program_source
from orchestrator.remote.agent_spec import RANK_PROGRAM
from orchestrator.remote.procs import NODE_DIR_VAR, NODE_RANK_VAR
from orchestrator.specs.constants import standard_config_name


def launch(job: JobShape, head: HeadContext) -> Launch:
    return node_side(job, _standard_command(job), _node_files(job), wait_for_main=True,
                     pdsh=head.pdsh, environ=head.environ)  # fmt: skip


def standard_spec_name(machine_rank: int | str) -> str:
    """The ClusterConfig fields of one machine's config, which the node renders itself."""
    return f"accelerate-rank{machine_rank}.json"


def _standard_command(job: JobShape) -> tuple[str, ...]:
    # Each node writes its own machine-rank config with accelerate's ClusterConfig (the head
    # launcher program, run on the node), then runs `accelerate launch` in that process.
    node_dir, rank = f"${NODE_DIR_VAR}", f"${NODE_RANK_VAR}"
    launcher = f'"{node_dir}/{HEAD_LAUNCHER_NAME}"'
    spec = f'"{node_dir}/{standard_spec_name(rank)}"'
    config = f'"{node_dir}/{standard_config_name(rank)}"'
    shell = (
        f"exec {shlex.quote(job.python)} {launcher} {spec} --config_file {config} "
        f"--no_python {RANK_PROGRAM}"
    )
    return ("/bin/sh", "-c", shell)


def _node_files(job: JobShape) -> tuple[PlannedFile, ...]:
    """The head launcher program and one config spec per machine rank, sent to every node:
    orch's own process never imports accelerate (nor torch under it) for them."""
    hostfile, nproc = job.hostfile, job.nproc
    machines = len(hostfile.hosts)
    specs = []
    for rank in range(machines):
        fields = cluster_config_fields(
            job.accelerate, hosts=hostfile, nproc_per_node=nproc, main_ip=hostfile.names[0],
            main_port=job.main_port, launcher="standard", hostfile_path=None, machine_rank=rank,
        )  # fmt: skip
        spec = {
            "config_file": standard_config_name(rank),  # beside the spec, on the node
            "header": config_header("standard", machines, nproc),
            "fields": fields,
        }
        text = json.dumps(spec, indent=2, sort_keys=True) + "\n"
        specs.append(PlannedFile(standard_spec_name(rank), text, where=Destination.NODE))
    launcher = PlannedFile(HEAD_LAUNCHER_NAME, program_source("accelerate_head"),
                           where=Destination.NODE)  # fmt: skip
    return (launcher, *specs)
