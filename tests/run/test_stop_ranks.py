"""The stop signal to every node at once, over fake nodes: what each node's stop program
said (the ranks it signalled), or why it said nothing; each node's command names that node
(under srun, Slurm's name for it); and the stop's summary on the head's clock."""

from __future__ import annotations

import json
import signal

from orchestrator.nodes.fake import FakeNode, FakeTransport, Reply
from orchestrator.outcome.rank_ends import ClockOffsets, RankEnd
from orchestrator.outcome.states import StopCause
from orchestrator.outcome.stop import RankStopEnd, StopEnding
from orchestrator.run.stop import RanksSignalled, Stop, signal_ranks
from orchestrator.specs.stop import StopSettings


def _said(*ranks: tuple[int, int, float]) -> Reply:
    doc = {"signalled": [{"rank": r, "pid": p, "at": t} for r, p, t in ranks], "t": 9.0}
    return Reply(stdout=json.dumps(doc) + "\n")


def test_every_node_is_sent_the_stop_and_each_answer_is_kept() -> None:
    fake = FakeTransport([
        FakeNode("n1", {"": _said((0, 101, 5.0), (1, 102, 5.1))}),
        FakeNode("n2", {"": _said()}).unreachable(),
        FakeNode("n3", {"": Reply(1, stdout='{"error": "the stop file on n3: no space"}\n')}),
        FakeNode("n4", {"": Reply(127, stderr="python3: not found\n")}),
    ])  # fmt: skip
    stop = StopSettings("SIGUSR1", 300)
    one, gone, full, broken = signal_ranks(["n1", "n2", "n3", "n4"], "job-1", "/venv/bin/python",
                                           stop, fake)  # fmt: skip
    assert one.value == RanksSignalled(((0, 101, 5.0), (1, 102, 5.1)))
    assert gone.value is None and gone.problem == "n2: unreachable"
    assert full.problem == "n3: the stop file on n3: no space"
    assert broken.problem == "n4: the stop program failed (exit 127)"
    for node in ("n1", "n3", "n4"):
        [command] = fake.commands(node)
        # job id, the node's own name, the signal's number, the grace
        assert command.endswith(f" job-1 {node} {int(signal.SIGUSR1)} 300")


def test_through_srun_the_node_is_slurms_name_for_it() -> None:
    fake = FakeTransport([FakeNode("n1", {"": _said()})], slurm_job="7")
    signal_ranks(["n1"], "job-1", "python3", StopSettings(), fake)
    [command] = fake.commands("n1")
    assert command.endswith(" job-1 - 15 120")


def test_the_summary_puts_the_nodes_times_on_the_heads_clock() -> None:
    fake = FakeTransport([FakeNode("n1", {"": _said((0, 101, 500.0))}),
                          FakeNode("n2", {"": _said()}).unreachable()])  # fmt: skip
    stop = Stop(StopCause.TIME_LIMIT, StopSettings(), world_size=2)
    stop.begin(lambda: signal_ranks(["n1", "n2"], "job-1", "python3", StopSettings(), fake))
    clocks = ClockOffsets()
    clocks.note("n1", 400.0, 410.0)  # n1's clock is 10 s behind the head's
    summary = stop.summary_of([RankEnd("n1", 0, stop.asked_at + 3, 0)], clocks)
    assert summary.ending == StopEnding.RANKS_EXITED and summary.cause == StopCause.TIME_LIMIT
    first, second = summary.ranks
    assert (first.signalled_at, first.end) == (510.0, RankStopEnd.EXITED)
    assert second.end == RankStopEnd.UNKNOWN
    assert summary.unreached == {"n2": "n2: unreachable"}
