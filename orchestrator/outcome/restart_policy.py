"""Whether a failed attempt is worth another, and on which nodes. Pure: values in, values out.

The facts are the ones the job's verdict already has (outcome/verdict.py's failure kind, the
first failing rank and how it ended, outcome/rank_ends.py; its root-cause traceback,
outcome/rootcause.py) plus the nodes that did not answer a short re-check after the
teardown. They fall in one of these classes:

- `node-lost`: a node stopped answering, lost its ssh connection, or did not answer the
  re-check. Whatever the ranks on the other nodes then reported (a peer gone from a
  collective) follows from it and is not a cause of its own. The node is dropped.
- `hang`: no rank wrote anything for --hang-timeout.
- `signal`: a rank was killed by a signal its launcher did not send (SIGKILL, the OOM
  killer among them; SIGSEGV, SIGBUS, SIGABRT from a library).
- `transient`: a traceback the field knows as a passing fault: NCCL's remote or system
  errors and aborted communicators, DistBackendError, gloo's connection closed or reset by
  the peer, the c10d store's timeouts, CUDA's uncorrectable ECC error (its node is
  dropped: the GPU is at fault).
- `script`: the script's own error: any other exception, an exit code it chose, a usage
  error. Restarted only with `--restart-on any`.
- `stopped`: interrupted on the head or `orch kill`: never restarted.

The same root cause at the same file and line on two attempts in a row ends the job
whatever the policy, when the second attempt got no further than the first: an error that
comes back at the same place at once is not a passing fault. One that comes back after the
job went on (its ranks reached a later step, or it ran LONG_ATTEMPT_S) is: NCCL's and gloo's
faults all stand at torch's own line, whichever node or link failed. A fatal signal at the
same Python frame is judged alike.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from orchestrator.outcome.states import REMOTE_COMMAND_FAILED, FailureKind
from orchestrator.specs.words import StrEnum

# The pause before attempt k + 1 grows with k, up to a bound: a fault that needs a moment
# to clear (a port in TIME_WAIT, a node's memory being freed) gets it.
PAUSE_STEP_S = 2.0
PAUSE_MAX_S = 30.0
# An attempt that ran this long before its fault came back at the same place is no crash
# loop: the fault took a good while to come back, as a passing one does.
LONG_ATTEMPT_S = 600.0

_RESTARTABLE_SIGNALS = frozenset(
    {signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGTERM}
)
# Tracebacks of passing faults (lower case), read from the exception and its chain.
_TRANSIENT = re.compile(
    r"ncclremoteerror|ncclsystemerror|ncclinternalerror"
    r"|nccl communicator was aborted|communicator was aborted"
    r"|distbackenderror|distnetworkerror"
    r"|connection closed by (?:remote )?peer|connection reset by peer"
    r"|diststoreerror|store timeout|timed out after \d+ seconds waiting for clients"
    r"|wait timeout after \d+ms|socket timeout"
    r"|uncorrectable ecc error"
)
_ECC = re.compile(r"uncorrectable ecc error")
# `File "x.py", line 12, in f` (a traceback) or `File "x.py", line 12 in f` (faulthandler).
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_HINT_FRAME = re.compile(r" at (\S+:\d+) in ")  # rank_ends.end_hint's "... at x.py:12 in f"


class FailureClass(StrEnum):
    NODE_LOST = "node-lost"
    HANG = "hang"
    SIGNAL = "signal"
    TRANSIENT = "transient"
    SCRIPT = "script"
    STOPPED = "stopped"


INFRA = frozenset({FailureClass.NODE_LOST, FailureClass.HANG, FailureClass.SIGNAL,
                   FailureClass.TRANSIENT})  # fmt: skip


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0  # 0: one attempt, as without recovery
    restart_on: str = "infra"  # plan/request.py RESTART_ON: infra, or any but a stop


@dataclass(frozen=True)
class AttemptFailure:
    """What the verdict found of a failed attempt, and the re-check after it."""

    kind: FailureKind
    node: str  # "" or "head" for the head itself
    rank: int | None
    exit_code: int
    reason: str
    signal: str | None = None  # the failing rank's signal, by name (SIGKILL)
    oom_kill: bool = False
    exception: str | None = None  # the root cause's exception line
    traceback: tuple[str, ...] = ()  # the root cause's traceback block
    unreachable: tuple[str, ...] = ()  # nodes that did not answer the re-check
    hint: str | None = None  # what a fatal signal's end means ("SIGSEGV ... at x.py:12 in f")


@dataclass(frozen=True)
class AttemptProgress:
    """How far an attempt got: the furthest step any of its ranks showed (a progress bar's
    count or a `step N` line, logs/progress.py; None: none showed one) and how long it ran."""

    furthest_step: int | None = None
    duration_s: float = 0.0


def attempt_progress(steps: Mapping[int, int], started: float | None,
                     ended: float) -> AttemptProgress:  # fmt: skip
    """How far an attempt got: the furthest step any rank showed (`steps`, each rank's, as
    the progress recorder kept them) and how long it ran, from its start to its first
    failure (or its end), on the head's monotonic clock; never started: 0 s."""
    duration = max(0.0, ended - started) if started is not None else 0.0
    return AttemptProgress(max(steps.values(), default=None), duration)


NO_PROGRESS = AttemptProgress()


@dataclass(frozen=True)
class Cause:
    """A failed attempt's class, said in words naming the node and rank, the nodes at fault,
    and where it stood (exception type and file:line), when a traceback or frame says."""

    failure_class: FailureClass
    message: str
    at_fault: tuple[str, ...] = ()
    where: tuple[str, str] | None = None  # ("ValueError", "train.py:12")


@dataclass(frozen=True)
class RestartDecision:
    cause: Cause
    restart: bool
    why: str  # in words: the class, and why it did or did not restart


def _who(failure: AttemptFailure) -> str:
    node = failure.node if failure.node and failure.node != "head" else "the head"
    return node if failure.rank is None else f"{node} rank {failure.rank}"


def _signal_number(name: str | None) -> int | None:
    try:
        return int(signal.Signals[name]) if name else None
    except KeyError:
        return None


def _last_frame(lines: Sequence[str]) -> str | None:
    """The innermost frame of a traceback: the last `File "...", line N` in it."""
    found = [m for line in lines if (m := _FRAME.search(line))]
    if not found:
        return None
    return f"{found[-1].group(1)}:{found[-1].group(2)}"


def _where(failure: AttemptFailure) -> tuple[str, str] | None:
    """What failed and where: the exception's type (or the signal) and its innermost frame."""
    frame = _last_frame(failure.traceback)
    if frame is None and failure.hint and (found := _HINT_FRAME.search(failure.hint)):
        frame = found.group(1)
    if frame is None:
        return None
    if failure.exception:
        return failure.exception.split(":", 1)[0].strip().rsplit(".", 1)[-1], frame
    return failure.signal or f"exit code {failure.exit_code}", frame


def classify(failure: AttemptFailure) -> Cause:
    """The class of a failed attempt, from its facts."""
    who = _who(failure)
    if failure.kind in (FailureKind.SIGNAL, FailureKind.KILLED):
        return Cause(FailureClass.STOPPED, f"{failure.reason} on the head")
    if failure.kind == FailureKind.STOPPED:  # asked to stop: never restarted
        return Cause(FailureClass.STOPPED, failure.reason)
    lost = tuple(failure.unreachable)
    if failure.kind in (FailureKind.SILENT, FailureKind.LOST) and failure.node:
        lost = tuple(dict.fromkeys((failure.node, *lost)))
    never_ran = failure.reason.startswith(REMOTE_COMMAND_FAILED)  # the node did answer
    if lost and (not never_ran or failure.unreachable):
        gone = ", ".join(lost)
        said = failure.reason if failure.node in lost else "did not answer the re-check"
        return Cause(FailureClass.NODE_LOST, f"node lost: {gone} ({said})", at_fault=lost)
    if failure.kind == FailureKind.HANG:
        return Cause(FailureClass.HANG, failure.reason)
    text = " ".join((failure.exception or "", *failure.traceback)).lower()
    if failure.exception and _TRANSIENT.search(text):
        node = (failure.node,) if _ECC.search(text) and failure.node else ()
        return Cause(FailureClass.TRANSIENT, f"{who}: {failure.exception}", at_fault=node,
                     where=_where(failure))  # fmt: skip
    number = _signal_number(failure.signal)
    if number in _RESTARTABLE_SIGNALS:
        how = "killed by the OOM killer (SIGKILL)" if failure.oom_kill else failure.reason
        return Cause(FailureClass.SIGNAL, f"{who}: {how}", where=_where(failure))
    said = failure.exception or failure.reason
    return Cause(FailureClass.SCRIPT, f"{who}: {said}", where=_where(failure))


_MEANING = {
    FailureClass.NODE_LOST: "a node was lost",
    FailureClass.HANG: "the job hung",
    FailureClass.SIGNAL: "a rank was killed by a signal it did not send itself",
    FailureClass.TRANSIENT: "a known transient fault of the communication stack or GPU",
    FailureClass.SCRIPT: "the script's own error",
    FailureClass.STOPPED: "stopped on purpose",
}


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def got_further(progress: AttemptProgress, before: AttemptProgress) -> str | None:
    """How an attempt got further than the one before, in words; None: it did not."""
    step, was = progress.furthest_step, before.furthest_step
    if step is not None and (was is None or step > was):
        earlier = "showed no step" if was is None else f"reached step {was}"
        return f"it reached step {step}, the attempt before {earlier}"
    if progress.duration_s >= LONG_ATTEMPT_S:
        return f"it ran {_duration(progress.duration_s)} first"
    return None


def _no_further(progress: AttemptProgress, before: AttemptProgress) -> str:
    """What an attempt that got no further than the one before showed, in words."""
    step, was = progress.furthest_step, before.furthest_step
    ran = f"it ran {_duration(progress.duration_s)}"
    if step is None and was is None:
        return f"no rank showed a step; {ran}"
    reached = "showed no step" if step is None else f"reached step {step}"
    return f"it {reached}, the attempt before step {was}; {ran}"


def decide(
    failure: AttemptFailure,
    policy: RestartPolicy,
    *,
    restarts_done: int,
    previous: Cause | None = None,
    progress: AttemptProgress = NO_PROGRESS,
    previous_progress: AttemptProgress = NO_PROGRESS,
) -> RestartDecision:
    """Whether to start another attempt after this failed one. `restarts_done`: the attempts
    so far minus one; `previous`: the cause of the attempt before this one, if it failed;
    `progress`, `previous_progress`: how far this attempt and that one got."""
    cause = classify(failure)
    cls = cause.failure_class
    head = f"{cls}: {_MEANING[cls]}"
    if cls == FailureClass.STOPPED:
        return RestartDecision(cause, False, f"{head}; not restarted")
    if cls not in INFRA and policy.restart_on != "any":
        why = (f"{head}; not restarted (a restart runs the same code again; --restart-on any "
               "restarts it too)")
        return RestartDecision(cause, False, why)
    same = previous is not None and cause.where is not None and previous.where == cause.where
    further = got_further(progress, previous_progress) if same else None
    if same and cause.where is not None and further is None:
        what, where = cause.where
        why = (f"{head}; not restarted: {what} at {where} on two attempts in a row with no "
               f"progress in between ({_no_further(progress, previous_progress)}) is not a "
               "passing fault")  # fmt: skip
        return RestartDecision(cause, False, why)
    if restarts_done >= policy.max_restarts:
        if policy.max_restarts == 0:
            return RestartDecision(cause, False, f"{head}; restartable, but --max-restarts is 0")
        why = f"{head}; not restarted: all {policy.max_restarts} restart(s) used"
        return RestartDecision(cause, False, why)
    left = policy.max_restarts - restarts_done
    why = f"{head}; restarting ({left} restart(s) left)"
    if further is not None and cause.where is not None:
        what, where = cause.where
        why += f": {what} at {where} again, but the job got further ({further})"
    return RestartDecision(cause, True, why)


def short_of_nodes(decision: RestartDecision, problem: str) -> RestartDecision:
    """A restart the policy allows, not made: too few healthy nodes are left."""
    cls = decision.cause.failure_class
    why = f"{cls}: {_MEANING[cls]}; not restarted: {problem}"
    return replace(decision, restart=False, why=why)


def pause_before(restarts_done: int) -> float:
    """Seconds to wait before the next attempt, after `restarts_done` restarts."""
    return min(PAUSE_STEP_S * (restarts_done + 1), PAUSE_MAX_S)


@dataclass(frozen=True)
class NextNodes:
    nodes: tuple[str, ...]  # the next attempt's nodes, in the pool's order
    problem: str | None = None  # why there are not enough (nodes is empty then)


def next_nodes(
    pool: Sequence[str],
    current: Sequence[str],
    dropped: Sequence[str],
    *,
    wanted: int,
    minimum: int,
) -> NextNodes:
    """The next attempt's nodes: the current ones still healthy, then spares in the pool's
    order up to `wanted`; fewer, down to `minimum`, when the spares run out. `dropped`:
    every node excluded so far, or that did not answer the re-check."""
    out = set(dropped)
    kept = [n for n in current if n not in out]
    spares = [n for n in pool if n not in out and n not in kept]
    chosen = set(kept + spares[: max(0, wanted - len(kept))])
    nodes = tuple(n for n in pool if n in chosen)
    if len(nodes) >= minimum:
        return NextNodes(nodes)
    return NextNodes(
        (),
        f"{len(nodes)} healthy node(s) left ({', '.join(nodes) or 'none'}), fewer than the "
        f"{minimum} the job needs (--min-nodes); dropped: {', '.join(dropped)}",
    )
