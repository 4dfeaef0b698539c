"""A failed job explained from what the head kept of its output: the failing rank by the
ranks' own ends, its own traceback as the root cause, the lines shown. On values."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

from orchestrator.outcome.explanation import (
    TAIL_LINES,
    KeptOutput,
    cause_lines,
    explain,
    failing_rank_traceback,
    first_rank_end,
)
from orchestrator.outcome.rank_ends import RankEnd, Role
from orchestrator.outcome.rootcause import RankTraceback, rank_tracebacks
from orchestrator.outcome.states import Failure, FailureKind

GLOO_CLOSED = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [127.0.0.1]:12345"
)


def _traceback(exception: str) -> list[str]:
    return [
        "Traceback (most recent call last):",
        '  File "/home/ml/train.py", line 52, in train_step',
        "    step(batch)",
        exception,
    ]


REAL = ["step 9", *_traceback("ValueError: bad batch")]  # rank 3's own failure
CASCADE = ["step 9", *_traceback(GLOO_CLOSED)]  # rank 1 lost rank 3
NODE_LINES = {
    "n1": ("[r1] step 9", "[r1] RuntimeError: ... Connection closed by peer"),
    "n2": ("[r3] step 9", "[r3] ValueError: bad batch"),
    "": ("pdsh@head: n1: ssh exited with exit code 1",),
}


def _kept(
    rank_lines: Mapping[int, Sequence[str]] | None = None,
    traceback_at: Mapping[int, int] | None = None,
    ends: Sequence[RankEnd] = (),
) -> KeptOutput:
    return KeptOutput(
        node_lines=NODE_LINES,
        rank_lines={1: CASCADE, 3: REAL} if rank_lines is None else rank_lines,
        traceback_at={1: 1, 3: 2} if traceback_at is None else traceback_at,
        rank_nodes={1: "n1", 3: "n2"},
        rank_ends=ends,
    )


def _end(rank: int, at: float, code: int | None, node: str) -> RankEnd:
    return RankEnd(node=node, rank=rank, end=at, code=code)


# The launcher's choice: rank 1 on n1, whose exit was reported first.
AS_REPORTED = Failure("n1", "exited with code 1", 1, rank=1, kind=FailureKind.RANK, when=11.0)
ENDS = (_end(1, 10.004, 1, "n1"), _end(3, 10.000, 7, "n2"))


def test_a_rank_failure_is_the_earliest_failing_end_with_its_own_traceback_and_lines():
    why = explain(AS_REPORTED, _kept(ends=ENDS))
    assert why.failure == Failure("n2", "exited with code 7", 7, rank=3, kind=FailureKind.RANK,
                                  when=10.000)  # fmt: skip
    assert why.order.cause == ENDS[1]
    assert why.order.summary() == "then 1 rank failed after losing rank 3"
    assert why.order.roles == {3: Role.CAUSE, 1: Role.CONSEQUENCE}
    assert why.last_lines == tuple(f"[r3] {line}" for line in REAL)
    assert why.root_cause is not None and why.root_cause.rank == 3
    assert why.root_cause.exception == "ValueError: bad batch"
    assert why.root_cause_node == "n2"
    assert why.hint is None


def test_a_rank_failure_without_reported_ends_stays_as_the_verdict_said():
    why = explain(AS_REPORTED, _kept())
    assert why.failure == AS_REPORTED and why.order.cause is None
    assert why.last_lines == NODE_LINES["n1"]  # its node's lines, as nothing better is known
    # The real failure's traceback is the root cause, whichever rank the verdict named.
    assert why.root_cause is not None and why.root_cause.rank == 3
    assert why.order.summary() is None


def test_a_fault_that_is_no_rank_makes_every_failing_rank_its_consequence():
    silent = Failure("n2", "stopped answering", 1, kind=FailureKind.SILENT)
    why = explain(silent, _kept(ends=ENDS))
    assert why.failure == silent and why.order.cause is None
    assert [e.rank for e in why.order.consequences] == [3, 1]
    assert why.root_cause is None and why.root_cause_node is None  # no rank caused it
    assert why.last_lines == NODE_LINES["n2"] and why.hint is None
    head = Failure("", "pdsh exited with code 1", 1, kind=FailureKind.HEAD)
    assert explain(head, _kept()).last_lines == NODE_LINES[""]


def test_a_lost_node_is_explained_by_its_ranks_tracebacks():
    lost = Failure("n2", "lost its ssh connection", 255, kind=FailureKind.LOST)
    why = explain(lost, _kept())
    assert why.root_cause is not None and why.root_cause.rank == 3
    assert why.root_cause_node == "n2"


def test_the_failing_ranks_end_gives_its_hint():
    segv = RankEnd(node="n2", rank=3, end=10.0, code=-signal.SIGSEGV)
    why = explain(AS_REPORTED, _kept(ends=(segv,)))
    assert why.failure.exit_code == 128 + signal.SIGSEGV
    assert why.hint == "SIGSEGV in native code (no Python frame was printed)"


def test_first_rank_end_lets_a_lost_peer_a_hair_earlier_give_way():
    tracebacks = rank_tracebacks({1: CASCADE, 3: REAL}, {1: 1, 3: 2})
    ends = (_end(1, 10.000, 1, "n1"), _end(3, 10.005, 7, "n2"))
    failure, order = first_rank_end(AS_REPORTED, ends, tracebacks)
    assert (failure.node, failure.rank, failure.exit_code) == ("n2", 3, 7)
    assert order.cause == ends[1]
    # Without the cascade's traceback rank 1's end is the earlier, so it is the cause.
    failure, order = first_rank_end(AS_REPORTED, ends, [])
    assert (failure.rank, failure.exit_code, failure.when) == (1, 1, 10.000)
    assert first_rank_end(AS_REPORTED, (), tracebacks)[0] == AS_REPORTED


def test_cause_lines_are_the_ranks_own_last_ones_else_its_nodes():
    many = [f"step {i}" for i in range(TAIL_LINES + 5)]
    cause = _end(3, 10.0, 7, "n2")
    lines = cause_lines(cause, _kept(rank_lines={3: many}))
    assert lines == tuple(f"[r3] step {i}" for i in range(5, TAIL_LINES + 5))
    assert cause_lines(cause, _kept(rank_lines={})) == NODE_LINES["n2"]
    assert cause_lines(_end(4, 10.0, 7, "n9"), _kept(rank_lines={})) == ()


def _tb(rank: int, cascade: bool, order: int) -> RankTraceback:
    exception = GLOO_CLOSED if cascade else "ValueError: bad batch"
    return RankTraceback(rank, (exception,), exception, cascade, order)


def test_a_cascade_on_another_rank_is_never_named_the_cause():
    failing = Failure("n2", "exited with code 7", 7, rank=3)
    assert failing_rank_traceback(failing, [_tb(1, True, 0)]) is None
    own = _tb(3, True, 1)
    assert failing_rank_traceback(failing, [_tb(1, True, 0), own]) == own
    real = _tb(2, False, 2)
    assert failing_rank_traceback(failing, [real, own]) == real
    assert failing_rank_traceback(failing, []) is None
