"""A launch as a value: what orch will write and run, before anything runs.

Pure: builds a frozen `LaunchPlan` from CLI options or a recipe plus a hostfile.
`--dry-run` prints it (`plan_summary`); `orchestrator.run.launch` executes it.

Launchers:
- pdsh: the head runs `accelerate launch --config_file <pdsh config>` (after writing
  that config, in the same process: accelerate_head.py); DeepSpeed's runner fans
  out with pdsh (orch's shim wraps each node's launcher in the agent).
- standard: every node runs `accelerate launch` with its own machine-rank config,
  through pdsh and the agent; workers start once the main port answers.
- torchrun: every node runs torchrun with c10d rendezvous at node 0.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from orchestrator.errors import UsageError
from orchestrator.specs.constants import (
    DEFAULT_MAIN_PORT,
    HOSTFILE_NAME,
    PDSH_CONFIG_NAME,
    standard_config_name,
)
from orchestrator.specs.inventory import Hostfile, render_hostfile
from orchestrator.specs.jobenv import build_job_env, redact
from orchestrator.specs.options import check_launcher, check_port

if TYPE_CHECKING:
    from orchestrator.specs.recipe import Recipe

PDSH_SPEC_NAME = "accelerate_config.json"  # ClusterConfig fields the head launcher renders
HEAD_LAUNCHER_NAME = "accelerate_head.py"
ENV_FILE_NAME = "deepspeed_env"


@dataclass(frozen=True)
class PlannedFile:
    """A file the launch writes. `run_dir`: kept in runs/<id>/; `ship`: sent to every node."""

    name: str
    content: str
    run_dir: bool = True
    ship: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    launcher: str
    hostfile: Hostfile
    nproc_per_node: int
    script: str
    args: tuple[str, ...]
    python: str
    workdir: str
    main_port: int
    env: tuple[tuple[str, str], ...]  # the job's environment on every node (ORCH_JOB_ID included)
    files: tuple[PlannedFile, ...]
    head_command: tuple[str, ...] = ()  # pdsh launcher: run on the head
    node_command: tuple[str, ...] = ()  # standard/torchrun: run by the agent on each node
    wait_for_main: bool = False  # workers wait until node 0's main port answers
    recipe: str | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.hostfile.names

    @property
    def main_host(self) -> str:
        return self.hostfile.names[0]

    @property
    def redacted_env(self) -> dict[str, str]:
        return redact(dict(self.env))

    @property
    def command(self) -> tuple[str, ...]:
        """The resolved command to record and show."""
        return self.head_command or self.node_command

    def file(self, name: str) -> PlannedFile:
        for planned in self.files:
            if planned.name == name:
                return planned
        raise KeyError(name)


def _check_launch_inputs(launcher: str, hostfile: Hostfile, script: str, main_port: int) -> None:
    check_launcher(launcher)
    if not hostfile.hosts:
        raise UsageError(f"{hostfile.source or 'hostfile'}: no hosts", "add `host slots=N` lines")
    if not script:
        raise UsageError("no training script given", "orch launch --hostfile F SCRIPT [ARGS...]")
    check_port(main_port)


def _env_file(env: Mapping[str, str]) -> str:
    # DeepSpeed's runner reads NAME=value lines and exports them on every node.
    return "".join(f"{name}={value}\n" for name, value in env.items())


def _script_path(script: str, workdir: str) -> str:
    return script if PurePosixPath(script).is_absolute() else str(PurePosixPath(workdir) / script)


def build_plan(
    *,
    job_id: str,
    hostfile: Hostfile,
    script: str,
    args: Sequence[str] = (),
    launcher: str = "pdsh",
    python: str,
    workdir: str,
    run_dir: str,
    main_port: int = DEFAULT_MAIN_PORT,
    nproc_per_node: int | None = None,
    extra_env: Mapping[str, str] | None = None,
    passthrough: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    accelerate: object | None = None,
    torchrun_args: Sequence[str] = (),
    rdzv_id: str | None = None,
    recipe: str | None = None,
) -> LaunchPlan:
    """Everything a launch does, decided up front. `run_dir` is where its files will live."""
    _check_launch_inputs(launcher, hostfile, script, main_port)
    nproc = nproc_per_node or min(h.slots for h in hostfile.hosts)
    env = build_job_env(
        job_id, extra_env or {}, passthrough, environ if environ is not None else os.environ
    )
    common = {
        "job_id": job_id,
        "launcher": launcher,
        "hostfile": hostfile,
        "nproc_per_node": nproc,
        "script": script,
        "args": tuple(args),
        "python": python,
        "workdir": workdir,
        "main_port": main_port,
        "env": tuple(env.items()),
        "recipe": recipe,
    }
    hostfile_file = PlannedFile(HOSTFILE_NAME, render_hostfile(hostfile))
    if launcher == "torchrun":
        command = (
            python, "-m", "torch.distributed.run",
            f"--nnodes={len(hostfile.hosts)}",
            f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d",
            f"--rdzv_endpoint={hostfile.names[0]}:{main_port}",
            f"--rdzv_id={rdzv_id or job_id}",
            *torchrun_args,
            script, *args,
        )  # fmt: skip
        return LaunchPlan(**common, files=(hostfile_file,), node_command=command)
    options = accelerate if accelerate is not None else _default_accelerate_options()
    if launcher == "pdsh":
        config_path = f"{run_dir}/{PDSH_CONFIG_NAME}"
        spec = _pdsh_config_spec(
            options, hostfile, nproc, main_port, config_path, f"{run_dir}/{HOSTFILE_NAME}"
        )
        # The head's launcher writes the config (accelerate imported once, in that process).
        head = (python, f"{run_dir}/{HEAD_LAUNCHER_NAME}", f"{run_dir}/{PDSH_SPEC_NAME}",
                "--config_file", config_path, script, *args)  # fmt: skip
        files = (
            hostfile_file,
            PlannedFile(HEAD_LAUNCHER_NAME, _head_launcher_source()),
            PlannedFile(PDSH_SPEC_NAME, json.dumps(spec, indent=2, sort_keys=True) + "\n"),
            # Holds real values (secrets too): written privately, never kept in the record.
            PlannedFile(ENV_FILE_NAME, _env_file(env), run_dir=False),
        )
        return LaunchPlan(**common, files=files, head_command=head)
    configs = _render_standard(options, hostfile, nproc, main_port)
    files = (
        hostfile_file,
        *(PlannedFile(standard_config_name(k), text, ship=True) for k, text in enumerate(configs)),
    )
    launch = shlex.join([python, "-m", "accelerate.commands.launch", "--config_file"])
    # Each node picks its own machine-rank config; the agent sets both variables.
    own_config = f"$ORCH_NODE_DIR/{standard_config_name('$ORCH_NODE_RANK')}"
    shell = f'exec {launch} "{own_config}" ' + shlex.join(
        [script, *args]
    )
    return LaunchPlan(
        **common, files=files, node_command=("/bin/sh", "-c", shell), wait_for_main=True
    )


def _default_accelerate_options() -> object:
    from orchestrator.specs.recipe import AccelerateOptions

    return AccelerateOptions()


def _pdsh_config_spec(
    options: object,
    hostfile: Hostfile,
    nproc: int,
    port: int,
    config_path: str,
    hostfile_path: str,
) -> dict[str, object]:
    """What the head's launcher needs to write the pdsh config (accelerate_head.py)."""
    from orchestrator.plan.accel_config import cluster_config_fields, config_header

    fields = cluster_config_fields(
        options,  # type: ignore[arg-type]
        hosts=hostfile,
        nproc_per_node=nproc,
        main_ip=hostfile.names[0],
        main_port=port,
        launcher="pdsh",
        hostfile_path=hostfile_path,
    )
    header = config_header("pdsh", len(hostfile.hosts), nproc)
    return {"config_file": config_path, "header": header, "fields": fields}


def _head_launcher_source() -> str:
    from orchestrator.remote import accelerate_head

    return Path(accelerate_head.__file__).read_text(encoding="utf-8")


def _render_standard(options: object, hostfile: Hostfile, nproc: int, port: int) -> list[str]:
    from orchestrator.plan.accel_config import render_standard_configs

    return render_standard_configs(
        options,  # type: ignore[arg-type]
        hosts=hostfile,
        nproc_per_node=nproc,
        main_ip=hostfile.names[0],
        main_port=port,
    )


def plan_from_recipe(
    recipe: Recipe,
    *,
    recipe_path: str,
    job_id: str,
    hostfile: Hostfile,
    run_dir: str,
    default_python: str,
    default_workdir: str,
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """A plan from a loaded Recipe (orchestrator.specs.recipe)."""
    return build_plan(
        job_id=job_id,
        hostfile=hostfile,
        script=recipe.script,
        args=list(recipe.args),
        launcher=recipe.launcher,
        python=recipe.python or default_python,
        workdir=recipe.workdir or default_workdir,
        run_dir=run_dir,
        main_port=recipe.main_port,
        nproc_per_node=recipe.nproc_per_node,
        extra_env=dict(recipe.env),
        passthrough=recipe.passthrough_env,
        environ=environ,
        accelerate=recipe.accelerate,
        torchrun_args=tuple(recipe.torchrun.extra_args),
        rdzv_id=recipe.torchrun.rdzv_id,
        recipe=recipe_path,
    )


def plan_summary(plan: LaunchPlan) -> dict:
    """The plan as one JSON-able document (what --dry-run prints); secrets redacted."""
    return {
        "job_id": plan.job_id,
        "launcher": plan.launcher,
        "hosts": [{"host": h.host, "slots": h.slots} for h in plan.hostfile.hosts],
        "nproc_per_node": plan.nproc_per_node,
        "world_size": plan.nproc_per_node * len(plan.hostfile.hosts),
        "python": plan.python,
        "workdir": plan.workdir,
        "main": f"{plan.main_host}:{plan.main_port}",
        "script": plan.script,
        "args": list(plan.args),
        "head_command": list(plan.head_command),
        "node_command": list(plan.node_command),
        "workers_wait_for_main_port": plan.wait_for_main,
        "env": plan.redacted_env,
        "files": _files_summary(plan),
    }


def _files_summary(plan: LaunchPlan) -> dict[str, str]:
    files = {}
    for planned in plan.files:
        if planned.name == ENV_FILE_NAME:
            files[planned.name] = redact_env_text(planned.content)
        elif planned.name == HEAD_LAUNCHER_NAME:
            files[planned.name] = (
                f"(orch's head launcher: writes {PDSH_CONFIG_NAME}, then runs accelerate launch)"
            )
        else:
            files[planned.name] = planned.content
    if plan.launcher == "pdsh":
        files[PDSH_CONFIG_NAME] = rendered_pdsh_config(plan)
    return files


def rendered_pdsh_config(plan: LaunchPlan) -> str:
    """The accelerate config the head's launcher will write (imports accelerate)."""
    from orchestrator.remote.accelerate_head import config_text

    spec = json.loads(plan.file(PDSH_SPEC_NAME).content)
    return config_text(spec["fields"], spec["header"])


def redact_env_text(text: str) -> str:
    lines = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return _env_file(redact(lines))
