"""An attempt's facts from the job's record: what the restart policy reads of a failed attempt,
and what the record keeps of each attempt."""

from __future__ import annotations

from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.restart_policy import Cause, FailureClass, RestartDecision
from orchestrator.outcome.states import FailureKind, JobState
from orchestrator.records.attempt_facts import attempt_failure, attempt_record
from orchestrator.records.job import FirstFailure, JobRecord, RankRecord


def _rank(rank: int, role: str, signal: str | None = None, oom: bool | None = None) -> RankRecord:
    return RankRecord(node="n2", rank=rank, local_rank=rank, pid=10 + rank, start=1.0, end=2.0,
                      exit_code=137, signal=signal, role=role, oom_kill=oom)  # fmt: skip


def test_a_failed_attempts_facts_take_the_cause_ranks_signal_and_the_unanswered_nodes():
    first = FirstFailure(node="n2", rank=3, exit_code=None, reason="killed",
                         kind=FailureKind.RANK, root_cause="RuntimeError: x",
                         traceback=("Traceback",), hint="h")  # fmt: skip
    ranks = (_rank(2, Role.CONSEQUENCE, "SIGTERM"), _rank(3, Role.CAUSE, "SIGKILL", oom=True))
    facts = attempt_failure(first, ranks, ["n4"])
    assert (facts.node, facts.rank, facts.exit_code) == ("n2", 3, 1)  # unseen: 1
    assert (facts.signal, facts.oom_kill, facts.unreachable) == ("SIGKILL", True, ("n4",))
    assert (facts.exception, facts.traceback, facts.hint) == ("RuntimeError: x", ("Traceback",),
                                                              "h")  # fmt: skip
    alone = attempt_failure(first, (), ())
    assert (alone.signal, alone.oom_kill, alone.unreachable) == (None, False, ())


def test_an_attempts_record_says_its_cause_and_the_nodes_it_dropped():
    record = JobRecord(id="j1", state=JobState.FAILED, launcher="torchrun", command=("x",),
                       hosts=("n1", "n2"), workdir="/w", started_at="t0", head_pid=1,
                       head_start=None, ended_at="t9", exit_code=137, attempt=2,
                       attempt_started="t5")  # fmt: skip
    decision = RestartDecision(Cause(FailureClass.NODE_LOST, "n2 was lost"), True, "restart")
    kept = attempt_record(record, decision, ("n2",))
    assert (kept.number, kept.nodes, kept.started, kept.ended) == (2, ("n1", "n2"), "t5", "t9")
    assert kept.cause == {"class": "node-lost", "message": "n2 was lost", "decision": "restart"}
    assert (kept.exit_code, kept.excluded) == (137, ("n2",))
    assert attempt_record(record, None).cause is None
