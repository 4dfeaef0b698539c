"""Executing a LaunchPlan: write its files, start it, watch every node, tear it down.

The job's output arrives through one pdsh stream (`node: <wire line>`), whichever
launcher runs it: pdsh started by orch (standard, torchrun), or pdsh started by
DeepSpeed's runner through orch's shim (pdsh launcher). Each node's agent sends
heartbeats and an `exit` message; the watcher here turns them into one verdict:

- every node exits 0: success;
- a node reports a non-zero exit: the first failing rank's node and exit code
  (the earliest failure seen within a short settle window) are the job's;
- a node goes silent (no heartbeat for `heartbeat_timeout` s) or its ssh
  connection breaks: that node failed;
- SIGINT / SIGTERM on the head (or `orch kill`): interrupted / killed.

Any failure tears the job down on every node through a separate channel: a
fresh pdsh running the agent's kill-by-job-id program, so it works even when the
job's own channel is wedged. The record in runs/<id>/ is updated at each step.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.logs.progress import ProgressRecorder
from orchestrator.logs.redact import Redactor, secret_values
from orchestrator.logs.sink import HEAD_NODE, LogRouter, LogView
from orchestrator.nodes import slurm
from orchestrator.nodes.pdsh import (
    StreamingProcess,
    is_pdsh_own,
    ssh_exit_of,
    start_streaming,
)
from orchestrator.nodes.transport import plan_transport
from orchestrator.outcome.rank_ends import (
    ClockOffsets,
    RankEnd,
    RankOrder,
    after_a_fault,
    end_hint,
    order_ends,
    rank_end_from_fields,
)
from orchestrator.outcome.rootcause import TRACEBACK_HEADER, RankTraceback, rank_tracebacks
from orchestrator.outcome.verdict import (
    Event,
    Failure,
    FailureKind,
    HeadExited,
    Interrupted,
    JobState,
    JobVerdict,
    NodeExited,
    NodeHeard,
    Outcome,
    OutputEnded,
    RankOutput,
    SshEnded,
    TeardownDone,
    Tick,
    WatchSettings,
    hang_culprit,
    in_slurm_words,
)
from orchestrator.pernode import GroupResult
from orchestrator.plan.launch_plan import Destination, LaunchPlan, process_environment
from orchestrator.records.job import (
    ENV_FILE,
    AttemptRecord,
    EnvironmentRecord,
    FirstFailure,
    JobRecord,
    RunDir,
    finished,
    now_iso,
    process_start_time,
    rank_records,
)
from orchestrator.records.moments import Moment, MomentKind, append_moments
from orchestrator.remote import owned
from orchestrator.remote.agent_spec import node_dir_shown
from orchestrator.remote.logwire import ControlKind, global_rank
from orchestrator.run.collect import LogCollector, fetch_command
from orchestrator.run.stacks import gather_stacks, save_stacks
from orchestrator.run.teardown import StopProblem, StopReport, teardown_job
from orchestrator.specs.words import Fanout
from orchestrator.stacks.report import StacksResult, analyse, result_json

TAIL_LINES = 15
_PULL_CONNECT_S, _PULL_TIMEOUT_S = 5.0, 60.0  # pulling one node's raw logs back
RANK_TAIL_LINES = 300


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


# ----- writing the plan's files ----------------------------------------------------
JOBS_DIR = "jobs"  # in the user's own directory on the head: one private directory per job


def head_private_dir(job_id: str) -> str:
    """The job's private directory on the head: in the user's own directory under the
    temporary directory (<tmp>/orch-<uid>/jobs/<job>), never a name in the shared one that
    anyone who learns the job's id could take first (as <tmp>/orch-<job> was)."""
    user = owned.user_directory(os.getuid(), tempfile.gettempdir())
    return os.path.join(user, JOBS_DIR, job_id)


def write_private_files(plan: LaunchPlan) -> None:
    """The job's private files on the head (its env file with real values, the pdsh shim),
    in a directory only this user can read, made new for the job (never reused). The two
    levels above it (the user's own directory and its jobs/, as head_private_dir names them)
    are made and checked first: a link, another user's or one others can write is refused."""
    private = Path(plan.job.private_dir)
    files = [f for f in plan.files if f.where == Destination.PRIVATE]
    if not files:
        return
    jobs = private.parent
    try:
        owned.private_directories(str(jobs.parent), [jobs.name], os.getuid())
        private.mkdir(mode=0o700)
    except owned.UnsafeDirectory as err:
        raise OrchError(f"the job's private directory cannot be made: {err}",
                        "fix that directory as said, then launch again") from err  # fmt: skip
    except OSError as err:
        raise OrchError(
            f"cannot create the job's private directory {private}: {err}",
            "check that the temporary directory is writable (TMPDIR)",
        ) from err
    for planned in files:
        path = private / planned.name
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, planned.mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(planned.content)


def prepare_run(plan: LaunchPlan, run: RunDir, earlier: JobRecord | None = None,
                environment: EnvironmentRecord | None = None) -> JobRecord:  # fmt: skip
    """Write the plan's files and a first job.json (state "starting"). `earlier`: the record
    of the job's attempts so far, when this is a restart (its start and attempts stay);
    `environment`: the nodes' environments as the pre-flight found them (None: skipped)."""
    run.create()
    for planned in plan.files:
        if planned.run_dir:
            run.write_file(planned.name, planned.content)
    run.write_file(ENV_FILE, json.dumps(plan.redacted_env, indent=2, sort_keys=True) + "\n")
    record = JobRecord(
        id=plan.job_id,
        state=JobState.STARTING,
        launcher=plan.launcher,
        command=plan.command,
        hosts=plan.hosts,
        workdir=plan.workdir,
        started_at=now_iso(),
        head_pid=os.getpid(),
        head_start=process_start_time(os.getpid()),
        node_exit_codes={host: None for host in plan.hosts},
        recipe=plan.recipe,
        python=plan.python,
        main_port=plan.main_port,
        main_port_chosen=plan.main_port_chosen,
        fanout=plan.job.fanout,
        slurm_job_id=plan.job.slurm_job or None,
        slurm_batch=plan.slurm_batch,
        transport=plan.transport,
        environment=environment,
    )
    record = replace(record, attempt_started=record.started_at)
    if earlier is not None:
        record = replace(record, started_at=earlier.started_at, attempts=earlier.attempts,
                         attempt=len(earlier.attempts) + 1)  # fmt: skip
    run.save(record)
    return record


# ----- watching --------------------------------------------------------------------
_TRACEBACK_BYTES = TRACEBACK_HEADER.encode()
_NOT_A_RANK: tuple[int, deque[bytes]] = (-1, deque())  # a label logwire did not write


def _decoded(tail: Iterable[tuple[int | None, bytes]]) -> tuple[str, ...]:
    return tuple(
        text if rank is None else f"[r{rank}] {text}"
        for rank, data in tail
        for text in (data.decode("utf-8", "replace"),)
    )


class _Tracker:
    """A LogView that notes which nodes were heard from since it was last asked, pdsh's
    reports of ended ssh connections, each node's exit message and its last lines.

    It sees every line of the job, so it keeps them as they came (bytes) and decodes
    only what is read: a few lines when a job fails."""

    def __init__(
        self, hosts: tuple[str, ...], forward: LogView | None,
        progress: ProgressRecorder | None = None,
    ) -> None:  # fmt: skip
        self.hosts = set(hosts)
        self.forward = forward
        self.progress = progress  # the report's progress samples and moments
        self.tails: dict[str, deque[tuple[int | None, bytes]]] = {
            h: deque(maxlen=TAIL_LINES) for h in (*hosts, "")
        }
        # Each rank's own last lines: its traceback is read from them when it fails.
        self.rank_tails: dict[int, deque[bytes]] = {}
        self._labels: dict[str, tuple[int, deque[bytes]]] = {}  # "<rank>/<local>" -> its tail
        self.rank_nodes: dict[int, str] = {}
        self.traceback_at: dict[int, int] = {}  # rank -> when its last traceback began
        self._seen = 0
        self.heard: set[str] = set()
        self.ranks_wrote = False  # a line or a frame from a node since the last call
        self.ssh_ended: list[tuple[str, int]] = []
        self.exited: list[tuple[str, dict]] = []
        self.slurm_step: str | None = None  # the srun fan-out's step, as its agents report it
        self.clocks = ClockOffsets()  # each node's clock against the head's
        # How late each node's last heartbeat arrived, beyond its clock's offset: what waits
        # on the way (the node's ssh, pdsh, the head's pipe) under a flood of output.
        self.behind: dict[str, float] = {}
        self.arrived: float | None = None  # wall time the output being read arrived
        self.rank_ends: dict[int, RankEnd] = {}  # as the keepers reported them, head's clock

    def _rank(self, label: str, node: str) -> tuple[int, deque[bytes]]:
        found = self._labels.get(label)
        if found is None:
            number = global_rank(label)
            if number is None:
                found = _NOT_A_RANK
            else:
                tail = self.rank_tails.setdefault(number, deque(maxlen=RANK_TAIL_LINES))
                found = (number, tail)
                self.rank_nodes[number] = node
            self._labels[label] = found
        return found

    def line(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        if self.progress is not None:
            self.progress.line(node, rank, data)
        number: int | None = None
        if rank:
            number, tail = self._rank(rank, node)
            if number < 0:
                number = None
            else:
                tail.append(data)
                if _TRACEBACK_BYTES in data:
                    self._seen += 1
                    self.traceback_at[number] = self._seen
        if is_pdsh_own(node):
            lost = ssh_exit_of(data.decode("utf-8", "replace"))
            if lost is not None and lost[0] in self.hosts:
                self.ssh_ended.append(lost)
            node = ""
        self.heard.add(node)
        self.ranks_wrote = self.ranks_wrote or node in self.hosts
        self.tails.setdefault(node, deque(maxlen=TAIL_LINES)).append((number, data))
        if self.forward is not None:
            self.forward.line(node, stream, data, rank)

    def node_tails(self) -> dict[str, tuple[str, ...]]:
        """Each node's last lines, decoded, each rank's marked [r<rank>]."""
        return {node: _decoded(tail) for node, tail in self.tails.items()}

    def rank_lines(self) -> dict[int, list[str]]:
        """Each rank's last lines, decoded."""
        return {rank: self.lines_of(rank) for rank in self.rank_tails}

    def lines_of(self, rank: int) -> list[str]:
        """One rank's last lines, decoded."""
        return [data.decode("utf-8", "replace") for data in self.rank_tails.get(rank, ())]

    def frame(self, node: str, stream: str, data: bytes, rank: str = "") -> None:
        if self.progress is not None:
            self.progress.frame(node, rank, data)
        self.heard.add(node)
        self.ranks_wrote = self.ranks_wrote or node in self.hosts
        if self.forward is not None:
            self.forward.frame(node, stream, data, rank)

    def control(self, node: str, kind: str, fields: dict) -> None:
        self.heard.add(node)
        if kind == ControlKind.STARTED and fields.get("slurm_step"):
            self.slurm_step = str(fields["slurm_step"])
        node_time = fields.get("t")
        if kind == ControlKind.HEARTBEAT and isinstance(node_time, (int, float)):
            arrived = time.time() if self.arrived is None else self.arrived
            self.clocks.note(node, float(node_time), arrived)
            self.behind[node] = arrived - self.clocks.to_head(node, float(node_time))
            if self.progress is not None:
                self.progress.heartbeat(node)
        if kind == ControlKind.RANK_END and node in self.hosts:
            end = rank_end_from_fields(node, fields, self.clocks)
            if end is not None:
                self.rank_ends.setdefault(end.rank, end)
        if kind == ControlKind.EXIT:
            failed_at = fields.get("failed_at")
            if isinstance(failed_at, (int, float)):  # in the head's time, as the others
                fields = {**fields, "failed_at": self.clocks.to_head(node, float(failed_at))}
            self.exited.append((node, fields))
        if self.forward is not None:
            self.forward.control(node, kind, fields)

    def events(self, at: float) -> list[Event]:
        """What was seen since the last call, as the verdict's events."""
        # A node's exit message comes before pdsh's note that its ssh ended: keep that order.
        events: list[Event] = [
            NodeHeard(node, at, self.behind.get(node, 0.0))
            for node in self.heard
            if node in self.hosts
        ]
        if self.ranks_wrote:
            events.append(RankOutput(at))
        wall = time.time()
        events += [NodeExited(node, fields, at, wall) for node, fields in self.exited]
        events += [SshEnded(node, code, at) for node, code in self.ssh_ended]
        self.heard.clear()
        self.ranks_wrote = False
        self.ssh_ended.clear()
        self.exited.clear()
        return events


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
        self.progress = ProgressRecorder(run.progress_file, now=time.time())
        self.tracker = _Tracker(plan.hosts, view, self.progress)
        self.verdict = JobVerdict(
            plan.hosts, self.settings, head_launcher=bool(plan.launch.head_command)
        )
        self.signal: int | None = None
        self.teardown: GroupResult[StopReport] | None = None
        self.stacks: StacksResult | None = None  # taken before a failure's teardown
        self.stacks_file: Path | None = None
        self.stacks_problem: str | None = None
        self.tails_at_failure: dict[str, tuple[str, ...]] | None = None
        self._teardown_thread: threading.Thread | None = None
        self._teardown_done = threading.Event()
        # A node whose agent has exited has written its last byte: its logs come back
        # while the rest of the job ends (the launcher's own exit takes seconds).
        self._node_logs = LogCollector(
            plan.job_id, run.node_logs, keep_remote=keep_remote_logs,
            connect_timeout=_PULL_CONNECT_S, timeout=_PULL_TIMEOUT_S,
            secrets=secret_values(plan, os.environ), transport=plan_transport(plan),
        )  # fmt: skip

    def interrupt(self, signum: int) -> None:
        self.signal = signum

    def _moment(self, kind: MomentKind, failure: Failure | None = None,
                detail: str | None = None) -> None:  # fmt: skip
        """A moment for the report's timeline (records/moments.py), on the head's clock."""
        node = (failure.node or None) if failure is not None else None
        rank = failure.rank if failure is not None else None
        append_moments(self.run_dir.path, [Moment(time.time(), kind, node, rank, detail)])

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
            self._cleanup_private()
            raise
        self._moment(MomentKind.START)
        chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        reader = threading.Thread(target=_read_into, args=(process.stdout, chunks), daemon=True)
        reader.start()
        router = LogRouter(self.run_dir.logs, view=self.tracker, nodes=self.plan.hosts)
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
            append_moments(self.run_dir.path, heard)
            self._cleanup_private()
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
        interrupted = teardown_noted = False
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
            if self.signal is not None and not interrupted:
                interrupted = True
                killed = self.run_dir.kill_marker.exists()
                events.append(Interrupted(self.signal, killed, now))
                self._moment(MomentKind.INTERRUPT, detail="orch kill" if killed else None)
            if self._teardown_done.is_set() and not teardown_noted:
                teardown_noted = True
                events.append(TeardownDone(now))
            events.append(Tick(now, read_up_to=None if chunks.empty() else arrived))
            stop = False
            for event in events:
                if isinstance(event, NodeExited):
                    self._node_logs.start(event.node)
                decision = self.verdict.feed(event)
                if decision.tear_down is not None:
                    self._begin_teardown(decision.tear_down)
                stop = stop or decision.stop_reading
            if stop:
                return

    def _pull_raw_logs(self) -> dict[str, str]:
        """Pull each node's raw logs back, whatever way the job ended."""
        # A node the teardown could not reach just now would only cost another timeout.
        gone = (StopProblem.UNREACHABLE, StopProblem.NO_ANSWER)
        unreachable = {
            r.node for r in (self.teardown or ()) if r.kind in gone
        } - self._node_logs.nodes
        for node in self.plan.hosts:
            if node not in unreachable:
                self._node_logs.start(node)  # a node already started is not started again
        outcome = {n: r.why for n, r in self._node_logs.results().items()}
        for node in unreachable:
            where = node_dir_shown(self.plan.job_id, node)
            outcome[node] = (
                f"{node}: not tried, the teardown could not reach it; its logs stay on the "
                f"node in {where}; fetch them by hand: "
                + fetch_command(node, self.plan.job_id, plan_transport(self.plan))
            )
        return {h: outcome[h] for h in self.plan.hosts}

    # -- teardown ------------------------------------------------------------------
    def _begin_teardown(self, failure: Failure) -> None:
        # The lines before the failure, not the teardown's own noise that follows it.
        self.tails_at_failure = self.tracker.node_tails()
        self.record = replace(self.record, state=JobState.STOPPING)
        self.run_dir.save(self.record)
        if failure.kind == FailureKind.HANG:
            self._moment(MomentKind.HANG, failure, failure.reason)
        self._moment(MomentKind.FIRST_FAILURE, failure, failure.reason)
        self._moment(MomentKind.TEARDOWN_START)

        def work() -> None:
            try:
                if failure.kind not in (FailureKind.SIGNAL, FailureKind.KILLED):
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
        Bounded by the settings' stacks_timeout; a node that stopped answering is skipped.
        Taking stacks is a help, never a reason to fail: nothing it meets is raised."""
        gone = (failure.node,) if failure.kind in (FailureKind.SILENT, FailureKind.LOST) else ()
        hosts = [h for h in self.plan.hosts if h not in gone]
        hung = failure.kind == FailureKind.HANG
        timeout = self.settings.hang_stacks_timeout if hung else self.settings.stacks_timeout
        try:
            reports = gather_stacks(hosts, self.plan.job_id, self.plan.python, timeout,
                                    transport=plan_transport(self.plan))  # fmt: skip
            self.stacks = analyse(self.plan.job_id, now_iso(), None, reports)
            self.stacks_file = save_stacks(self.run_dir.path, result_json(self.stacks))
        except (OrchError, OSError) as err:
            self.stacks_problem = f"stacks not taken: {err}"

    def _first_rank_end(
        self, failure: Failure, tracebacks: list[RankTraceback]
    ) -> tuple[Failure, RankOrder]:
        """The failure as the ranks' own ends tell it: the earliest failing end is the cause
        (its node, rank and exit code are the job's), the later ones that lost a peer its
        consequences. Unchanged when no rank's failing end was reported."""
        lost_peer = {found.rank for found in tracebacks if found.cascade}
        order = order_ends(list(self.tracker.rank_ends.values()), lost_peer)
        cause = order.cause
        if cause is None:
            return failure, order
        return replace(failure, node=cause.node, rank=cause.rank, exit_code=cause.exit_code,
                       reason=cause.how(), when=cause.end), order  # fmt: skip

    def _cause_lines(self, cause: RankEnd) -> tuple[str, ...]:
        """The failing rank's own last lines (its node's would show its peers' cascade)."""
        lines = self.tracker.lines_of(cause.rank)[-TAIL_LINES:]
        return tuple(f"[r{cause.rank}] {line}" for line in lines) or self._last_lines(cause.node)

    def _tracebacks(self) -> list[RankTraceback]:
        """Every rank's last traceback, read from its last lines, root cause first."""
        return rank_tracebacks(self.tracker.rank_lines(), self.tracker.traceback_at)

    @staticmethod
    def _root_cause(failure: Failure, tracebacks: list[RankTraceback]) -> RankTraceback | None:
        """The failing rank's own traceback: the earliest that is not a cascade of another
        rank's failure, or the failing rank's own. A cascade on another rank is never named
        as the cause (the failing rank may have printed none)."""
        for found in tracebacks:
            if not found.cascade or found.rank == failure.rank:
                return found
        return None

    def _head_lines(self) -> tuple[str, ...]:
        """What the fan-out itself printed (pdsh's or srun's own messages)."""
        tails = self.tracker.tails
        return _decoded((*tails.get(HEAD_NODE, ()), *tails.get("", ())))

    def _last_lines(self, node: str) -> tuple[str, ...]:
        if self.tails_at_failure is not None:
            return self.tails_at_failure.get(node, ())
        return _decoded(self.tracker.tails.get(node, ()))

    def _cleanup_private(self) -> None:
        shutil.rmtree(self.plan.job.private_dir, ignore_errors=True)

    # -- the record --------------------------------------------------------------------
    def _conclude(self, outcome: Outcome, node_logs: dict[str, str]) -> LaunchResult:
        failure = outcome.failure
        first = None
        if failure is not None and failure.kind == FailureKind.HANG:
            failure = hang_culprit(failure, self.stacks)
        if failure is not None and self.plan.job.fanout == Fanout.SRUN:
            failure = in_slurm_words(
                failure, self._head_lines(), bool(self.verdict.last_seen),
                slurm.node_problems(self.plan.hosts),
            )  # fmt: skip
        order: RankOrder | None = None
        tracebacks = self._tracebacks() if failure is not None else []
        if failure is not None and failure.kind == FailureKind.RANK:
            failure, order = self._first_rank_end(failure, tracebacks)
            outcome = replace(outcome, exit_code=failure.exit_code, failure=failure)
        elif failure is not None:
            order = after_a_fault(list(self.tracker.rank_ends.values()))
        if failure is not None:
            caused_by_a_rank = failure.kind in (FailureKind.RANK, FailureKind.LOST)
            root = self._root_cause(failure, tracebacks) if caused_by_a_rank else None
            cause = order.cause if order is not None else None
            first = FirstFailure(
                node=failure.node or "head",
                rank=failure.rank,
                exit_code=failure.exit_code,
                reason=failure.reason,
                last_lines=self._cause_lines(cause) if cause else self._last_lines(failure.node),
                kind=failure.kind,
                root_cause_rank=root.rank if root else None,
                root_cause_node=self.tracker.rank_nodes.get(root.rank) if root else None,
                root_cause=root.exception if root else None,
                traceback=root.lines if root else (),
                then=order.summary() if order is not None else None,
                hint=end_hint(cause, self.tracker.lines_of(cause.rank)) if cause else None,
            )
        self.record = finished(
            self.record,
            state=outcome.state,
            exit_code=outcome.exit_code,
            node_exit_codes=outcome.node_exit_codes,
            first_failure=first,
            node_logs=node_logs,
            teardown_stacks=(
                str(self.stacks_file.relative_to(self.run_dir.path)) if self.stacks_file else None
            ),
            slurm_step=self.tracker.slurm_step,
            ranks=rank_records(self.tracker.rank_ends.values(), order),
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
        )


def _read_into(stream, chunks: queue.Queue[tuple[float, bytes] | None]) -> None:
    """Each chunk of the fan-out's output with when it arrived: the watcher may be behind."""
    fd = stream.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.put((time.monotonic(), data))
    except OSError:
        pass
    finally:
        chunks.put(None)
