"""From a request to a finished job: its hosts, job id and plan (`prepare_job`, the same for
`orch launch` and `orch submit`); then sync -> the job's private settings on every node,
while node 0 picks the main port -> pre-flight -> prepare the record -> run (`run_job`).

Each step either passes or raises OrchError before anything of the job has started (and
then the private settings written so far are removed again); what a step found goes to
the caller's `PipelineReporter` (the CLI prints it).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from orchestrator.checks.environment import PushFix
from orchestrator.checks.model import DoctorReport
from orchestrator.checks.request import PreflightRequest
from orchestrator.errors import OrchError, RestartNotStarted
from orchestrator.logs.sink import LogView
from orchestrator.nodes.pdsh import find_pdsh
from orchestrator.nodes.transport import SLURM, choose_transport, plan_transport
from orchestrator.outcome.restart_policy import (
    Cause,
    RestartDecision,
    RestartPolicy,
    decide,
    next_nodes,
    pause_before,
    short_of_nodes,
)
from orchestrator.outcome.verdict import JobState, WatchSettings
from orchestrator.pernode import GroupResult, succeeded
from orchestrator.plan.agent_command import node_files_command
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, LaunchPlan, Placement
from orchestrator.plan.request import HostsRequest, JobRequest
from orchestrator.prepare.ports import plan_with_main_port
from orchestrator.prepare.push_env import (
    PushDone,
    environment_record,
    nodes_to_push,
    push_fix,
    push_to,
)
from orchestrator.prepare.sync import SyncedFiles
from orchestrator.records.job import (
    AttemptRecord,
    EnvironmentRecord,
    FirstFailure,
    JobRecord,
    RunDir,
    new_job_id,
    run_dir,
    runs_root,
)
from orchestrator.records.moments import note_attempt, save_preflight
from orchestrator.run.attempts import (
    attempt_failure,
    attempt_record,
    keep_apart,
    unreachable_nodes,
    with_attempt,
)
from orchestrator.run.launch import JobRunner, LaunchResult, head_private_dir, prepare_run
from orchestrator.specs.inventory import Hostfile, filter_hosts, job_nodes, read_hostfile
from orchestrator.specs.recipe import recipe_hosts
from orchestrator.specs.slurm import JOB_ID_VAR, allocation_from_env, chosen_fanout, job_inventory
from orchestrator.specs.words import Fanout


def head_context(job_id: str, environ: Mapping[str, str], *, dry_run: bool) -> HeadContext:
    """A real launch needs pdsh on the head; a dry run only shows where it would be.
    `environ`: the head's environment, as the plan is to see it."""
    pdsh = (shutil.which("pdsh") or "pdsh") if dry_run else find_pdsh()
    return HeadContext(pdsh=pdsh, private_dir=head_private_dir(job_id), orch_python=sys.executable,
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


def prepare_job(request: JobRequest, environ: Mapping[str, str], *, dry_run: bool,
                say: Callable[[str], None] = lambda _text: None) -> PreparedJob:  # fmt: skip
    """inventory -> hosts -> fan-out -> plan, for `orch launch` and `orch submit` alike.
    `environ` is the head's environment. A bad input is refused here, before any node is
    asked, but for one SSH login to the first node when whether SSH is used is to be
    decided (inside an allocation, with no --transport; `say` hears the decision); a dry run
    needs nothing more, and decides it without asking."""
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
    head = head_context(job_id, environ, dry_run=dry_run)
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
    """--hostfile; else a recipe's own hosts, unless the job runs in a Slurm allocation."""
    if request.hosts.hostfile is not None:
        return read_hostfile(request.hosts.hostfile)
    if request.recipe is None or request.hosts.slurm or allocation_from_env(environ) is not None:
        return None
    return recipe_hosts(request.recipe, None)


def check_pushable(plan: LaunchPlan) -> None:
    """--push-env can push the job's environment: its interpreter is a venv's or a conda
    env's on the head (a UsageError says why not)."""
    from orchestrator.envpush.push import environment_source

    environment_source(plan.python)


def push_hosts(request: JobRequest) -> HostsRequest:
    """Where `orch env push` finds the job's nodes, as the job found them: --hostfile, else
    the recipe's hostfile, else the allocation (--slurm)."""
    hosts = request.hosts
    recipe = request.recipe.hostfile if request.recipe is not None else None
    if hosts.hostfile is None and recipe is not None and not hosts.slurm:
        return replace(hosts, hostfile=recipe)
    return hosts


def pipeline_options(request: JobRequest) -> PipelineOptions:
    watch = request.watch
    heartbeat = watch.heartbeat_timeout
    settings = WatchSettings(
        heartbeat_timeout=WatchSettings.heartbeat_timeout if heartbeat is None else heartbeat,
        hang_timeout=request.hang_timeout,
    )
    return PipelineOptions(sync=watch.sync, preflight=watch.preflight,
                           keep_remote_logs=watch.keep_remote_logs, settings=settings,
                           push_env=request.push_env, hosts=push_hosts(request))  # fmt: skip


def run_job(job: PreparedJob, *, view: LogView | None, reporter: PipelineReporter) -> LaunchResult:
    """Run a prepared job to its end: its attempts (`execute_plan` each, with the port node 0
    picks for it), as long as the restart policy says another is worth it. Everything it
    writes on the head (the record, the logs, the raw node logs, the stacks) is the user's
    alone, whatever the login umask: the umask is 077 for the job's time."""
    before = os.umask(0o077)
    try:
        return _attempts(job, view=view, reporter=reporter)
    finally:
        os.umask(before)


def _run_attempt(job: PreparedJob, earlier: JobRecord | None, *, view: LogView | None,
                 reporter: PipelineReporter) -> LaunchResult:  # fmt: skip
    options = pipeline_options(job.request)

    def with_port() -> LaunchPlan:
        return plan_with_main_port(job.build, job.request.spec.main_port, job.plan.job_id,
                                   dry_run=False, preflight=options.preflight)  # fmt: skip

    return execute_plan(job.plan, job.root, options, view=view, reporter=reporter,
                        with_port=with_port, earlier=earlier)  # fmt: skip


def _attempts(job: PreparedJob, *, view: LogView | None, reporter: PipelineReporter) -> (
    LaunchResult
):
    """plan -> execute -> verdict -> restart or stop. Whether to restart is the restart
    policy's (a pure function of the attempt's facts); this loop only carries it out."""
    request = job.request
    state = _Recovery(RestartPolicy(request.max_restarts, request.restart_on),
                      wanted=len(job.plan.hosts),
                      minimum=request.min_nodes or len(job.plan.hosts))  # fmt: skip
    job = _healthy_start(job, state.wanted, state.minimum)
    result = _run_attempt(job, None, view=view, reporter=reporter)
    while True:
        run = RunDir(result.run_dir)
        record = run.load()
        if result.state == JobState.SUCCEEDED or result.first_failure is None:
            return _ended(run, record, result, None)
        decision, excluded, nodes = state.after(job, record, result.first_failure)
        if not decision.restart:  # nothing is dropped: no attempt follows
            return _ended(run, record, result, decision)
        reporter.attempt_ended(run.path)  # its page, kept with its logs
        attempt = keep_apart(run, attempt_record(record, decision, excluded))
        note_attempt(run.path, time.time(), attempt.number + 1, decision.why)
        ended = replace(record, attempts=(*record.attempts, attempt))
        earlier = with_attempt(run, record, attempt, next_one=True)
        pause = pause_before(record.attempt - 1)
        following = job.on(nodes, record.attempt)
        reporter.restarting(attempt, job.plan, following.plan, pause)
        job = following
        try:
            time.sleep(pause)
            result = _run_attempt(job, earlier, view=view, reporter=reporter)
        except (OrchError, KeyboardInterrupt) as err:
            # The next attempt never started: the job ended with the one before, and so does
            # its exit code, whatever kept the next one from starting.
            run.save(ended)
            if isinstance(err, KeyboardInterrupt):
                return replace(result, attempts=ended.attempts)
            raise RestartNotStarted(record.attempt, err, record.exit_code or 1) from err


@dataclass
class _Recovery:
    """What the attempts loop carries from one attempt to the next."""

    policy: RestartPolicy
    wanted: int  # the job's nodes
    minimum: int  # --min-nodes, else every one of them
    dropped: list[str] = field(default_factory=list)  # excluded after earlier attempts
    previous: Cause | None = None  # the last failed attempt's cause

    def after(self, job: PreparedJob, record: JobRecord, first: FirstFailure) -> tuple[
        RestartDecision, tuple[str, ...], tuple[str, ...]
    ]:
        """The decision after a failed attempt, the nodes it drops, the next one's nodes."""
        restarts_done = record.attempt - 1
        pool = job.pool.names if job.pool is not None else job.plan.hosts
        # The re-check costs a few seconds: only when a restart may follow, over ssh.
        recheck = self.policy.max_restarts > restarts_done and job.plan.job.fanout == Fanout.PDSH
        left = [n for n in pool if n not in self.dropped]
        unreachable = unreachable_nodes(left) if recheck else ()
        facts = attempt_failure(first, record.ranks, unreachable)
        decision = decide(facts, self.policy, restarts_done=restarts_done, previous=self.previous)
        excluded = tuple(dict.fromkeys((*decision.cause.at_fault, *unreachable)))
        nodes = next_nodes(pool, job.plan.hosts, [*self.dropped, *excluded], wanted=self.wanted,
                           minimum=self.minimum)  # fmt: skip
        if decision.restart and nodes.problem is not None:
            decision = short_of_nodes(decision, nodes.problem)
        self.dropped += excluded
        self.previous = decision.cause
        return decision, excluded, nodes.nodes


def _healthy_start(job: PreparedJob, wanted: int, minimum: int) -> PreparedJob:
    """With spares in the pool (--nodes below its size), the first `wanted` nodes that
    answer; without, the job's own nodes as they are (the pre-flight checks them)."""
    pool = job.pool
    if pool is None or len(pool.hosts) <= wanted or job.plan.job.fanout != Fanout.PDSH:
        return job
    unreachable = unreachable_nodes(pool.names)
    nodes = next_nodes(pool.names, (), unreachable, wanted=wanted, minimum=minimum)
    if nodes.problem is not None:
        raise OrchError(f"not enough nodes answer: {nodes.problem}; nothing was started",
                        "check SSH to those nodes with `orch doctor --hostfile F`")  # fmt: skip
    return job if nodes.nodes == job.plan.hosts else job.on(nodes.nodes, 0)


def _ended(run: RunDir, record: JobRecord, result: LaunchResult,
           decision: RestartDecision | None) -> LaunchResult:  # fmt: skip
    """The last attempt into the record; the job's result is that attempt's."""
    final = with_attempt(run, record, attempt_record(record, decision), next_one=False)
    return replace(result, attempts=final.attempts)


class PipelineReporter(Protocol):
    def synced(self, plan: LaunchPlan, results: GroupResult[SyncedFiles]) -> None: ...

    def preflight_failed(self, report: DoctorReport) -> None: ...

    def pushing_environment(self, python: str, nodes: Sequence[str]) -> None: ...

    def environment_pushed(self, done: PushDone) -> None: ...

    def started(self, plan: LaunchPlan, run: RunDir) -> None: ...

    def attempt_ended(self, run_dir: Path) -> None: ...

    def restarting(self, ended: AttemptRecord, plan: LaunchPlan, following: LaunchPlan,
                   pause: float) -> None: ...  # fmt: skip


@dataclass(frozen=True)
class PipelineOptions:
    sync: bool = False  # copy the working directory to every node first
    preflight: bool = True
    keep_remote_logs: bool = False
    settings: WatchSettings = field(default_factory=WatchSettings)
    push_env: bool = False  # push the head's environment where the pre-flight finds it differs
    hosts: HostsRequest = field(default_factory=HostsRequest)  # the job's, for `orch env push`


def execute_plan(
    plan: LaunchPlan,
    root: Path,
    options: PipelineOptions,
    *,
    view: LogView | None,
    reporter: PipelineReporter,
    with_port: Callable[[], LaunchPlan] | None = None,
    earlier: JobRecord | None = None,
) -> LaunchResult:
    """Run the plan to its end; SIGINT and SIGTERM tear the job down on every node.
    `with_port`, when given, returns the plan with the main port node 0 picked for it;
    `earlier`, the job's record so far when this is a restart."""
    if options.sync:
        _sync(plan, reporter)
    plan = _settings_and_port(plan, with_port)
    preflight: tuple[float, float, DoctorReport] | None = None
    environment: EnvironmentRecord | None = None
    try:
        if options.preflight:
            started = time.time()
            report, environment = _preflight(plan, options, reporter)
            preflight = (started, time.time(), report)
    except BaseException:
        _remove_node_private(plan)
        raise
    run = run_dir(root, plan.job_id)
    record = prepare_run(plan, run, earlier, environment)
    if preflight is not None:  # for the job's page: it ran before its directory existed
        save_preflight(run.path, preflight[0], preflight[1], preflight[2].to_dict())
    runner = JobRunner(
        plan, run, record, settings=options.settings, view=view,
        keep_remote_logs=options.keep_remote_logs,
    )  # fmt: skip
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: runner.interrupt(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    reporter.started(plan, run)
    try:
        return runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _sync(plan: LaunchPlan, reporter: PipelineReporter) -> None:
    from orchestrator.prepare.sync import sync_workdir

    if plan.transport == SLURM:
        raise OrchError(
            "--sync copies the working directory over SSH, and the nodes are reached through "
            "Slurm only; nothing was started",
            "put the working directory on the cluster's shared filesystem, or leave --sync out",
        )

    results = sync_workdir(plan.hosts, os.getcwd(), plan.workdir)
    reporter.synced(plan, results)
    failed = [r.node for r in results.failed]
    if failed:
        raise OrchError(
            f"--sync could not copy {os.getcwd()} to {', '.join(failed)}; nothing was started",
            "fix the problems above (`orch doctor --hostfile F` checks SSH), then launch again",
        )


def _settings_and_port(plan: LaunchPlan, with_port: Callable[[], LaunchPlan] | None) -> LaunchPlan:
    """The job's private settings written on every node while node 0 picks the port: they
    do not depend on it, and each is a round trip over SSH before anything starts."""
    if with_port is None:
        _write_node_private(plan)
        return plan
    failure: list[BaseException] = []

    def write() -> None:
        try:
            _write_node_private(plan)
        except BaseException as err:  # raised again below, in the caller's thread
            failure.append(err)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        ported = with_port()
    except BaseException:
        writer.join()
        _remove_node_private(plan)
        raise
    writer.join()
    if failure:
        _remove_node_private(plan)
        raise failure[0]
    if ported.node_private != plan.node_private:  # never expected: the port is not in them
        _write_node_private(ported)
    return ported


def _remove_node_private(plan: LaunchPlan) -> None:
    """Nothing started: the settings written on the nodes (secrets among them) go again.
    Best effort: a node that cannot be reached keeps a file only this user can read."""

    def command(node: str) -> str:
        return node_files_command(plan.python, "remove", plan.job_id, node)

    plan_transport(plan).run(plan.hosts, command, timeout=10.0, connect_timeout=5.0)


def _write_node_private(plan: LaunchPlan) -> None:
    """The job's environment and the rank's command, on every node, readable by the user
    only, sent over ssh's own channel (stdin): never on a command line, on the head or a
    node. The agent checks its hash, takes it in, and removes it. On the node, a program of
    the standard library (remote/node_files.py) makes the node directory in the user's own
    directory there, level by level, private from the start and checked: a shell's `mkdir
    -p` took the login umask and followed whatever link another user had planted. Through
    Slurm, srun's stdin carries them as ssh's would."""

    def command(node: str) -> str:
        return node_files_command(plan.python, "write", plan.job_id, node)

    results = plan_transport(plan).run(
        plan.hosts, command, timeout=30.0, connect_timeout=10.0,
        stdin=plan.node_private.encode(),
    )  # fmt: skip
    problems = [
        r.why if not r.ok else f"{r.node}: writing the job's settings failed (exit "
        f"{r.value.exit_code}): {r.value.stderr.decode(errors='replace').strip()[-200:]}"
        for r in results
        if not r.ok or r.value.exit_code != 0
    ]
    if problems:
        raise OrchError(
            "the job's settings could not be written on every node; nothing was started:\n  "
            + "\n  ".join(problems),
            "check SSH to those nodes with `orch doctor --hostfile F`",
        )


def _preflight(plan: LaunchPlan, options: PipelineOptions,
               reporter: PipelineReporter) -> tuple[DoctorReport, EnvironmentRecord]:  # fmt: skip
    """The pre-flight; with --push-env, first the head's environment pushed to the nodes
    where it found it differs, then the pre-flight again. Its report and what the job's
    record keeps of the nodes' environments; OrchError when the job cannot start."""
    fix = _push_fix(plan, options)
    report = _checked(plan, fix)
    pushed: PushDone | None = None
    differ = nodes_to_push(report) if options.push_env else ()
    if differ:
        reporter.pushing_environment(plan.python, differ)
        pushed = push_to(differ, plan.python, fix.command if fix is not None else None,
                         plan_transport(plan))  # fmt: skip
        reporter.environment_pushed(pushed)
        report = _checked(plan, fix)
    if report.ok:
        return report, environment_record(report, pushed)
    reporter.preflight_failed(report)
    raise OrchError(
        f"pre-flight failed on {len({f.node for f in report.errors})} node(s); nothing was started",
        "fix the findings above (see `orch doctor --hostfile F`), or pass --no-doctor",
    )


def _push_fix(plan: LaunchPlan, options: PipelineOptions) -> PushFix | None:
    """How the findings say the head's environment reaches this job's nodes."""
    hosts = options.hosts
    in_allocation = hosts.hostfile is None and (hosts.slurm or bool(plan.job.slurm_job))
    hostfile = None if in_allocation else hosts.hostfile
    return push_fix(plan.python, hostfile=hostfile, slurm=in_allocation, include=hosts.include,
                    exclude=hosts.exclude, option=not options.push_env)  # fmt: skip


def _checked(plan: LaunchPlan, fix: PushFix | None) -> DoctorReport:
    from orchestrator.prepare.preflight import run_preflight

    request = PreflightRequest(plan.hostfile, python=plan.python, workdir=plan.workdir,
                               script=plan.job.script, main_port=plan.main_port, push=fix)
    return run_preflight(request, transport=plan_transport(plan))
