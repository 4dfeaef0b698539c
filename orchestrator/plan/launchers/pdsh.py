"""The pdsh launcher: the head runs `accelerate launch --config_file <pdsh config>` (after
writing that config, in the same process: remote/accelerate_head.py), which runs DeepSpeed's
runner, which runs pdsh: orch's shim, first on PATH, wraps each node's launcher in the agent
and runs the real pdsh. Pure."""

from __future__ import annotations

import json
import os
from pathlib import PurePosixPath

from orchestrator.plan.accel_config import cluster_config_fields, config_header
from orchestrator.plan.launch_plan import (
    HEAD_LAUNCHER_NAME,
    Destination,
    HeadContext,
    HeadProcess,
    JobShape,
    Launch,
    PlannedFile,
    agent_spec,
    pdsh_variables,
)
from orchestrator.plan.pdsh_command import SHIM_CONFIG_NAME, SHIM_NAME, shim_script
from orchestrator.remote import program_source
from orchestrator.remote.agent_spec import RANK_PROGRAM
from orchestrator.specs.constants import HOSTFILE_NAME, PDSH_CONFIG_NAME
from orchestrator.specs.jobenv import is_secret

PDSH_SPEC_NAME = "accelerate_config.json"  # ClusterConfig fields the head launcher renders
SHIM_DIR = "bin"  # in the private directory, first on the head launcher's PATH


def launch(job: JobShape, head: HeadContext) -> Launch:
    config_path = f"{job.run_dir}/{PDSH_CONFIG_NAME}"
    spec_path = f"{job.run_dir}/{PDSH_SPEC_NAME}"
    config_spec = _pdsh_config_spec(job, config_path, f"{job.run_dir}/{HOSTFILE_NAME}")
    command = (job.python, f"{job.run_dir}/{HEAD_LAUNCHER_NAME}", spec_path,
               "--config_file", config_path, "--no_python", RANK_PROGRAM)  # fmt: skip
    agent = agent_spec(job, (), wait_for_main=False)
    shim_dir = f"{job.private_dir}/{SHIM_DIR}"
    shim_config = {"job_id": job.job_id, "python": job.python, "real_pdsh": head.pdsh,
                   "agent": agent.to_dict()}  # fmt: skip
    files = (
        PlannedFile(HEAD_LAUNCHER_NAME, program_source("accelerate_head")),
        PlannedFile(PDSH_SPEC_NAME, json.dumps(config_spec, indent=2, sort_keys=True) + "\n"),
        PlannedFile(f"{SHIM_DIR}/{SHIM_CONFIG_NAME}", json.dumps(shim_config, indent=2) + "\n",
                    where=Destination.PRIVATE, mode=0o600),
        PlannedFile(f"{SHIM_DIR}/{SHIM_NAME}",
                    shim_script(f"{shim_dir}/{SHIM_CONFIG_NAME}", head.orch_python),
                    where=Destination.PRIVATE, mode=0o755),
    )  # fmt: skip
    # accelerate copies the head's whole environment into DeepSpeed's env file, whose lines
    # the runner exports on pdsh's command line: the file is /dev/null (not a regular file,
    # so the runner reads nothing back; the head launcher builds no line for it, so nothing
    # of the head's variables is printed), and secret-named variables stay out of the head
    # launcher's environment. The job's own variables reach the nodes in node_private.
    environ = head.environ
    dropped = tuple(sorted(name for name in environ if is_secret(name)))
    set_env = {**dict(pdsh_variables(environ)), "DS_ENV_FILE": os.devnull}
    process = HeadProcess(
        argv=command,
        cwd=job.workdir,
        set_env=tuple(set_env.items()),
        drop_env=dropped,
        # DeepSpeed finds `pdsh` (orch's shim) and `deepspeed` on PATH.
        path_prepend=(shim_dir, *_interpreter_dir(job.python, job.workdir)),
    )
    return Launch(files=files, agent_spec=agent, head_process=process, head_command=command)


def _pdsh_config_spec(job: JobShape, config_path: str, hostfile_path: str) -> dict[str, object]:
    """What the head's launcher needs to write the pdsh config (accelerate_head.py)."""
    hostfile = job.hostfile
    fields = cluster_config_fields(
        job.accelerate,
        hosts=hostfile,
        nproc_per_node=job.nproc,
        main_ip=hostfile.names[0],
        main_port=job.main_port,
        launcher="pdsh",
        hostfile_path=hostfile_path,
    )
    header = config_header("pdsh", len(hostfile.hosts), job.nproc)
    return {"config_file": config_path, "header": header, "fields": fields}


def _interpreter_dir(python: str, workdir: str) -> tuple[str, ...]:
    """The interpreter's directory for PATH, absolute: a relative entry (`.` for a bare
    `python3`) would have `deepspeed` and pdsh's `ssh` looked up in the working directory,
    where anyone who can write there plants them. A bare name is found on PATH already."""
    if "/" not in python:
        return ()
    path = PurePosixPath(python)
    return (str((path if path.is_absolute() else PurePosixPath(workdir) / path).parent),)
