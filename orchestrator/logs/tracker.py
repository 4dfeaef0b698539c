"""What the head keeps of the job's output as the log router feeds it, and the events it
turns that into for the job's verdict (outcome/verdict.py).

`OutputTracker` is the router's view (logs/router.py's LogView): it notes which nodes were
heard from since it was last asked, pdsh's reports of ended ssh connections, each node's
exit message, each rank's end as its keeper reported it (on the head's clock), and the last
lines of every node and of every rank (a failing rank's traceback is read from its own).

It sees every line of the job, so it keeps them as they came (bytes) and decodes only what
is read: a few lines when a job fails. It starts nothing and reaches no node: it reads
what the router hands it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from orchestrator.logs.progress import ProgressRecorder
from orchestrator.logs.router import LogView
from orchestrator.nodes.pdsh import is_pdsh_own, ssh_exit_of
from orchestrator.outcome.events import (
    Event,
    NodeExited,
    NodeHeard,
    RankOutput,
    SshEnded,
    StopAsked,
)
from orchestrator.outcome.explanation import TAIL_LINES, KeptOutput
from orchestrator.outcome.rank_ends import ClockOffsets, RankEnd, rank_end_from_fields
from orchestrator.outcome.rootcause import TRACEBACK_HEADER
from orchestrator.outcome.states import StopCause
from orchestrator.records.job import HEAD_NODE
from orchestrator.remote.logwire import ControlKind, global_rank

RANK_TAIL_LINES = 300  # a rank's own last lines: enough for its last traceback

_TRACEBACK_BYTES = TRACEBACK_HEADER.encode()
_NOT_A_RANK: tuple[int, deque[bytes]] = (-1, deque())  # a label logwire did not write


def _decoded(tail: Iterable[tuple[int | None, bytes]]) -> tuple[str, ...]:
    return tuple(
        text if rank is None else f"[r{rank}] {text}"
        for rank, data in tail
        for text in (data.decode("utf-8", "replace"),)
    )


class OutputTracker:
    """A LogView that notes which nodes were heard from since it was last asked, pdsh's
    reports of ended ssh connections, each node's exit message and its last lines."""

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
        self.slurm_signalled = False  # a node's step got Slurm's SIGTERM: the job stops
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

    def head_lines(self) -> tuple[str, ...]:
        """What the fan-out itself printed (pdsh's or srun's own messages)."""
        return _decoded((*self.tails.get(HEAD_NODE, ()), *self.tails.get("", ())))

    def rank_lines(self) -> dict[int, list[str]]:
        """Each rank's last lines, decoded."""
        return {rank: self.lines_of(rank) for rank in self.rank_tails}

    def lines_of(self, rank: int) -> list[str]:
        """One rank's last lines, decoded."""
        return [data.decode("utf-8", "replace") for data in self.rank_tails.get(rank, ())]

    def kept(self, node_lines: dict[str, tuple[str, ...]] | None = None) -> KeptOutput:
        """What it kept, as values for the failure's explanation; `node_lines`: each node's
        last lines as they were when the failure was seen (None: as they are now)."""
        return KeptOutput(
            node_lines=self.node_tails() if node_lines is None else node_lines,
            rank_lines=self.rank_lines(),
            traceback_at=dict(self.traceback_at),
            rank_nodes=dict(self.rank_nodes),
            rank_ends=tuple(self.rank_ends.values()),
        )

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
        if kind == ControlKind.SIGNALLED and node in self.hosts:
            self.slurm_signalled = True
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
            stepping = self.progress is not None and bool(self.progress.steps)
            events.append(RankOutput(at, stepping))
        wall = time.time()
        events += [NodeExited(node, fields, at, wall) for node, fields in self.exited]
        events += [SshEnded(node, code, at) for node, code in self.ssh_ended]
        if self.slurm_signalled:  # a preemption or `scancel`: the same stop as the head's own
            events.append(StopAsked(StopCause.SLURM_SIGNAL, at))
            self.slurm_signalled = False
        self.heard.clear()
        self.ranks_wrote = False
        self.ssh_ended.clear()
        self.exited.clear()
        return events
