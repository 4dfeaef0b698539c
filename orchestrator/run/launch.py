"""Executing a LaunchPlan: start it, watch every node, tear it down, record its end.

The job's output arrives through one pdsh stream (`node: <wire line>`), whichever
launcher runs it: pdsh started by orch (standard, torchrun), or pdsh started by
DeepSpeed's runner through orch's shim (pdsh launcher). Each node's agent sends
heartbeats and an `exit` message; the watcher here turns them into one verdict:

- every node exits 0: success;
- a node reports a non-zero exit: the first failing rank's node and exit code
  (the earliest failure seen within a short settle window) are the job's;
- a node goes silent (no heartbeat for `heartbeat_timeout` s) or its ssh
  connection breaks: that node failed;
- the first SIGINT, `orch stop`, the time limit: every rank gets its grace to save (run/stop.py);
  a second SIGINT, SIGTERM on the head (or `orch kill`): interrupted / killed at once.

Any failure tears the job down on every node through a separate channel: a
fresh pdsh running the agent's kill-by-job-id program, so it works even when the
job's own channel is wedged. The record in runs/<id>/ is updated at each step; the
job's end is run/job.py's to write, with this attempt in it. The plan's files are written
by run/plan_files.py; what the job printed is kept by the output tracker (logs/tracker.py),
which turns it into the verdict's events; outcome/explanation.py explains a failure.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.logs.progress import ProgressRecorder
from orchestrator.logs.redact import Redactor, secret_values
from orchestrator.logs.router import LogRouter, LogView
from orchestrator.logs.tracker import OutputTracker
from orchestrator.logs.view import LiveView, PlainView
from orchestrator.nodes import slurm
from orchestrator.nodes.pdsh import StreamingProcess, start_streaming
from orchestrator.nodes.transport import plan_transport
from orchestrator.outcome.events import (
    Event,
    HeadExited,
    Interrupted,
    NodeExited,
    OutputEnded,
    QuietLooked,
    StopAsked,
    TeardownDone,
    Tick,
    WatchSettings,
)
from orchestrator.outcome.explanation import Explanation, explain
from orchestrator.outcome.hang import hang_culprit
from orchestrator.outcome.pace import PaceSeed
from orchestrator.outcome.requeue import RequeueDecision
from orchestrator.outcome.restart_policy import NO_PROGRESS, AttemptProgress, attempt_progress
from orchestrator.outcome.slurm_words import in_slurm_words
from orchestrator.outcome.states import Failure, FailureKind, JobState, StopCause
from orchestrator.outcome.stop import StopSummary
from orchestrator.outcome.verdict import JobVerdict, Outcome
from orchestrator.pernode import GroupResult
from orchestrator.plan.launch_plan import LaunchPlan, process_environment
from orchestrator.records.job import (
    KILL_MARKER,
    LOGS_DIR,
    STOP_MARKER,
    AttemptRecord,
    FirstFailure,
    JobRecord,
    finished,
    first_failure_of,
    now_iso,
    rank_records,
)
from orchestrator.records.moments import Moment, MomentKind, append_moments
from orchestrator.records.rundir import APPEND, RunDir
from orchestrator.run.allocation_watch import AllocationWatch
from orchestrator.run.background import read_chunks_into
from orchestrator.run.collect import LogCollector
from orchestrator.run.plan_files import remove_private_files, write_private_files
from orchestrator.run.quiet import QuietLook
from orchestrator.run.stacks import save_stacks, stacks_before_teardown
from orchestrator.run.stop import Stop, begin_stop
from orchestrator.run.straggler_watch import straggler_watch_for
from orchestrator.run.teardown import StopReport, teardown_job, unreached
from orchestrator.specs.words import Fanout
from orchestrator.stacks.fold import FoldedStacks
from orchestrator.stacks.report import StacksResult, result_json

_PULL_CONNECT_S, _PULL_TIMEOUT_S = 5.0, 60.0  # pulling one node's raw logs back


@dataclass(frozen=True)
class LaunchResult:
    job_id: str
    run_dir: Path
    state: JobState
    exit_code: int
    node_exit_codes: dict[str, int | None]
    first_failure: FirstFailure | None
    teardown: GroupResult[StopReport] | None  # what the kill program found (no teardown: None)
    node_logs: dict[str, str]  # node -> "ok" or why its raw logs did not come back
    stacks: StacksResult | None = None  # the running ranks' stacks, taken before teardown
    stacks_file: Path | None = None  # where they are kept in the record
    stacks_problem: str | None = None  # why they were not taken
    attempts: tuple[AttemptRecord, ...] = ()  # every attempt of the job, this one last
    progress: AttemptProgress = NO_PROGRESS  # how far this attempt got, for a restart
    stop: StopSummary | None = None  # the stop that ended it, and each rank's part in it
    started: float | None = None  # when the watch began (monotonic): the time limit's start
    pace: PaceSeed | None = None  # the pace it learned, for a restart to start from
    requeue: RequeueDecision | None = None  # --requeue: whether it goes on in an allocation


def _not_answering(failure: Failure) -> tuple[str, ...]:
    """A node that stopped answering: its stop request is sent, not waited for."""
    return (failure.node,) if failure.kind == FailureKind.SILENT and failure.node else ()


class JobRunner:
    """Runs one prepared plan to its end: turns what it reads into events for the job's
    verdict (outcome/verdict.py) and acts on its decisions. `interrupt()` may be called from a
    signal handler."""

    def __init__(
        self,
        plan: LaunchPlan,
        run: RunDir,
        record: JobRecord,
        *,
        settings: WatchSettings | None = None,
        view: LogView | None = None,
        keep_remote_logs: bool = False,
    ) -> None:
        self.plan = plan
        self.keep_remote_logs = keep_remote_logs
        self.run_dir = run
        self.record = record
        self.settings = settings or WatchSettings()
        self.progress = ProgressRecorder(run, now=time.time())
        self.tracker = OutputTracker(plan.hosts, view, self.progress)
        self.verdict = JobVerdict(
            plan.hosts, self.settings, head_launcher=bool(plan.launch.head_command)
        )
        self.view = view
        self.signals: list[int] = []  # every signal the head got, in order
        self.stop: Stop | None = None
        self.teardown: GroupResult[StopReport] | None = None
        self.quiet_look = QuietLook(plan, self.settings.look_seconds,
                                    self.settings.hang_stacks_timeout)  # fmt: skip
        self.straggler_watch = straggler_watch_for(plan, run)
        self.allocation_watch = AllocationWatch(self.settings.slurm_job,
                                                self.settings.allocation_poll)  # fmt: skip
        self.stacks: StacksResult | None = None  # taken before a failure's teardown
        self.earlier_looks: tuple[FoldedStacks, ...] = ()  # a hang's looks before the last
        self.stacks_file: Path | None = None
        self.stacks_problem: str | None = None
        self.tails_at_failure: dict[str, tuple[str, ...]] | None = None
        self._started: float | None = None  # on the monotonic clock: how long it ran
        self._failed_at: float | None = None
        self._teardown_thread: threading.Thread | None = None
        self._teardown_done = threading.Event()
        # A node whose agent has exited has written its last byte: its logs come back
        # while the rest of the job ends (the launcher's own exit takes seconds).
        self._node_logs = LogCollector(
            plan.job_id, run.node_logs, keep_remote=keep_remote_logs,
            connect_timeout=_PULL_CONNECT_S, timeout=_PULL_TIMEOUT_S,
            secrets=secret_values(plan, os.environ), transport=plan_transport(plan),
            node_root=plan.job.node_root,
        )  # fmt: skip

    def interrupt(self, signum: int) -> None:
        self.signals.append(signum)

    def _moment(self, kind: MomentKind, failure: Failure | None = None,
                detail: str | None = None) -> None:  # fmt: skip
        """A moment for the report's timeline (records/moments.py), on the head's clock."""
        node = (failure.node or None) if failure is not None else None
        rank = failure.rank if failure is not None else None
        append_moments(self.run_dir, [Moment(time.time(), kind, node, rank, detail)])

    def _open_log(self, name: str) -> int:
        """A node's log file, appended to, in the run directory held open."""
        return self.run_dir.open(f"{LOGS_DIR}/{name}", APPEND)

    # -- starting ----------------------------------------------------------------
    def _start(self) -> StreamingProcess:
        """Write the plan's private files, then start what the plan says the head runs."""
        write_private_files(self.plan)
        head = self.plan.launch.head_process
        env = process_environment(head, os.environ)
        return start_streaming(head.argv, env=env, cwd=head.cwd, term_first=head.term_first)

    # -- the watch loop ----------------------------------------------------------
    def run(self) -> LaunchResult:
        self.record = replace(self.record, state=JobState.RUNNING)
        self.run_dir.save(self.record)
        try:
            process = self._start()
        except BaseException:
            remove_private_files(self.plan)
            raise
        self._started = time.monotonic()
        self._moment(MomentKind.START)
        chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        reader = threading.Thread(target=read_chunks_into, args=(process.stdout, chunks),
                                  daemon=True)  # fmt: skip
        reader.start()
        router = LogRouter(self.run_dir.logs, view=self.tracker, nodes=self.plan.hosts,
                           open_log=self._open_log)  # fmt: skip
        # The head launcher inherits this process's environment, and accelerate hands all
        # of it to DeepSpeed, whose runner logs it: mask the head's secrets as well.
        redactor = Redactor(secret_values(self.plan, os.environ))
        try:
            self._watch(process, chunks, router, redactor)
        finally:
            ended_by_itself = process.poll() is not None
            head_code = process.stop(grace=self.settings.stop_grace)
            if self.tracker.slurm_step and not ended_by_itself:
                # srun was stopped (TERM, forwarded to its tasks): whatever Slurm still runs
                # of the step ends too, once every node has had its say.
                slurm.cancel(self.tracker.slurm_step)
            reader.join(2.0)
            with contextlib.suppress(queue.Empty):
                while (item := chunks.get_nowait()) is not None:
                    self.progress.now = time.time()
                    router.feed_lines(redactor.lines(item[1]))
            router.feed_lines(redactor.rest())
            router.close()
            heard = self.progress.close()
            # Exits read while draining still count; the job is over, so nothing is torn down.
            for event in self.tracker.events(time.monotonic()):
                self.verdict.feed(event)
            if self._teardown_thread is not None:
                self._teardown_thread.join(self.settings.teardown_budget + 10)
            # After the teardown's own moments: appends of two threads never interleave.
            append_moments(self.run_dir, heard)
            remove_private_files(self.plan)
        outcome = self.verdict.outcome(head_code, stopped_by_us=not ended_by_itself)
        return self._conclude(outcome, self._pull_raw_logs())

    def _watch(
        self,
        process: StreamingProcess,
        chunks: queue.Queue[tuple[float, bytes] | None],
        router: LogRouter,
        redactor: Redactor,
    ) -> None:
        """Read the fan-out's output until the verdict says to stop."""
        signals_seen, teardown_noted, stop_noted = 0, False, False
        while True:
            try:
                item = chunks.get(timeout=0.25)
            except queue.Empty:
                item = (time.monotonic(), b"")
            now = time.monotonic()
            events: list[Event] = []
            # What a chunk says, it said when it arrived, however long it waited here.
            arrived = now if item is None else item[0]
            if item is not None and item[1]:
                self.progress.now = self.tracker.arrived = time.time() - (now - arrived)
                router.feed_lines(redactor.lines(item[1]))
            events += self.tracker.events(arrived)
            if item is None:
                events.append(OutputEnded(now))
            code = process.poll()
            if code is not None:
                events.append(HeadExited(code, now))
            for signum in self.signals[signals_seen:]:
                signals_seen += 1
                killed = self.run_dir.exists(KILL_MARKER)
                events.append(Interrupted(signum, killed, now))
                self._moment(MomentKind.INTERRUPT, detail="orch kill" if killed else None)
            if not stop_noted and self.run_dir.exists(STOP_MARKER):
                stop_noted = True
                events.append(StopAsked(StopCause.ORCH_STOP, now))
            events += [self._noted(looked) for looked in self.quiet_look.events()]
            events += self.allocation_watch.events(now)
            busy = self.verdict.stopping or self._failed_at is not None
            self.straggler_watch.tick(now, self.verdict.pace.stepped, busy)
            for said in self.straggler_watch.said():
                self._said(MomentKind.PROFILE, said)
            if self._teardown_done.is_set() and not teardown_noted:
                teardown_noted = True
                events.append(TeardownDone(now, frozenset(unreached(self.teardown))))
            events.append(Tick(now, read_up_to=None if chunks.empty() else arrived))
            stop = False
            for event in events:
                if isinstance(event, NodeExited):
                    self._node_logs.start(event.node)
                decision = self.verdict.feed(event)
                if decision.begin_stop is not None:
                    self._begin_stop(decision.begin_stop)
                if decision.tear_down is not None:
                    self._begin_teardown(decision.tear_down)
                if decision.look:
                    self.quiet_look.start(now)
                stop = stop or decision.stop_reading
            if self.stop is not None and self.verdict.stopping:
                self.stop.show(self.view, len(self.tracker.rank_ends), self.verdict.grace.seconds)
            if stop:
                return

    def _noted(self, looked: QuietLooked) -> QuietLooked:
        """A look that found the quiet job working: on the timeline and in the live view."""
        if looked.finding.working:
            self._said(MomentKind.QUIET, f"quiet, working: {looked.finding.summary()}")
        return looked

    def _said(self, kind: MomentKind, said: str) -> None:
        """What a look found: on the timeline and in the live view."""
        self._moment(kind, detail=said)
        if isinstance(self.view, LiveView | PlainView):
            self.view.status(said)

    def _pull_raw_logs(self) -> dict[str, str]:
        """Pull each node's raw logs back, whatever way the job ended."""
        return self._node_logs.pull_all(self.plan.hosts, unreached(self.teardown))

    # -- stop and teardown --------------------------------------------------------
    def _begin_stop(self, cause: StopCause) -> None:
        self.stop = begin_stop(self.plan, cause)
        self.record = replace(self.record, state=JobState.STOPPING)
        self.run_dir.save(self.record)
        self._moment(MomentKind.STOP, detail=str(cause))

    def _begin_teardown(self, failure: Failure) -> None:
        # The lines before the failure, not the teardown's own noise that follows it.
        self.tails_at_failure = self.tracker.node_tails()
        self._failed_at = time.monotonic()
        self.record = replace(self.record, state=JobState.STOPPING)
        self.run_dir.save(self.record)
        if self.stop is not None:
            self.stop.torn_down(grace_over=failure.kind == FailureKind.STOPPED)
        if failure.kind == FailureKind.HANG:
            self._moment(MomentKind.HANG, failure, failure.reason)
        self._moment(MomentKind.FIRST_FAILURE, failure, failure.reason)
        self._moment(MomentKind.TEARDOWN_START)

        def work() -> None:
            try:
                if failure.kind not in (FailureKind.SIGNAL, FailureKind.KILLED,
                                        FailureKind.STOPPED):  # fmt: skip
                    self._take_stacks(failure)
                self.teardown = teardown_job(
                    self.plan.hosts,
                    self.plan.job_id,
                    self.plan.python,
                    grace=self.plan.job.grace,
                    timeout=self.settings.teardown_timeout,
                    not_answering=_not_answering(failure),
                    log=self.run_dir.teardown_unanswered,
                    transport=plan_transport(self.plan),
                )
            finally:
                self._moment(MomentKind.TEARDOWN_END)
                self._teardown_done.set()

        self._teardown_thread = threading.Thread(target=work, daemon=True)
        self._teardown_thread.start()

    def _take_stacks(self, failure: Failure) -> None:
        """Where the ranks still running stand, kept in the record before they are stopped.
        Taking stacks is a help, never a reason to fail: nothing it meets is raised."""
        try:
            self.stacks, self.earlier_looks = stacks_before_teardown(
                self.plan, failure, self.settings, now_iso
            )
            self.stacks_file = save_stacks(self.run_dir, result_json(self.stacks))
        except (OrchError, OSError) as err:
            self.stacks_problem = f"stacks not taken: {err}"

    # -- the record --------------------------------------------------------------------
    def _failure_in_full(self, failure: Failure | None) -> Failure | None:
        """The verdict's failure with what only the end tells: a hang's culprit from the
        stacks taken, an srun fan-out's failure in Slurm's words."""
        if failure is not None and failure.kind == FailureKind.HANG:
            failure = hang_culprit(failure, self.stacks, self.earlier_looks)
        if failure is not None and self.plan.job.fanout == Fanout.SRUN:
            failure = in_slurm_words(
                failure, self.tracker.head_lines(), bool(self.verdict.last_seen),
                slurm.node_problems(self.plan.hosts),
            )  # fmt: skip
        return failure

    def _conclude(self, outcome: Outcome, node_logs: dict[str, str]) -> LaunchResult:
        failure = self._failure_in_full(outcome.failure)
        if failure is not None and failure.kind == FailureKind.LOST and self.stop is not None \
                and self.stop.cause == StopCause.SLURM_SIGNAL:
            # Slurm's SIGTERM came because it took a node out, not to stop the job: failed.
            outcome = replace(outcome, state=JobState.FAILED, failure=failure)
        why: Explanation | None = None
        if failure is not None:
            why = explain(failure, self.tracker.kept(self.tails_at_failure))
            if why.failure.kind == FailureKind.RANK:  # the job's exit code is its cause's
                outcome = replace(outcome, exit_code=why.failure.exit_code, failure=why.failure)
        first = first_failure_of(why) if why is not None else None
        order = why.order if why is not None else None
        grace = self.verdict.grace
        stop = self.stop.summary(self.tracker, grace) if self.stop is not None else None
        self.record = finished(
            self.record,
            state=JobState.STOPPING,  # the job's end: run/job.py, with this attempt
            exit_code=outcome.exit_code,
            node_exit_codes=outcome.node_exit_codes,
            first_failure=first,
            node_logs=node_logs,
            teardown_stacks=(
                str(self.stacks_file.relative_to(self.run_dir.path)) if self.stacks_file else None
            ),
            slurm_step=self.tracker.slurm_step,
            ranks=rank_records(self.tracker.rank_ends.values(), order),
            stop=stop,
            hang_watch=self.verdict.hang_watch(),
        )
        self.run_dir.save(self.record)
        self._moment(MomentKind.END, detail=str(outcome.state))
        return LaunchResult(
            job_id=self.plan.job_id,
            run_dir=self.run_dir.path,
            state=outcome.state,
            exit_code=outcome.exit_code,
            node_exit_codes=outcome.node_exit_codes,
            first_failure=first,
            teardown=self.teardown,
            node_logs=node_logs,
            stacks=self.stacks,
            stacks_file=self.stacks_file,
            stacks_problem=self.stacks_problem,
            progress=self._progress(),
            stop=stop,
            started=self._started,
            pace=self.verdict.pace.seed_for_next(),
        )

    def _progress(self) -> AttemptProgress:
        failed_at = self._failed_at if self._failed_at is not None else time.monotonic()
        return attempt_progress(self.progress.steps, self._started, failed_at)
