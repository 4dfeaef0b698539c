"""Stopping a job so its ranks can save: the stop signal to every rank on every node at
once (remote/rank_stop.py, through orch's own node commands: the fan-out's stdin does not
reach the agents), what each node said of it, and the stop as the runner carries it out
(`Stop`: begun once, its grace counted on the head, its summary at the end). And `orch
stop`'s protocol (`request_stop`): the head is told through the run directory, and waited
for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

from orchestrator.errors import OrchError
from orchestrator.logs.router import LogView
from orchestrator.logs.tracker import OutputTracker
from orchestrator.logs.view import LiveView, PlainView
from orchestrator.nodes.transport import SLURM, NodeTransport, plan_transport
from orchestrator.outcome.rank_ends import ClockOffsets, RankEnd
from orchestrator.outcome.states import JobState, StopCause
from orchestrator.outcome.stop import (
    GraceInForce,
    StopEnding,
    StopSummary,
    stop_summary,
    stopping_text,
)
from orchestrator.pernode import GroupResult, NodeResult, failed, succeeded
from orchestrator.plan.agent_command import stop_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.records.job import ENV_FILE, FINAL_STATES, STOP_MARKER, JobRecord, head_alive
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import RunDir
from orchestrator.remote.procs import SLURM_NODE
from orchestrator.specs.constants import STOP_GRACE_VAR
from orchestrator.specs.stop import DEFAULT_STOP_GRACE_S, StopSettings

_CONNECT_S, _ANSWER_S = 10.0, 20.0  # reaching a node, and its answer: a stop is quick


@dataclass(frozen=True)
class RanksSignalled:
    """What a node's stop program did: (rank, pid, when on the node's clock) of each rank
    it sent the stop signal to."""

    ranks: tuple[tuple[int, int, float], ...]


def node_answer(node: str, stdout: bytes, exit_code: int) -> NodeResult[RanksSignalled]:
    """A node's stop program's JSON line, as a result."""
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "signalled" in doc:
            ranks = tuple((int(r["rank"]), int(r["pid"]), float(r["at"]))
                          for r in doc["signalled"])  # fmt: skip
            return succeeded(node, RanksSignalled(ranks))
        if isinstance(doc, dict) and "error" in doc:
            return failed(node, f"{node}: {doc['error']}", "the grace's end tears it down")
    return failed(node, f"{node}: the stop program failed (exit {exit_code})",
                  "the grace's end tears it down")  # fmt: skip


def signal_ranks(hosts: Sequence[str], job_id: str, python: str, stop: StopSettings,
                 transport: NodeTransport) -> GroupResult[RanksSignalled]:  # fmt: skip
    """The stop signal to every rank of the job, on every host at once; one result each."""
    if transport.kind == SLURM:
        command: str | Callable[[str], str] = stop_command(python, job_id, SLURM_NODE,
                                                           stop.signum, stop.grace)
    else:
        def command(node: str) -> str:
            return stop_command(python, job_id, node, stop.signum, stop.grace)

    answers = transport.run(list(hosts), command, timeout=_ANSWER_S, connect_timeout=_CONNECT_S)
    return GroupResult(tuple(
        node_answer(a.node, a.value.stdout, a.value.exit_code) if a.value is not None
        else failed(a.node, a.problem or f"{a.node}: no answer", "the grace's end tears it down")
        for a in answers
    ))  # fmt: skip


class Stop:
    """A stop as the runner carries it out: begun once (the signal sent from a thread of
    its own, the watch goes on), its ranks counted as they exit, its summary at the end."""

    def __init__(self, cause: StopCause, settings: StopSettings, world_size: int) -> None:
        self.cause = cause
        self.settings = settings
        self.world_size = world_size
        self.asked_at = time.time()
        self._started = time.monotonic()
        self.sent: GroupResult[RanksSignalled] | None = None
        self.torn_down_at: float | None = None
        self.cut_short = False
        self._shown: tuple[int, float] | None = None  # (exited ranks, grace) last printed
        self._thread: threading.Thread | None = None

    def begin(self, send: Callable[[], GroupResult[RanksSignalled]]) -> None:
        def work() -> None:
            self.sent = send()

        self._thread = threading.Thread(target=work, daemon=True)
        self._thread.start()

    def torn_down(self, *, grace_over: bool) -> None:
        """The job is being torn down: what still runs is killed."""
        if self.torn_down_at is None:
            self.torn_down_at = time.time()
            self.cut_short = not grace_over

    def status(self, exited: int, grace: float) -> str:
        return stopping_text(self.cause, exited, self.world_size,
                             time.monotonic() - self._started, grace)  # fmt: skip

    def show(self, view: LogView | None, exited: int, grace: float) -> None:
        """The live view says the job is stopping, and how many ranks have exited within
        which grace (plain lines: once more each time either changes)."""
        if isinstance(view, LiveView):
            view.status(self.status(exited, grace))
        elif isinstance(view, PlainView) and (exited, grace) != self._shown:
            self._shown = (exited, grace)
            view.status(self.status(exited, grace))

    def summary(self, tracker: OutputTracker, grace: GraceInForce | None = None) -> StopSummary:
        """What came of the stop: the ranks' ends and each node's clock as the tracker has
        them; `grace`: the grace in force, when not the one asked for (None: it is)."""
        return self.summary_of(tracker.rank_ends.values(), tracker.clocks, grace)

    def summary_of(self, ends: Collection[RankEnd], clocks: ClockOffsets,
                   grace: GraceInForce | None = None) -> StopSummary:  # fmt: skip
        if self._thread is not None:
            self._thread.join(_CONNECT_S + _ANSWER_S)
        signalled: dict[int, tuple[str, float]] = {}
        unreached: dict[str, str] = {}
        for answer in self.sent or ():
            if answer.value is None:
                unreached[answer.node] = answer.problem or answer.why
                continue
            for rank, _pid, at in answer.value.ranks:
                signalled[rank] = (answer.node, round(clocks.to_head(answer.node, at), 4))
        ending = (StopEnding.RANKS_EXITED if self.torn_down_at is None
                  else StopEnding.CUT_SHORT if self.cut_short else StopEnding.GRACE_OVER)
        settings = self.settings if grace is None else replace(self.settings,
                                                               grace=grace.seconds)
        return stop_summary(self.cause, self.asked_at, settings, ending=ending,
                            cut=grace.cut if grace is not None else "",
                            torn_down_at=self.torn_down_at, world_size=self.world_size,
                            ends=ends, signalled=signalled, unreached=unreached)  # fmt: skip


def begin_stop(plan: LaunchPlan, cause: StopCause) -> Stop:
    """A stop of the plan's job begun: every rank gets the stop signal, at once, on every
    node, from a thread of its own."""
    stop = Stop(cause, plan.job.stop, plan.world_size)
    stop.begin(lambda: signal_ranks(plan.hosts, plan.job_id, plan.python, plan.job.stop,
                                    plan_transport(plan)))  # fmt: skip
    return stop


# ----- `orch stop` ------------------------------------------------------------------------
@dataclass(frozen=True)
class StopRequested:
    record: JobRecord  # as it stands once the head is done (or no longer waited for)
    ended: bool  # the job ended while `orch stop` waited


_WAIT_BEYOND_GRACE_S = 60.0  # the teardown and the raw logs, after the grace


def job_grace(run: RunDir) -> float:
    """The job's stop grace, as its environment (env.json) holds it; the default where that
    cannot be read."""
    try:
        env = json.loads((run.path / ENV_FILE).read_text())
        return float(env[STOP_GRACE_VAR])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_STOP_GRACE_S


def request_stop(run: RunDir, *, say: Callable[[str], None]) -> StopRequested:
    """`orch stop`: ask the job's head (through the stop marker in its run directory) to stop
    the job as its first Ctrl-C would, and wait for it to end (its grace and a minute). A
    job whose head is gone, or that has ended, is refused: there is nothing left to save."""
    check_runs_root(run.path.parent)
    check_job(run)
    record = run.load()
    batch = record.slurm_batch and record.slurm_job_id is not None
    if record.state in FINAL_STATES:
        raise OrchError(f"job {record.id} has ended ({record.state}): nothing to stop")
    if record.state == JobState.QUEUED or not (head_alive(record) or batch):
        raise OrchError(
            f"job {record.id} has no head running it: nothing to stop and save",
            f"`orch kill {record.id}` ends whatever may be left of it on its nodes",
        )
    grace = job_grace(run)
    run.touch(STOP_MARKER)
    say(f"job {record.id}: stop requested; its ranks get the stop signal and up to "
        f"{grace:g} s to save and exit")  # fmt: skip
    deadline = time.monotonic() + grace + _WAIT_BEYOND_GRACE_S
    while time.monotonic() < deadline:
        record = run.load()
        if record.state in FINAL_STATES or not (head_alive(record) or batch):
            return StopRequested(record, record.state in FINAL_STATES)
        time.sleep(0.5)
    return StopRequested(run.load(), False)
