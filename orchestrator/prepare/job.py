"""A request made concrete on this head (`prepare_job`, the same for `orch launch` and
`orch submit`): the one sequence inventory -> hosts -> fan-out -> transport -> plan, with the
first main port orch would try, and the options the job runs with (`pipeline_options`).

A bad input is refused here with OrchError, before any node is asked (but for one SSH login
when whether SSH is used is to be decided). run/job.py runs what this prepares.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.errors import UsageError
from orchestrator.nodes.pdsh import find_pdsh
from orchestrator.nodes.transport import choose_transport
from orchestrator.outcome.events import WatchSettings
from orchestrator.pernode import succeeded
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, LaunchPlan, Placement
from orchestrator.plan.request import HostsRequest, JobRequest
from orchestrator.prepare.ports import plan_with_main_port
from orchestrator.records.job import new_job_id, runs_root
from orchestrator.specs.hang import learned_floors
from orchestrator.specs.inventory import (
    Hostfile,
    expand_nodeset,
    filter_hosts,
    job_nodes,
    make_hostfile,
    read_hostfile,
)
from orchestrator.specs.recipe import recipe_hosts
from orchestrator.specs.slurm import JOB_ID_VAR, allocation_from_env, chosen_fanout, job_inventory


def head_context(job_id: str, environ: Mapping[str, str], private_dir: str, *,
                 dry_run: bool) -> HeadContext:  # fmt: skip
    """A real launch needs pdsh on the head; a dry run only shows where it would be.
    `environ`: the head's environment, as the plan is to see it; `private_dir`: the job's
    private directory on the head."""
    pdsh = (shutil.which("pdsh") or "pdsh") if dry_run else find_pdsh()
    return HeadContext(pdsh=pdsh, private_dir=private_dir, orch_python=sys.executable,
                       cwd=os.getcwd(), environ=environ)  # fmt: skip


@dataclass(frozen=True)
class PreparedJob:
    """A request made concrete on this head: its record's root and its plan, built with the
    given main port or the first one orch would try (`build(port, chosen)` builds it again
    with the port node 0 picks). `pool`: every node the job may use, its own first (the
    rest are spares); `builder(hosts, restart)` makes `build` for another attempt."""

    request: JobRequest
    root: Path
    plan: LaunchPlan
    build: Callable[[int, bool], LaunchPlan]
    pool: Hostfile | None = None
    builder: Callable[[Hostfile, int], Callable[[int, bool], LaunchPlan]] | None = None

    def on(self, nodes: Sequence[str], restart: int) -> PreparedJob:
        """The same job on these nodes of its pool, as its attempt number `restart` + 1."""
        assert self.pool is not None and self.builder is not None
        wanted = set(nodes)
        hosts = Hostfile(tuple(h for h in self.pool.hosts if h.host in wanted),
                         source=self.pool.source)  # fmt: skip
        build = self.builder(hosts, restart)
        plan = plan_with_main_port(build, self.request.spec.main_port, self.plan.job_id,
                                   dry_run=True, preflight=False)  # fmt: skip
        return replace(self, plan=plan, build=build)


def prepare_job(request: JobRequest, environ: Mapping[str, str], *,
                private_dir: Callable[[str], str], dry_run: bool,
                say: Callable[[str], None] = lambda _text: None) -> PreparedJob:  # fmt: skip
    """inventory -> hosts -> fan-out -> plan, for `orch launch` and `orch submit` alike.
    `environ` is the head's environment; `private_dir(job_id)`, where the job's private files
    go on the head (run/ makes that directory and writes them). A bad input is refused
    here, before any node is asked, but for one SSH login to the first node when whether
    SSH is used is to be decided (inside an allocation, with no --transport; `say` hears the
    decision); a dry run needs nothing more, and decides it without asking."""
    spec, wanted = request.spec, request.hosts
    inventory, allocation = job_inventory(
        _given_hosts(request, environ), slurm=wanted.slurm, environ=environ,
        nproc_per_node=spec.nproc_per_node, nodes=wanted.nodes,
    )  # fmt: skip
    pool = filter_hosts(inventory, include=wanted.include, exclude=wanted.exclude)
    hosts = job_nodes(pool, wanted.nodes, request.min_nodes)
    fanout = chosen_fanout(request.fanout, spec.launcher, allocation is not None)
    root = runs_root(request.runs_dir)
    job_id = request.job_id or new_job_id()
    head = head_context(job_id, environ, private_dir(job_id), dry_run=dry_run)
    slurm_job = allocation.job_id if allocation else environ.get(JOB_ID_VAR, "")
    slurm_batch = request.job_id is not None and allocation is not None
    transport = choose_transport(
        wanted.transport, slurm_job=allocation.job_id if allocation else "",
        first_node=hosts.names[0] if hosts.names else "", say=say,
        ssh_check=(lambda node: succeeded(node, None)) if dry_run else None,
    ).kind  # fmt: skip

    def builder(on: Hostfile, restart: int) -> Callable[[int, bool], LaunchPlan]:
        def build(port: int, chosen: bool) -> LaunchPlan:
            place = Placement(
                job_id=job_id, hostfile=on, run_dir=str(root / job_id), main_port=port,
                main_port_chosen=chosen, fanout=fanout, slurm_job=slurm_job,
                slurm_batch=slurm_batch, transport=transport, restart_count=restart,
            )  # fmt: skip
            return build_plan(spec, place, head)

        return build

    build = builder(hosts, 0)
    plan = plan_with_main_port(build, spec.main_port, job_id, dry_run=True, preflight=False)
    if request.push_env:
        check_pushable(plan)
    return PreparedJob(request=request, root=root, plan=plan, build=build, pool=pool,
                       builder=builder)  # fmt: skip


def _given_hosts(request: JobRequest, environ: Mapping[str, str]) -> Hostfile | None:
    """--hostfile, or -w; else a recipe's own hosts, unless the job runs in a Slurm
    allocation."""
    if request.hosts.hostfile is not None and request.hosts.nodelist is not None:
        raise UsageError(
            "give --hostfile or -w/--nodelist, not both",
            "to run on some nodes of a hostfile: -i/--include 'gpu[01-02]'",
        )
    if request.hosts.hostfile is not None:
        return read_hostfile(request.hosts.hostfile)
    if request.hosts.nodelist is not None:
        return nodelist_hosts(request.hosts.nodelist, request.spec.nproc_per_node)
    if request.recipe is None or request.hosts.slurm or allocation_from_env(environ) is not None:
        return None
    return recipe_hosts(request.recipe, None)


def nodelist_hosts(nodelist: str, nproc_per_node: int | None) -> Hostfile:
    """-w's nodes, each with --nproc-per-node slots (as a recipe's nodelist: with its
    nproc_per_node)."""
    if nproc_per_node is None:
        raise UsageError(f"-w {nodelist} needs --nproc-per-node N: the ranks of each node",
                         "or give a hostfile (orch hostfile -w ... --slots N -o FILE)")  # fmt: skip
    return make_hostfile(expand_nodeset(nodelist), nproc_per_node)


def check_pushable(plan: LaunchPlan) -> None:
    """--push-env can push the job's environment: its interpreter is a venv's or a conda
    env's on the head (a UsageError says why not)."""
    from orchestrator.envpush.push import environment_source

    environment_source(plan.python)


def push_hosts(request: JobRequest) -> HostsRequest:
    """Where `orch env push` finds the job's nodes, as the job found them: --hostfile, else
    the recipe's hostfile (unless -w), else the allocation (--slurm)."""
    hosts = request.hosts
    recipe = request.recipe.hostfile if request.recipe is not None else None
    given = hosts.hostfile is not None or hosts.nodelist is not None
    if not given and recipe is not None and not hosts.slurm:
        return replace(hosts, hostfile=recipe)
    return hosts


@dataclass(frozen=True)
class PipelineOptions:
    """How a prepared job runs: the steps before it starts, and how it is watched."""

    sync: bool = False  # copy the working directory to every node first
    preflight: bool = True
    keep_remote_logs: bool = False
    settings: WatchSettings = field(default_factory=WatchSettings)
    push_env: bool = False  # push the head's environment where the pre-flight finds it differs
    hosts: HostsRequest = field(default_factory=HostsRequest)  # the job's, for `orch env push`


def pipeline_options(request: JobRequest) -> PipelineOptions:
    """The request's options for the steps before the job and for watching it."""
    watch = request.watch
    heartbeat, hang = watch.heartbeat_timeout, request.hang_timeout
    floors = learned_floors(hang)
    settings = WatchSettings(
        heartbeat_timeout=WatchSettings.heartbeat_timeout if heartbeat is None else heartbeat,
        hang_timeout=hang if isinstance(hang, float) else None,
        hang_learned=floors is not None, hang_floors=floors or WatchSettings.hang_floors,
        rank_grace=request.spec.stop.grace,
        time_limit=request.time_limit,
    )
    return PipelineOptions(sync=watch.sync, preflight=watch.preflight,
                           keep_remote_logs=watch.keep_remote_logs, settings=settings,
                           push_env=request.push_env, hosts=push_hosts(request))  # fmt: skip
