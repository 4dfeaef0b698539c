"""Every rank's end, in one time: which rank failed first, and which failed because of it.

Each rank's keeper (remote/rank.py) reports its rank's end the moment it happens: when, with
which exit code or signal, whether the launcher asked for it (a signal the keeper passed
on). The agents' clocks are put on the head's (ClockOffsets, from the node time every
heartbeat carries), so ends on different nodes compare. Then:

- the root cause is the earliest end that is a failure;
- ranks that fail after it with the signs of a lost peer (a traceback of a dead peer or an
  aborted collective, a signal from the teardown) are its consequences;
- the job's exit code is the cause's own (128 + N for signal N).

Clocks of different machines agree only so far, and a keeper wakes a little after its
rank ends (on a loaded node, most of a second): an earliest end that shows the signs of a
lost peer gives way to a failure without them that ended within `tie_s` after it, or else
to a rank killed by a signal no launcher sent, over one whose traceback says a peer went
away. Pure: values in, values out.
"""

from __future__ import annotations

import re
import signal
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.specs.units import format_bytes
from orchestrator.specs.words import StrEnum

TIE_S = 1.0  # ends this close are within what two clocks and a wake-up can disagree by
# Heartbeats a node's clock offset is the smallest of: about 30 s at remote/channel.py's one
# every 2 s; long enough to meet a message that waited on nothing, short enough to follow a
# clock that steps or drifts.
CLOCK_WINDOW = 15
# Signals a launcher's teardown sends (DeepSpeed's and torchrun's TERM then KILL, Ctrl-C).
TEARDOWN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})


class Role(StrEnum):
    """A rank's part in the job's end, as job.json keeps it."""

    CAUSE = "cause"
    CONSEQUENCE = "consequence"  # failed after the cause, with the signs of a lost peer
    FAILED = "failed"  # failed after the cause, without those signs
    SUCCEEDED = "succeeded"


@dataclass(frozen=True)
class RankEnd:
    """One rank's end, its times on the head's clock (seconds since the epoch)."""

    node: str
    rank: int
    end: float
    code: int | None  # the exit code; negative: the signal that killed it; None: unseen
    local_rank: int | None = None
    pid: int | None = None
    start: float | None = None
    forwarded: tuple[int, ...] = ()  # signals the launcher sent, passed on by the keeper
    maxrss_kb: int | None = None  # the rank's peak resident memory
    oom_kill: bool | None = None  # the kernel's OOM killer ended it (where readable)
    exact: bool = True  # reported by its keeper; False: seen late by the node's scan

    @property
    def failed(self) -> bool:
        return self.code != 0

    @property
    def signal(self) -> int | None:
        return -self.code if self.code is not None and self.code < 0 else None

    @property
    def exit_code(self) -> int:
        """As a shell reports it: the code, or 128 + the signal; 1 when unseen."""
        if self.code is None:
            return 1
        return 128 - self.code if self.code < 0 else self.code

    def how(self) -> str:
        if self.code is None:
            return "ended (its exit code was not seen)"
        if self.signal == signal.SIGKILL and self.oom_kill:
            return "killed by the OOM killer (SIGKILL)" + _peak(self.maxrss_kb)
        return ended_by(self.code)


@dataclass(frozen=True)
class RankOrder:
    cause: RankEnd | None
    consequences: tuple[RankEnd, ...] = ()
    roles: Mapping[int, Role] = field(default_factory=dict)

    def summary(self) -> str | None:
        """'then 3 ranks failed after losing rank 3'; None when none did."""
        if self.cause is None or not self.consequences:
            return None
        count = len(self.consequences)
        ranks = "rank" if count == 1 else "ranks"
        return f"then {count} {ranks} failed after losing rank {self.cause.rank}"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def ended_by(code: int) -> str:
    """How a process ended, from its code: `exited with code 3`, or, negative (Python's
    convention; a shell's 128 + N), the signal that killed it: `killed by SIGSEGV`."""
    return f"exited with code {code}" if code >= 0 else f"killed by {signal_name(-code)}"


def _peak(maxrss_kb: int | None) -> str:
    if not maxrss_kb:
        return ""
    return f", peak memory {format_bytes(maxrss_kb * 1024)}"


# ----- clocks ----------------------------------------------------------------------------
class ClockOffsets:
    """Each node's clock against the head's. A message stamped `node_time` by the node
    arrives at `head_time`: head - node is the offset plus the message's delay, so the
    smallest seen is the closest to the offset itself. The smallest of the last `window`
    heartbeats, not of all time: a clock that NTP steps back (or that drifts) is followed
    once the heartbeats from before the step have left the window."""

    def __init__(self, window: int = CLOCK_WINDOW) -> None:
        self.window = max(window, 1)
        self.offsets: dict[str, float] = {}  # each node's offset: the window's smallest
        self._seen: dict[str, deque[float]] = {}

    def note(self, node: str, node_time: float, head_time: float) -> None:
        seen = self._seen.get(node)
        if seen is None:
            seen = self._seen[node] = deque(maxlen=self.window)
        seen.append(head_time - node_time)
        self.offsets[node] = min(seen)

    def to_head(self, node: str, node_time: float) -> float:
        return node_time + self.offsets.get(node, 0.0)


def rank_end_from_fields(node: str, fields: Mapping[str, object], clocks: ClockOffsets) -> (
    RankEnd | None
):
    """A `rank_end` control message as a RankEnd on the head's clock; None if malformed."""
    try:
        rank = int(fields["rank"])  # type: ignore[call-overload]
        end = float(fields["end"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError):
        return None
    code, start = fields.get("code"), fields.get("start")
    return RankEnd(
        node=node,
        rank=rank,
        end=clocks.to_head(node, end),
        code=code if isinstance(code, int) else None,
        local_rank=_int_or_none(fields.get("local_rank")),
        pid=_int_or_none(fields.get("pid")),
        start=clocks.to_head(node, float(start)) if isinstance(start, (int, float)) else None,
        forwarded=tuple(int(s) for s in fields.get("forwarded") or () if isinstance(s, int)),  # type: ignore[union-attr]
        maxrss_kb=_int_or_none(fields.get("maxrss_kb")),
        oom_kill=fields.get("oom_kill") if isinstance(fields.get("oom_kill"), bool) else None,  # type: ignore[arg-type]
        exact=fields.get("seen") != "scan",
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ----- cause and consequence -------------------------------------------------------------
def lost_a_peer(end: RankEnd, lost_peer: Collection[int]) -> bool:
    """Whether a failed end shows the signs of another rank's failure: its traceback says a
    peer or the collective went away (`lost_peer`, read from its output), or it was
    stopped by a teardown's signal."""
    if end.rank in lost_peer or end.forwarded:
        return True
    return end.signal in TEARDOWN_SIGNALS and not end.oom_kill


def order_ends(
    ends: Sequence[RankEnd], lost_peer: Collection[int] = (), tie_s: float = TIE_S
) -> RankOrder:
    """The root cause among the ranks' ends, its consequences, and every rank's role."""
    failed = sorted((e for e in ends if e.failed), key=lambda e: (e.end, not e.exact, e.rank))
    if not failed:
        return RankOrder(None, roles={e.rank: Role.SUCCEEDED for e in ends})
    cause = failed[0]
    if lost_a_peer(cause, lost_peer):
        near = [e for e in failed if e.end - cause.end <= tie_s]
        own = [e for e in near if not lost_a_peer(e, lost_peer)]
        # Next best: a rank killed by a signal nobody passed on (from outside, or a
        # teardown's) over one whose own output says a peer went away.
        killed = [e for e in near if e.rank not in lost_peer and not e.forwarded]
        cause = (own or killed or [cause])[0]
    consequences = tuple(e for e in failed if e is not cause and lost_a_peer(e, lost_peer))
    roles = {e.rank: Role.SUCCEEDED for e in ends if not e.failed}
    roles |= {e.rank: Role.FAILED for e in failed}
    roles |= {e.rank: Role.CONSEQUENCE for e in consequences}
    roles[cause.rank] = Role.CAUSE
    return RankOrder(cause, consequences, roles)


def after_a_fault(ends: Sequence[RankEnd]) -> RankOrder:
    """The roles when the job's cause is no rank (a node lost or silent, a hang, an
    interrupt): every rank that failed did so because of it."""
    failed = tuple(sorted((e for e in ends if e.failed), key=lambda e: e.end))
    roles = {e.rank: Role.SUCCEEDED for e in ends if not e.failed}
    return RankOrder(None, failed, roles | {e.rank: Role.CONSEQUENCE for e in failed})


# ----- hints for ends that look like failures but are not the script's logic --------------
_TERMINATE = "terminate called without an active exception"
_FATAL = re.compile(r"Fatal Python error: (Segmentation fault|Bus error|Aborted)")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


def _fatal_report(lines: Sequence[str]) -> list[str] | None:
    """faulthandler's last report in `lines`, from its `Fatal Python error: ...` on."""
    texts = [_RANK_PREFIX.sub("", line) for line in lines]
    starts = [i for i, text in enumerate(texts) if _FATAL.search(text)]
    return texts[starts[-1] :] if starts else None


def last_python_frame(lines: Sequence[str]) -> str | None:
    """Where faulthandler says the rank's current thread stood when a fatal signal hit:
    the first frame after `Fatal Python error: ...` (most recent call first)."""
    for text in _fatal_report(lines) or ():
        found = _FRAME.match(text)
        if found:
            return f"{found.group(1)}:{found.group(2)} in {found.group(3)}"
    return None


def _exiting(lines: Sequence[str]) -> bool:
    """Whether faulthandler's report of an abort shows no Python frame: the interpreter
    was past the script, exiting."""
    report = _fatal_report(lines) or ()
    return any(t.strip() == "<no Python frame>" for t in report) and not any(
        _FRAME.match(t) for t in report
    )


def end_hint(end: RankEnd, lines: Sequence[str]) -> str | None:
    """What an end that is not the script's own error means, from its signal and its last
    lines; None when there is nothing to add."""
    sig = end.signal
    if sig == signal.SIGABRT and any(_TERMINATE in line for line in lines):
        if _exiting(lines):
            # A gloo or NCCL thread dropped its last collective's tensors while Python
            # exited, and could not take the GIL back: torch's race, after destroy too.
            return (
                "aborted as Python exited: a torch thread (gloo or NCCL) still held a "
                "collective's work; call torch.distributed.destroy_process_group() at the "
                "end of the script, and if it does, end with os._exit(code) after it"
            )
        frame = last_python_frame(lines)
        if frame is not None:
            return f"a C++ thread ended the rank (std::terminate) while it ran {frame}"
        return (
            "torch's process group was still alive at interpreter exit: call "
            "torch.distributed.destroy_process_group() at the end of the script"
        )
    if sig == signal.SIGKILL and end.oom_kill:
        return "the node ran out of memory: lower the batch size or the ranks per node"
    if sig in (signal.SIGSEGV, signal.SIGBUS):
        frame = last_python_frame(lines)
        where = f" at {frame}" if frame else " (no Python frame was printed)"
        return f"{signal_name(sig)} in native code{where}"
    return None
