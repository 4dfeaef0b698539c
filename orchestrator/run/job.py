"""A prepared job run to its end (`run_job`): its attempts, plan -> execute -> verdict ->
restart or stop. Each attempt (`execute_plan`): its nodes made ready (prepare/ready.py), its
record prepared, the job started and watched to its verdict (run/launch.py). Whether to
restart is the restart policy's (outcome/restart_policy.py); the loop here carries it out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from orchestrator.checkpoint_copies.keeper import CheckpointKeeper
from orchestrator.checkpoint_copies.nodes import CheckpointNodes
from orchestrator.errors import NodesUnavailable, OrchError, RecordError, RestartNotStarted
from orchestrator.logs.router import LogView
from orchestrator.nodes import slurm
from orchestrator.nodes.transport import plan_transport
from orchestrator.outcome.events import WatchSettings
from orchestrator.outcome.pace import PaceSeed
from orchestrator.outcome.requeue import (
    RequeueBy,
    RequeueDecision,
    RequeueFacts,
    decide_requeue,
    requeue_failed,
)
from orchestrator.outcome.restart_policy import (
    NO_PROGRESS,
    AttemptProgress,
    Cause,
    RestartDecision,
    RestartPolicy,
    decide,
    next_nodes,
    pause_before,
    short_of_nodes,
)
from orchestrator.outcome.states import JobState
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.prepare.job import PipelineOptions, PreparedJob, pipeline_options
from orchestrator.prepare.ports import plan_with_main_port
from orchestrator.prepare.ready import PrepareReporter, ready_nodes
from orchestrator.records.attempt_facts import attempt_failure, attempt_record
from orchestrator.records.attempts import carried_over, keep_apart, with_attempt
from orchestrator.records.job import JOB_FILE, AttemptRecord, FirstFailure, JobRecord
from orchestrator.records.moments import note_attempt, save_preflight
from orchestrator.records.ownership import check_runs_root
from orchestrator.records.rundir import RunDir, run_dir
from orchestrator.run.launch import JobRunner, LaunchResult
from orchestrator.run.plan_files import prepare_run
from orchestrator.run.recheck import unreachable_nodes
from orchestrator.specs.slurm import JOB_ID_VAR, restart_count, stop_before_the_end
from orchestrator.specs.words import Fanout


def run_job(job: PreparedJob, *, view: LogView | None, reporter: PipelineReporter) -> LaunchResult:
    """Run a prepared job to its end: its attempts (`execute_plan` each, with the port node 0
    picks for it), as long as the restart policy says another is worth it. Everything it
    writes on the head (the record, the logs, the raw node logs, the stacks) is the user's
    alone, whatever the login umask: the umask is 077 for the job's time. The runs
    directory is checked before anything starts (a link, another user's, or one others can
    write is refused); the job's directory, made once its nodes are ready, is held open
    by every attempt."""
    try:
        check_runs_root(job.root)
    except OrchError as err:  # no record can be kept: orch's own failure, with its code
        raise RecordError(err.message, err.hint) from err
    before = os.umask(0o077)
    try:
        with run_dir(job.root, job.plan.job_id) as run:
            earlier = _earlier_allocations(job, run)
            result = _attempts(job, run, earlier, view=view, reporter=reporter)
            return _requeued(job, run, result)
    finally:
        os.umask(before)


# A requeued allocation's last attempt that ended without a cause of its own (it succeeded,
# and Slurm requeued the job all the same).
_ALLOCATION_ENDED = {"class": "stopped", "message": "it ended with its Slurm allocation"}


def _earlier_allocations(job: PreparedJob, run: RunDir) -> JobRecord | None:
    """A batch job that Slurm runs again (requeued): its record so far, whose attempts the
    ones in this allocation follow. None: a job's first (or only) allocation."""
    if not job.plan.slurm_batch or not run.exists(JOB_FILE):
        return None
    return carried_over(run, run.load())


def _requeue_decision(job: PreparedJob, record: JobRecord,
                      result: LaunchResult) -> RequeueDecision | None:  # fmt: skip
    """--requeue: whether the batch job goes on in another allocation (the pure decision,
    outcome/requeue.py, over what Slurm says of the job). None: no --requeue, not a batch job."""
    settings, slurm_job = job.request.requeue_settings, job.plan.job.slurm_job
    if not settings.requeue or not job.plan.slurm_batch or not slurm_job:
        return None
    facts = RequeueFacts(
        state=result.state, stop_cause=result.stop.cause if result.stop is not None else None,
        allocation=record.allocation, restarts_at_start=restart_count(os.environ),
        slurm=slurm.job_view(slurm_job),
    )  # fmt: skip
    return decide_requeue(facts, settings)


def _requeued(job: PreparedJob, run: RunDir, result: LaunchResult) -> LaunchResult:
    """The requeue the record already says, carried out: `scontrol requeue`. Done last: Slurm
    then ends this allocation at once, this process with it once its KillWait is over."""
    decision, slurm_job = result.requeue, job.plan.job.slurm_job
    if decision is None or decision.by != RequeueBy.ORCH or not slurm_job:
        return result
    # Slurm TERMs the batch shell, which this process is, as it ends the allocation: the
    # summary is still to be printed.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answer = slurm.requeue(slurm_job)
    if answer.ok:
        return result
    decision = requeue_failed(decision, answer.problem, slurm_job)
    # Not queued after all: the job ends with this allocation's last attempt.
    run.save(replace(run.load(), requeue=decision, state=result.state))
    return replace(result, requeue=decision)


def _run_attempt(job: PreparedJob, run: RunDir, earlier: JobRecord | None, *,
                 view: LogView | None, reporter: PipelineReporter,
                 time_left: float | None = None,
                 pace: PaceSeed | None = None) -> LaunchResult:  # fmt: skip
    options = pipeline_options(job.request)
    if time_left is not None:  # a restart: the time limit counts from the first attempt
        options = replace(options, settings=replace(options.settings, time_limit=time_left))
    if pace is not None:  # a restart starts from the pace the attempt before learned
        options = replace(options, settings=replace(options.settings, pace_seed=pace))

    def with_port() -> LaunchPlan:
        return plan_with_main_port(job.build, job.request.spec.main_port, job.plan.job_id,
                                   dry_run=False, preflight=options.preflight)  # fmt: skip

    return execute_plan(job.plan, run, options, view=view, reporter=reporter,
                        with_port=with_port, earlier=earlier)  # fmt: skip


def _with_requeue(attempts: tuple[AttemptRecord, ...],
                  decision: RequeueDecision) -> tuple[AttemptRecord, ...]:  # fmt: skip
    """The allocation's last attempt, its decision the requeue's when the job goes on: what
    `orch status` shows of each allocation's end."""
    if not attempts or not decision.goes_on:
        return attempts
    last = attempts[-1]
    cause = {**(last.cause or _ALLOCATION_ENDED), "decision": decision.why}
    return (*attempts[:-1], replace(last, cause=cause))


def _attempts(job: PreparedJob, run: RunDir, earlier: JobRecord | None, *,
              view: LogView | None, reporter: PipelineReporter) -> LaunchResult:  # fmt: skip
    """plan -> execute -> verdict -> restart or stop. Whether to restart is the restart
    policy's (a pure function of the attempt's facts); this loop only carries it out.
    `earlier`: the record of the job's earlier allocations, whose attempts these follow
    (ORCH_RESTART_COUNT counts on; --max-restarts counts in each allocation afresh)."""
    request = job.request
    before = len(earlier.attempts) if earlier is not None else 0
    state = _Recovery(RestartPolicy(request.max_restarts, request.restart_on),
                      wanted=len(job.plan.hosts),
                      minimum=request.min_nodes or len(job.plan.hosts),
                      before=before)  # fmt: skip
    job = _healthy_start(job, state.wanted, state.minimum)
    if earlier is not None and before:  # ORCH_RESTART_COUNT counts on from the last one
        job = job.on(job.plan.hosts, before)
        note_attempt(run, time.time(), before + 1, f"Slurm allocation {earlier.allocation}")
    keeper = _checkpoint_keeper(job, run, reporter)
    with _following(keeper, job, before + 1):
        result = _run_attempt(job, run, earlier, view=view, reporter=reporter)
    first_started = result.started
    while True:
        record = run.load()
        if result.state == JobState.SUCCEEDED or result.first_failure is None:
            if keeper is not None and result.state == JobState.SUCCEEDED:
                reporter.checkpoints(keeper.finish(_pool(job)))
            return _ended(job, run, record, result, None)
        decision, excluded, nodes = state.after(job, record, result.first_failure,
                                                result.progress)  # fmt: skip
        time_left = _time_left(job, first_started)
        if not decision.restart:  # nothing is dropped: no attempt follows
            return _ended(job, run, record, result, decision)
        if time_left is not None and time_left <= 0:
            return _ended(job, run, record, result, replace(
                decision, restart=False, why=f"{decision.why}; but the time limit is reached"))
        reporter.attempt_ended(run.path, result.state)  # its page, kept with its logs
        attempt = keep_apart(run, attempt_record(record, decision, excluded))
        note_attempt(run, time.time(), attempt.number + 1, decision.why)
        ended = replace(record, state=result.state, attempts=(*record.attempts, attempt))
        earlier = with_attempt(run, record, attempt)
        pause = pause_before(record.attempt - 1 - state.before)
        following = job.on(nodes, record.attempt)
        reporter.restarting(attempt, job.plan, following.plan, pause)
        job = following
        try:
            time.sleep(pause)
            if keeper is not None:
                alive = [n for n in _pool(job) if n not in state.dropped]
                reporter.checkpoints(keeper.restore(alive, job.plan.hosts, record.attempt + 1))
            with _following(keeper, job, record.attempt + 1):
                result = _run_attempt(job, run, earlier, view=view, reporter=reporter,
                                      time_left=_time_left(job, first_started),
                                      pace=result.pace)  # fmt: skip
        except (OrchError, KeyboardInterrupt) as err:
            # The next attempt never started: the job ended with the one before, and so does
            # its exit code, whatever kept the next one from starting.
            if isinstance(err, KeyboardInterrupt):
                return _saved_end(job, run, ended, result)
            run.save(ended)
            raise RestartNotStarted(record.attempt, err, record.exit_code or 1) from err


def _pool(job: PreparedJob) -> tuple[str, ...]:
    """Every node the job may run on: the hostfile's or allocation's, spares included."""
    return job.pool.names if job.pool is not None else job.plan.hosts


def _checkpoint_keeper(job: PreparedJob, run: RunDir,
                       reporter: PipelineReporter) -> CheckpointKeeper | None:  # fmt: skip
    """With --checkpoint-dir: the job's checkpoints, PATH checked on every node of the pool
    first (a shared filesystem is found there and left alone)."""
    settings = job.plan.checkpoints
    if settings is None:
        return None
    nodes = CheckpointNodes(plan_transport(job.plan), job.plan.job.python, job.plan.job_id,
                            settings, job.plan.job.node_root)  # fmt: skip
    keeper = CheckpointKeeper(nodes, run, reporter.checkpoints)
    keeper.check(_pool(job))
    return keeper


def _following(keeper: CheckpointKeeper | None, job: PreparedJob,
               attempt: int) -> contextlib.AbstractContextManager[None]:  # fmt: skip
    """The attempt's checkpoints copied between its nodes while it runs."""
    if keeper is None:
        return contextlib.nullcontext()
    return keeper.following(job.plan.hosts, attempt)


def _in_allocation(settings: WatchSettings, reporter: PipelineReporter) -> WatchSettings:
    """Inside a Slurm allocation (its id in the environment): Slurm's SIGTERM is a stop,
    and the job stops early enough for its ranks' grace to end before the allocation does."""
    slurm_job = os.environ.get(JOB_ID_VAR)
    if not slurm_job:
        return settings
    left = slurm.time_left(slurm_job)
    stop_after = stop_before_the_end(left, settings.rank_grace)
    if left is not None and stop_after is not None:
        reporter.slurm_limit(left, stop_after, settings.rank_grace)
    return replace(settings, slurm_job=slurm_job, slurm_stop_after=stop_after,
                   slurm_kill_wait=slurm.kill_wait())  # fmt: skip


def _time_left(job: PreparedJob, first_started: float | None) -> float | None:
    """What is left of --time-limit, counted from the first attempt's start; None: no limit."""
    limit = job.request.time_limit
    if limit is None or first_started is None:
        return None
    return limit - (time.monotonic() - first_started)


@dataclass
class _Recovery:
    """What the attempts loop carries from one attempt to the next."""

    policy: RestartPolicy
    wanted: int  # the job's nodes
    minimum: int  # --min-nodes, else every one of them
    dropped: list[str] = field(default_factory=list)  # excluded after earlier attempts
    previous: Cause | None = None  # the last failed attempt's cause
    previous_progress: AttemptProgress = NO_PROGRESS  # and how far it got
    before: int = 0  # attempts of the job's earlier Slurm allocations (a requeued batch job)

    def after(self, job: PreparedJob, record: JobRecord, first: FirstFailure,
              progress: AttemptProgress) -> tuple[
        RestartDecision, tuple[str, ...], tuple[str, ...]
    ]:  # fmt: skip
        """The decision after a failed attempt (`progress`: how far it got), the nodes it
        drops, the next one's nodes."""
        restarts_done = record.attempt - 1 - self.before
        pool = _pool(job)
        # The re-check costs a few seconds: only when a restart may follow, over ssh.
        recheck = self.policy.max_restarts > restarts_done and job.plan.job.fanout == Fanout.PDSH
        left = [n for n in pool if n not in self.dropped]
        unreachable = unreachable_nodes(left) if recheck else ()
        facts = attempt_failure(first, record.ranks, unreachable)
        decision = decide(facts, self.policy, restarts_done=restarts_done, previous=self.previous,
                          progress=progress, previous_progress=self.previous_progress)  # fmt: skip
        excluded = tuple(dict.fromkeys((*decision.cause.at_fault, *unreachable)))
        nodes = next_nodes(pool, job.plan.hosts, [*self.dropped, *excluded], wanted=self.wanted,
                           minimum=self.minimum)  # fmt: skip
        if decision.restart and nodes.problem is not None:
            decision = short_of_nodes(decision, nodes.problem)
        self.dropped += excluded
        self.previous, self.previous_progress = decision.cause, progress
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
        raise NodesUnavailable(f"not enough nodes answer: {nodes.problem}; nothing was started",
                        "check SSH to those nodes with `orch doctor --hostfile F`")  # fmt: skip
    return job if nodes.nodes == job.plan.hosts else job.on(nodes.nodes, 0)


def _ended(job: PreparedJob, run: RunDir, record: JobRecord, result: LaunchResult,
           decision: RestartDecision | None) -> LaunchResult:  # fmt: skip
    """The job's end into the record in one write: its last attempt, its state and, for a
    batch job with --requeue, whether it goes on (queued again). The job's result is that
    attempt's."""
    final = replace(record, state=result.state,
                    attempts=(*record.attempts, attempt_record(record, decision)))  # fmt: skip
    return _saved_end(job, run, final, result)


def _saved_end(job: PreparedJob, run: RunDir, final: JobRecord,
               result: LaunchResult) -> LaunchResult:  # fmt: skip
    """`final`, the job's ended record, saved with its requeue decision (--requeue)."""
    requeue = _requeue_decision(job, final, result)
    if requeue is not None:
        final = replace(final, requeue=requeue,
                        attempts=_with_requeue(final.attempts, requeue))  # fmt: skip
        if requeue.goes_on:
            final = replace(final, state=JobState.QUEUED)
    run.save(final)
    return replace(result, attempts=final.attempts, requeue=requeue)


class PipelineReporter(PrepareReporter, Protocol):
    """Hears what the steps before the job found, and each attempt's start and end."""

    def started(self, plan: LaunchPlan, run: RunDir) -> None: ...

    def attempt_ended(self, run_dir: Path, state: JobState) -> None: ...

    def restarting(self, ended: AttemptRecord, plan: LaunchPlan, following: LaunchPlan,
                   pause: float) -> None: ...  # fmt: skip

    def slurm_limit(self, left: float, stop_after: float, grace: float) -> None: ...

    def checkpoints(self, line: str) -> None: ...


def execute_plan(
    plan: LaunchPlan,
    run: RunDir,
    options: PipelineOptions,
    *,
    view: LogView | None,
    reporter: PipelineReporter,
    with_port: Callable[[], LaunchPlan] | None = None,
    earlier: JobRecord | None = None,
) -> LaunchResult:
    """Run the plan to its end, its record in `run` (made here for the first attempt, then
    held); SIGINT and SIGTERM tear the job down on every node. `with_port`, when given,
    returns the plan with the main port node 0 picked for it; `earlier`, the job's record
    so far when this is a restart."""
    ready = ready_nodes(plan, options, reporter, with_port)
    plan, preflight = ready.plan, ready.preflight
    record = prepare_run(plan, run, earlier, ready.environment)
    if preflight is not None:  # for the job's page: it ran before its directory existed
        save_preflight(run, preflight.started, preflight.ended, preflight.report.to_dict())
    runner = JobRunner(
        plan, run, record, settings=_in_allocation(options.settings, reporter), view=view,
        keep_remote_logs=options.keep_remote_logs,
    )  # fmt: skip
    # SIGUSR1: the warning orch's batch script asks Slurm for before the allocation ends.
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: runner.interrupt(signum))
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    }
    reporter.started(plan, run)
    try:
        return runner.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
