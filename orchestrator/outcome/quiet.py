"""A quiet job judged from a look at its ranks: working, or hung. Pure.

Silence alone is not a hang: an evaluation that prints nothing, a checkpoint being saved,
data being prepared or a first step being compiled are quiet and busy. A look
(remote/look.py) gives, for each rank, the CPU time and storage I/O of its process tree
over a few seconds, its process state and its stack at both ends. A rank is

- working: it wrote or read storage, or it used the CPU outside a wait in a collective;
- waiting: in a collective, a barrier or the store (torch.distributed, DeepSpeed's comm):
  it may spin the CPU there, so there the frame decides, not the CPU;
- stopped: its process is stopped (a SIGSTOP, a debugger);
- idle: none of these: no CPU, no I/O, somewhere else (a loader that never yields).

The job hangs when no rank is working. Which rank the others wait for is told by its
stack standing apart (outcome/verdict.py hang_culprit), or here by being the only rank
stopped or idle while the others wait.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.specs.words import StrEnum
from orchestrator.stacks.fold import kept_threads, user_frame
from orchestrator.stacks.model import Frame, RankStacks, short_path

# A rank using at least this share of one core outside a wait is computing. A rank that
# only waits uses next to none; a computing rank on a crowded node still gets more.
BUSY_SHARE = 0.05
# Where a rank's innermost frame is when it waits for the others.
_WAIT_PLACES = ("torch/distributed/", "deepspeed/comm/", "colossalai/cluster/")
_IMPORTING = "<frozen importlib._bootstrap"  # py-spy's file name of the import machinery


class Activity(StrEnum):
    WORKING = "working"
    WAITING = "waiting"
    STOPPED = "stopped"
    IDLE = "idle"


@dataclass(frozen=True)
class RankSample:
    """What a look read of one rank: over `seconds`, its tree's CPU seconds and storage
    bytes (None: unreadable), its process state at the end, and its stacks at both ends
    (None: not taken)."""

    rank: int
    node: str
    seconds: float
    cpu: float | None
    io: int | None
    state: str | None
    stacks: tuple[RankStacks | None, RankStacks | None] = (None, None)


@dataclass(frozen=True)
class RankFinding:
    rank: int
    node: str
    activity: Activity
    where: Frame | None  # its innermost frame of interest, from the last stack taken
    why: str  # "computing", "writing", "in all_reduce", "stopped (state T)", ...


@dataclass(frozen=True)
class LauncherSample:
    """A node where no rank runs: what the job's other processes there (the launcher, still
    importing torch on a crowded node before it starts a rank) did over `seconds`."""

    node: str
    seconds: float
    cpu: float | None
    io: int | None
    processes: int

    @property
    def working(self) -> bool:
        return bool(self.io) or _busy(self.cpu, self.seconds)

    def said(self) -> str:
        doing = "reading or writing storage" if self.io else "computing"
        return f"{self.node}: no rank yet, its launcher {doing}"


def _busy(cpu: float | None, seconds: float) -> bool:
    return cpu is not None and cpu >= BUSY_SHARE * max(seconds, 0.001)


@dataclass(frozen=True)
class QuietFinding:
    """A look at a quiet job. `problem`: why some or all of it could not be read;
    `launchers`: the nodes where no rank ran, with what their launcher did."""

    ranks: tuple[RankFinding, ...]
    seconds: float = 0.0
    problem: str | None = None
    launchers: tuple[LauncherSample, ...] = ()

    @property
    def working(self) -> bool:
        return any(rank.activity == Activity.WORKING for rank in self.ranks) or any(
            launcher.working for launcher in self.launchers
        )

    @property
    def culprits(self) -> tuple[RankFinding, ...]:
        """The ranks stopped, else those idle in their own code, while the others wait: those
        the others wait for. None when no rank waits (every rank idle: nothing tells them
        apart)."""
        waiting = [r for r in self.ranks if r.activity == Activity.WAITING]
        stopped = [r for r in self.ranks if r.activity == Activity.STOPPED]
        # An idle rank counts where its stack was read: one unread may be waiting too.
        idle = [r for r in self.ranks if r.activity == Activity.IDLE and r.where is not None]
        apart = stopped or idle
        return tuple(apart) if waiting and apart else ()

    def summary(self) -> str:
        """One line: each rank not waiting on its own, the waiting ones counted by place
        (`rank 0 computing in evaluate (train.py:88); 5 ranks in barrier`)."""
        parts = [_said(r) for r in self.ranks if r.activity != Activity.WAITING]
        parts += [launcher.said() for launcher in self.launchers if launcher.working]
        places = Counter(r.why for r in self.ranks if r.activity == Activity.WAITING)
        for why, count in places.most_common():
            parts.append(f"{count} rank{'s' if count > 1 else ''} {why}")
        if self.problem:
            parts.append(self.problem)
        return "; ".join(parts) or "no rank found"


def _said(rank: RankFinding) -> str:
    said = f"rank {rank.rank} {rank.why}"
    where = rank.where
    if where is None:
        return said
    return f"{said} in {where.function} ({short_path(where.file)}:{where.line})"


def judge(samples: Sequence[RankSample], problem: str | None = None,
          launchers: Sequence[LauncherSample] = ()) -> QuietFinding:  # fmt: skip
    seconds = max((sample.seconds for sample in (*samples, *launchers)), default=0.0)
    ranks = tuple(judge_rank(sample) for sample in sorted(samples, key=lambda s: s.rank))
    return QuietFinding(ranks, seconds, problem, tuple(launchers))


def judge_rank(sample: RankSample) -> RankFinding:
    last = sample.stacks[1] or sample.stacks[0]
    waits_at = _wait_frame(last)

    def found(activity: Activity, why: str, where: Frame | None) -> RankFinding:
        return RankFinding(sample.rank, sample.node, activity, where, why)

    if sample.state in ("T", "t"):
        return found(Activity.STOPPED, f"stopped (state {sample.state})", _user_frame(last))
    if sample.io:
        return found(Activity.WORKING, "reading or writing storage", _user_frame(last))
    busy = _busy(sample.cpu, sample.seconds)
    if waits_at is not None:
        return found(Activity.WAITING, f"in {waits_at.function}", None)
    if busy:
        return found(Activity.WORKING, "computing", _user_frame(last))
    return found(Activity.IDLE, _idle_why(sample), _user_frame(last))


def _idle_why(sample: RankSample) -> str:
    first, last = sample.stacks
    if first is None or last is None or not first.ok or not last.ok:
        return "idle"
    same = _main_frames(first) == _main_frames(last)
    return "idle, stuck" if same else "idle"


def _main_frames(rank: RankStacks) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(frame.key for frame in thread.frames) for thread in kept_threads(rank))


def _user_frame(rank: RankStacks | None) -> Frame | None:
    return user_frame(rank) if rank is not None and rank.ok else None


def _wait_frame(rank: RankStacks | None) -> Frame | None:
    """The main thread's innermost frame when it is a wait for the other ranks."""
    if rank is None or not rank.ok:
        return None
    main = next((thread for thread in rank.threads if thread.main), None)
    if main is None or not main.frames:
        return None
    innermost = main.frames[0]
    if innermost.function == "<module>" or any(_IMPORTING in f.file for f in main.frames):
        return None  # a module of torch.distributed being imported: busy, not waiting
    return innermost if any(place in innermost.file for place in _WAIT_PLACES) else None
