"""A quiet job judged from a look at its ranks (outcome/quiet.py), and the verdict that asks
for the look before it calls silence a hang. On values."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.outcome.events import NodeHeard, QuietLooked, RankOutput, Tick, WatchSettings
from orchestrator.outcome.quiet import Activity, LauncherSample, QuietFinding, RankSample, judge
from orchestrator.outcome.states import FailureKind
from orchestrator.outcome.verdict import Decision, JobVerdict
from orchestrator.stacks.model import Frame, RankStacks, ThreadStack, thread_from_dump

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"
HOSTS = ("n1", "n2")


def _stack(name: str, rank: int, node: str) -> RankStacks:
    threads = json.loads((FIXTURES / f"{name}.json").read_text())
    pid = threads[0]["pid"]
    return RankStacks(rank, node, pid, tuple(thread_from_dump(t, pid) for t in threads))


def _waiting(rank: int, node: str = "n1", cpu: float = 0.0) -> RankSample:
    stack = _stack("dump_waiting", rank, node)
    return RankSample(rank, node, 3.0, cpu, 0, "S", (stack, stack))


def _in_user_code(rank: int, cpu: float, io: int = 0, state: str = "S") -> RankSample:
    stack = _stack("dump_computing", rank, "n2")
    return RankSample(rank, "n2", 3.0, cpu, io, state, (stack, stack))


def test_a_rank_computing_while_the_others_wait_is_working_and_said_where():
    finding = judge([_waiting(0), _waiting(1), _waiting(2), _in_user_code(3, cpu=2.4)])
    assert finding.working
    assert [rank.activity for rank in finding.ranks] == [Activity.WAITING] * 3 + [Activity.WORKING]
    assert finding.summary() == (
        "rank 3 computing in compute (/home/alice/train/stepping.py:29); 3 ranks in all_reduce"
    )
    assert finding.culprits == ()


def test_a_waiting_rank_that_spins_the_cpu_is_still_waiting_its_frame_decides():
    finding = judge([_waiting(0, cpu=3.0), _waiting(1, cpu=2.9)])
    assert not finding.working
    assert finding.summary() == "2 ranks in all_reduce"


def test_writing_storage_is_working_even_without_cpu():
    finding = judge([_waiting(0), _in_user_code(1, cpu=0.0, io=64 << 20)])
    assert finding.working
    assert "rank 1 reading or writing storage in compute" in finding.summary()


def test_a_rank_idle_in_its_own_code_while_the_others_wait_is_the_culprit():
    finding = judge([_waiting(0), _waiting(1), _waiting(2), _in_user_code(3, cpu=0.01)])
    assert not finding.working
    [culprit] = finding.culprits
    assert (culprit.rank, culprit.activity, culprit.why) == (3, Activity.IDLE, "idle, stuck")
    assert finding.summary().startswith("rank 3 idle, stuck in compute (")


def test_a_stopped_rank_is_named_and_never_counts_as_working():
    finding = judge([_waiting(0), _in_user_code(1, cpu=1.0, state="T")])
    assert not finding.working
    [culprit] = finding.culprits
    assert (culprit.rank, culprit.why) == (1, "stopped (state T)")


def test_without_stacks_the_cpu_and_io_decide_and_a_problem_is_said():
    bare = [RankSample(0, "n1", 3.0, 1.5, None, "R"), RankSample(1, "n1", 3.0, 0.0, 0, "S")]
    finding = judge(bare, problem="n2 did not answer")
    assert finding.working
    assert finding.summary() == "rank 0 computing; rank 1 idle; n2 did not answer"
    assert finding.culprits == ()  # no rank waits: nothing tells the idle one apart


def _importing(rank: int, cpu: float) -> RankSample:
    """A rank still importing torch.distributed (a crowded node takes long): module code of
    torch/distributed innermost, under the import machinery."""
    frames = (
        Frame("<module>", "/venv/lib/python3.11/site-packages/torch/distributed/fsdp/api.py", 9),
        Frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
        Frame("<module>", "/home/alice/train/train.py", 3),
    )
    main = ThreadStack("MainThread", 41, idle=False, main=True, frames=frames)
    stack = RankStacks(rank, "n2", 41, (main,))
    return RankSample(rank, "n2", 3.0, cpu, 0, "R", (stack, stack))


def test_a_rank_importing_torch_distributed_is_working_not_waiting():
    finding = judge([_waiting(0), _importing(1, cpu=2.5)])
    assert finding.working
    assert finding.ranks[1].activity == Activity.WORKING
    assert finding.summary().startswith("rank 1 computing in <module> (/home/alice/train/train")


def test_a_node_whose_launcher_still_starts_is_working_and_an_idle_one_is_not():
    starting = LauncherSample("n2", 3.0, 1.8, 0, processes=1)
    finding = judge([_waiting(0)], None, [starting])
    assert finding.working
    assert finding.summary() == "n2: no rank yet, its launcher computing; 1 rank in all_reduce"
    idle = LauncherSample("n2", 3.0, 0.01, 0, processes=1)
    assert not judge([_waiting(0)], None, [idle]).working  # every rank waits on it: hung
    assert not judge([], None, []).working  # no process of the job anywhere


# ----- the verdict asks for a look before it calls silence a hang -----------------------
def _verdict(**settings: float) -> JobVerdict:
    return JobVerdict(HOSTS, WatchSettings(hang_timeout=10, **settings), head_launcher=False)


def _feed(verdict: JobVerdict, *events) -> list[Decision]:
    return [verdict.feed(event) for event in events]


def _quiet_until(verdict: JobVerdict, end: int) -> list[Decision]:
    decisions = []
    for at in range(1, end + 1):  # heartbeats, no output
        decisions += _feed(verdict, *(NodeHeard(h, at) for h in HOSTS), Tick(at))
    return decisions


WORKING = QuietFinding((judge([_in_user_code(0, cpu=2.0)]).ranks[0],), 3.0)
HUNG = judge([_waiting(0), _in_user_code(1, cpu=0.0)])


def test_silence_beyond_the_timeout_asks_for_one_look_and_tears_down_nothing_yet():
    verdict = _verdict()
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), RankOutput(0))
    decisions = _quiet_until(verdict, 20)
    assert [d.tear_down for d in decisions if d.tear_down] == []
    assert sum(d.look for d in decisions) == 1  # once, a second before the 10 s (its lead)
    assert verdict.hangs.look_asked_at == 10


def test_a_look_that_finds_work_restarts_the_count_and_one_that_finds_none_is_a_hang():
    verdict = _verdict()
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), RankOutput(0))
    _quiet_until(verdict, 10)
    _feed(verdict, QuietLooked(WORKING, asked_at=10, at=13))
    decisions = _quiet_until(verdict, 22)
    assert [d for d in decisions if d.tear_down or d.look] == []  # quiet counts from 13
    decisions = _quiet_until(verdict, 23)
    assert sum(d.look for d in decisions) == 1
    [failure] = [d.tear_down for d in _feed(verdict, QuietLooked(HUNG, asked_at=23, at=26))
                 if d.tear_down]  # fmt: skip
    assert failure.kind == FailureKind.HANG and (failure.node, failure.rank) == ("n2", 1)
    assert failure.reason.startswith("hang: no rank wrote anything for 26 s and none is "
                                     "working (rank 1 idle, stuck in compute")  # fmt: skip
    assert [looked.at for looked in verdict.hangs.quiet_work] == [13]


def test_a_look_overtaken_by_output_counts_for_nothing():
    verdict = _verdict()
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), RankOutput(0))
    _quiet_until(verdict, 11)
    _feed(verdict, RankOutput(12.0))
    decisions = _feed(verdict, QuietLooked(HUNG, asked_at=11, at=13), Tick(13))
    assert [d.tear_down for d in decisions if d.tear_down] == []


def test_a_look_that_never_answers_is_a_hang_after_its_timeout():
    verdict = _verdict(look_timeout=30)
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), RankOutput(0))
    decisions = _quiet_until(verdict, 42)
    [failure] = [d.tear_down for d in decisions if d.tear_down]
    assert failure.reason.endswith("a look at the ranks gave no answer in 31 s")


def test_a_look_that_could_not_read_every_node_is_taken_again_before_a_hang():
    verdict = _verdict(look_again_after=30)
    _feed(verdict, NodeHeard("n1", 0), NodeHeard("n2", 0), RankOutput(0))
    partial = judge([_waiting(0)], problem="n2 did not answer (timed out)")
    asked, teardowns = [], []
    for at in range(1, 120):  # heartbeats go on; each look answers 3 s after it was asked
        decisions = _feed(verdict, *(NodeHeard(h, at) for h in HOSTS), Tick(at))
        asked += [at for d in decisions if d.look]
        if asked and verdict.hangs.look_asked_at == at - 3:
            decisions = _feed(verdict, QuietLooked(partial, asked_at=at - 3, at=at))
            teardowns += [(at, d.tear_down) for d in decisions if d.tear_down]
    assert asked == [10, 43, 76]  # a pause of 30 s after each look that read part of the job
    [(at, failure)] = teardowns  # the third in a row
    assert at == 79
    assert failure.reason.endswith("(1 rank in all_reduce; n2 did not answer (timed out))")


def _learned(hosts: tuple[str, ...] = HOSTS) -> JobVerdict:
    """A verdict that has learned a pace of a step a second: the floor of 120 s holds."""
    verdict = JobVerdict(hosts, WatchSettings(hang_learned=True), head_launcher=False)
    for at in range(0, 60):
        _feed(verdict, *(NodeHeard(h, float(at)) for h in hosts), RankOutput(float(at), True))
    return verdict


def _quiet_from(verdict: JobVerdict, start: int, end: int) -> list[tuple[int, Decision]]:
    return [(at, d) for at in range(start, end + 1)
            for d in _feed(verdict, *(NodeHeard(h, float(at)) for h in HOSTS), Tick(float(at)))]


def test_the_look_comes_before_the_threshold_so_the_hang_is_decided_at_it():
    verdict = _learned()
    asked = [at for at, d in _quiet_from(verdict, 60, 174) if d.look]
    assert asked == [174]  # 59 s + 120 s, less the look's lead of 6 s (its 3 s and 3 more)
    assert _feed(verdict, QuietLooked(HUNG, asked_at=174, at=177))[0].tear_down is None
    ended = [(at, d.tear_down) for at, d in _quiet_from(verdict, 178, 185) if d.tear_down]
    [(at, failure)] = ended[:1]
    assert at == 180  # the first moment beyond 120 s of quiet, not a look later
    assert failure.reason.startswith("hang: no rank wrote anything for 121 s (beyond 120 s: "
                                     "floor) and none is working (")  # fmt: skip


def test_a_rank_that_speaks_after_a_look_found_none_working_is_not_hung():
    verdict = _learned()
    _quiet_from(verdict, 60, 174)
    _feed(verdict, QuietLooked(HUNG, asked_at=174, at=177), RankOutput(178.0, True))
    decisions = _quiet_from(verdict, 178, 300)
    assert [d.tear_down for _at, d in decisions if d.tear_down] == []
    assert [at for at, d in decisions if d.look] == [293]  # the quiet counts from 178 again


def test_a_stopped_rank_is_named_before_a_rank_whose_stack_could_not_be_read():
    unread = RankSample(1, "n1", 3.0, 0.0, 0, "S")  # idle, its stack not taken
    finding = judge([_waiting(0), unread, _in_user_code(3, cpu=0.0, state="T")])
    assert [r.rank for r in finding.culprits] == [3]
    alone = judge([_waiting(0), unread])
    assert alone.culprits == ()  # idle, but where is unknown: perhaps waiting too
