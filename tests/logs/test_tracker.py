"""What the head keeps of every line while a job runs (logs/tracker.py's OutputTracker): each
node's last lines with their rank, each rank's own last lines for its traceback, pdsh's
reports of ended ssh connections. Fed values, as the log router feeds it."""

from __future__ import annotations

from orchestrator.logs.tracker import RANK_TAIL_LINES, TAIL_LINES, OutputTracker
from orchestrator.records.job import HEAD_NODE
from orchestrator.remote.logwire import ControlKind

HOSTS = ("n1", "n2")


def test_each_node_keeps_its_last_lines_marked_with_their_rank() -> None:
    tracker = OutputTracker(HOSTS, None)
    tracker.line("n1", "err", b"launcher says hello")
    tracker.line("n1", "out", "step 1 \N{CHECK MARK}".encode(), rank="0/0")
    tracker.line("n1", "out", b"bad \xff byte", rank="1/1")
    tracker.line("n2", "out", b"forged", rank="x/y")  # not a label orch writes
    assert tracker.node_tails()["n1"] == (
        "launcher says hello", "[r0] step 1 \N{CHECK MARK}",
        "[r1] bad \N{REPLACEMENT CHARACTER} byte",
    )  # fmt: skip
    assert tracker.node_tails()["n2"] == ("forged",)
    assert tracker.rank_nodes == {0: "n1", 1: "n1"}
    for i in range(TAIL_LINES + 5):
        tracker.line("n2", "out", b"line %d" % i, rank="2/0")
    assert tracker.node_tails()["n2"][0] == "[r2] line 5"
    assert len(tracker.node_tails()["n2"]) == TAIL_LINES


def test_each_rank_keeps_its_own_lines_and_where_its_last_traceback_began() -> None:
    tracker = OutputTracker(HOSTS, None)
    tracker.line("n1", "err", b"Traceback (most recent call last):", rank="1/1")
    tracker.line("n2", "err", b"Traceback (most recent call last):", rank="2/0")
    tracker.line("n1", "err", b"ValueError: boom", rank="1/1")
    tracker.line("n1", "err", b"Traceback (most recent call last):", rank="1/1")
    assert tracker.rank_lines()[1] == [
        "Traceback (most recent call last):", "ValueError: boom",
        "Traceback (most recent call last):",
    ]  # fmt: skip
    assert tracker.traceback_at == {2: 2, 1: 3}
    for i in range(RANK_TAIL_LINES + 1):
        tracker.line("n2", "out", b"x%d" % i, rank="2/0")
    assert len(tracker.rank_lines()[2]) == RANK_TAIL_LINES


def test_pdsh_reports_of_ended_ssh_are_noted_for_known_nodes_only() -> None:
    tracker = OutputTracker(HOSTS, None)
    tracker.line("pdsh@head", "err", b"n2: ssh exited with exit code 255")
    tracker.line("pdsh@head", "err", b"elsewhere: ssh exited with exit code 255")
    assert tracker.ssh_ended == [("n2", 255)]
    assert tracker.node_tails()[""][-1] == "elsewhere: ssh exited with exit code 255"
    assert tracker.heard == {""} and not tracker.ranks_wrote


def test_the_fan_outs_own_lines_are_the_heads() -> None:
    tracker = OutputTracker(HOSTS, None)
    tracker.line(HEAD_NODE, "err", b"srun: error: n2: task 1: Exited with exit code 7")
    tracker.line("pdsh@head", "err", b"n2: ssh exited with exit code 7")
    tracker.line("n1", "out", b"step 1", rank="0/0")
    assert tracker.head_lines() == (
        "srun: error: n2: task 1: Exited with exit code 7", "n2: ssh exited with exit code 7",
    )  # fmt: skip


def test_what_it_kept_is_handed_on_as_values() -> None:
    tracker = OutputTracker(HOSTS, None)
    tracker.line("n2", "err", b"Traceback (most recent call last):", rank="3/1")
    tracker.control("n2", ControlKind.RANK_END, {"rank": 3, "code": 7, "end": 1.5})
    kept = tracker.kept()
    assert kept.node_lines["n2"] == ("[r3] Traceback (most recent call last):",)
    assert kept.rank_lines == {3: ["Traceback (most recent call last):"]}
    assert kept.traceback_at == {3: 1} and kept.rank_nodes == {3: "n2"}
    assert kept.rank_ends == tuple(tracker.rank_ends.values())
    at_failure = {"n2": ("before the teardown",)}
    assert tracker.kept(at_failure).node_lines == at_failure


def test_slurms_sigterm_to_a_nodes_step_asks_the_job_to_stop_once() -> None:
    from orchestrator.outcome.events import StopAsked
    from orchestrator.outcome.states import StopCause

    tracker = OutputTracker(HOSTS, None)
    tracker.control("elsewhere", ControlKind.SIGNALLED, {"signal": "SIGTERM"})
    assert not [e for e in tracker.events(1.0) if isinstance(e, StopAsked)]
    tracker.control("n1", ControlKind.SIGNALLED, {"signal": "SIGTERM"})
    tracker.control("n2", ControlKind.SIGNALLED, {"signal": "SIGTERM"})
    asked = [e for e in tracker.events(2.0) if isinstance(e, StopAsked)]
    assert asked == [StopAsked(StopCause.SLURM_SIGNAL, 2.0)]
    assert not [e for e in tracker.events(3.0) if isinstance(e, StopAsked)]
