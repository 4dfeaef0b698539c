"""The first failure among every rank's end, cause before consequence, in one time: on values."""

from __future__ import annotations

import signal

import pytest

from orchestrator.outcome.rank_ends import (
    ClockOffsets,
    RankEnd,
    Role,
    after_a_fault,
    end_hint,
    ended_by,
    last_python_frame,
    order_ends,
    rank_end_from_fields,
)


def end(rank: int, at: float, code: int | None, node: str = "n2", **more: object) -> RankEnd:
    return RankEnd(node=node, rank=rank, end=at, code=code, **more)  # type: ignore[arg-type]


def test_the_earliest_failing_end_is_the_cause_whatever_the_launcher_chose():
    # Rank 3 os._exit(7)s; its peer on the node loses it 4 ms later and exits 1.
    order = order_ends([end(2, 10.004, 1), end(3, 10.000, 7), end(0, 10.02, 1, node="n1"),
                        end(1, 10.03, -15, node="n1", forwarded=(15,))], lost_peer={0, 2})
    assert order.cause is not None
    assert (order.cause.rank, order.cause.exit_code) == (3, 7)
    assert [e.rank for e in order.consequences] == [2, 0, 1]
    assert order.summary() == "then 3 ranks failed after losing rank 3"
    assert order.roles == {3: Role.CAUSE, 2: Role.CONSEQUENCE, 0: Role.CONSEQUENCE,
                           1: Role.CONSEQUENCE}


def test_a_lost_peer_first_by_a_hair_gives_way_to_the_failure_without_those_signs():
    # Two clocks, or a keeper that woke late: the consequence looks 5 ms earlier.
    order = order_ends([end(2, 10.000, 1), end(3, 10.005, 7, node="n1")], lost_peer={2})
    assert order.cause is not None and order.cause.rank == 3
    # Seconds apart, the earlier end stands: nothing else explains it.
    order = order_ends([end(2, 10.0, 1), end(3, 14.0, 7)], lost_peer={2})
    assert order.cause is not None and order.cause.rank == 2


def test_a_peers_traceback_first_by_a_hair_gives_way_to_a_rank_killed_from_outside():
    # Rank 1 is SIGKILLed (nobody forwarded it); rank 2's all_reduce then fails with gloo's
    # lost-peer error, and its keeper, on a loaded node, reports first.
    ends = [end(2, 10.000, 1), end(1, 10.400, -signal.SIGKILL, node="n1"), end(0, 10.5, 1)]
    order = order_ends(ends, lost_peer={0, 2})
    assert order.cause is not None and (order.cause.rank, order.cause.exit_code) == (1, 137)
    assert order.roles == {1: Role.CAUSE, 0: Role.CONSEQUENCE, 2: Role.CONSEQUENCE}
    # A signal the launcher sent and the keeper passed on is a teardown's: no cause.
    forwarded = end(1, 10.400, -signal.SIGTERM, node="n1", forwarded=(15,))
    order = order_ends([end(2, 10.000, 1), forwarded], lost_peer={2})
    assert order.cause is not None and order.cause.rank == 2


def test_a_signal_is_the_jobs_exit_code_as_a_shell_reports_it():
    order = order_ends([end(1, 5.0, -signal.SIGKILL), end(0, 5.2, -signal.SIGTERM,
                                                          forwarded=(15,))])
    assert order.cause is not None
    assert (order.cause.rank, order.cause.exit_code) == (1, 137)
    assert order.cause.how() == "killed by SIGKILL"
    assert order.roles[0] == Role.CONSEQUENCE
    segv = end(4, 1.0, -signal.SIGSEGV)
    assert (segv.exit_code, segv.how()) == (139, "killed by SIGSEGV")


@pytest.mark.parametrize(
    ("code", "words"),
    [(0, "exited with code 0"), (7, "exited with code 7"), (-signal.SIGSEGV, "killed by SIGSEGV"),
     (-33, "killed by signal 33")],
)
def test_how_a_process_ended_is_told_one_way_for_a_rank_and_for_a_node(code, words):
    assert ended_by(code) == words
    assert end(0, 1.0, code).how() == words


def test_a_later_failure_without_the_signs_of_a_lost_peer_is_listed_as_its_own():
    order = order_ends([end(0, 1.0, 3), end(1, 9.0, 5), end(2, 0.5, 0)])
    assert order.cause is not None and order.cause.rank == 0
    assert order.consequences == ()
    assert order.roles == {0: Role.CAUSE, 1: Role.FAILED, 2: Role.SUCCEEDED}
    assert order.summary() is None


def test_no_failure_no_cause():
    order = order_ends([end(0, 1.0, 0), end(1, 1.1, 0)])
    assert order.cause is None and order.roles == {0: Role.SUCCEEDED, 1: Role.SUCCEEDED}


def test_node_clocks_are_put_on_the_heads():
    clocks = ClockOffsets()
    # n2's clock is 2 s behind the head's; messages take 10 to 300 ms to arrive.
    for sent, delay in ((100.0, 0.3), (102.0, 0.01), (104.0, 0.05)):
        clocks.note("n2", sent, sent + 2.0 + delay)
    assert clocks.to_head("n2", 200.0) == pytest.approx(202.01)
    assert clocks.to_head("n9", 200.0) == 200.0  # never heard: taken as the head's
    # Rank 3 on the slow clock ended first in the head's time, though its stamp is larger.
    late_clock = rank_end_from_fields("n2", {"rank": 3, "end": 150.0, "code": 7}, clocks)
    other = end(2, 151.5, 1, node="n1")
    assert late_clock is not None and late_clock.end == pytest.approx(152.01)
    assert order_ends([late_clock, other]).cause == other


def test_a_node_clock_that_steps_back_a_second_still_orders_the_ranks_rightly():
    # n1's clock is the head's; n2's is 2 s behind, and NTP steps it back another second
    # after a few heartbeats. Messages take 10 to 50 ms to arrive; one every 2 s.
    clocks = ClockOffsets()
    behind = 2.0
    for beat in range(40):
        head = 100.0 + 2.0 * beat
        if beat == 5:
            behind = 3.0
        delay = 0.01 + 0.04 * (beat % 3) / 2
        clocks.note("n1", head, head + delay)
        clocks.note("n2", head - behind, head + delay)
    # Rank 0 on n1 fails first, at 200.0 on the head's clock; rank 3 on n2 half a second
    # later, stamped on n2's clock as it now is.
    first = rank_end_from_fields("n1", {"rank": 0, "end": 200.0, "code": 7}, clocks)
    later = rank_end_from_fields("n2", {"rank": 3, "end": 200.5 - 3.0, "code": 1}, clocks)
    assert first is not None and later is not None
    order = order_ends([later, first])
    assert order.cause is not None and order.cause.rank == 0
    assert order.roles == {0: Role.CAUSE, 3: Role.FAILED}
    assert clocks.to_head("n2", 500.0) == pytest.approx(503.01)


def test_a_clock_offset_forgets_only_what_left_the_window():
    clocks = ClockOffsets(window=3)
    for seen in (5.0, 9.0, 9.0):
        clocks.note("n1", 0.0, seen)
    assert clocks.to_head("n1", 0.0) == 5.0  # the quick message is still in the window
    clocks.note("n1", 0.0, 9.5)
    assert clocks.to_head("n1", 0.0) == 9.0


def test_a_rank_end_message_read_back():
    fields = {"rank": 5, "local_rank": 1, "pid": 42, "start": 1.0, "end": 2.5, "code": -9,
              "forwarded": [15], "maxrss_kb": 2 * 1024 * 1024, "oom_kill": True}
    got = rank_end_from_fields("n1", fields, ClockOffsets())
    assert got == RankEnd("n1", 5, 2.5, -9, 1, 42, 1.0, (15,), 2 * 1024 * 1024, True, True)
    assert got.how() == "killed by the OOM killer (SIGKILL), peak memory 2.0 GiB"
    scanned = rank_end_from_fields("n1", {"rank": 2, "end": 3.0, "code": None, "seen": "scan"},
                                   ClockOffsets())  # fmt: skip
    assert scanned is not None and not scanned.exact and scanned.exit_code == 1
    assert rank_end_from_fields("n1", {"end": 3.0}, ClockOffsets()) is None


FAULTHANDLER = [
    "Fatal Python error: Segmentation fault",
    "",
    "Current thread 0x00007f (most recent call first):",
    '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at',
    '  File "/work/train.py", line 12 in step',
    '  File "/work/train.py", line 30 in <module>',
]


def test_hints_for_ends_that_are_not_the_scripts_logic():
    segv = end(1, 1.0, -signal.SIGSEGV)
    assert end_hint(segv, FAULTHANDLER) == (
        "SIGSEGV in native code at /usr/lib/python3.11/ctypes/__init__.py:519 in string_at"
    )
    assert last_python_frame(["[rank1]: " + line for line in FAULTHANDLER]) is not None
    assert end_hint(segv, []) == "SIGSEGV in native code (no Python frame was printed)"
    abort = end(0, 1.0, -signal.SIGABRT)
    hint = end_hint(abort, ["done", "terminate called without an active exception"])
    assert hint is not None and "destroy_process_group()" in hint
    assert end_hint(abort, ["done"]) is None
    # The same abort while Python exits (faulthandler finds no frame): the script may have
    # destroyed its group already; a torch thread still held a collective's work.
    exiting = ["trained", "terminate called without an active exception",
               "Fatal Python error: Aborted", "", "Thread 0x00007fb0821c7b80 (most recent "
               "call first):", "  <no Python frame>", ""]  # fmt: skip
    hint = end_hint(abort, exiting)
    assert hint is not None and hint.startswith("aborted as Python exited")
    assert "os._exit(code)" in hint
    running = [*exiting[:4], '  File "/work/train.py", line 30 in <module>']
    assert end_hint(abort, running) == (
        "a C++ thread ended the rank (std::terminate) while it ran /work/train.py:30 in <module>"
    )
    oom = end(2, 1.0, -signal.SIGKILL, oom_kill=True, maxrss_kb=1024)
    assert end_hint(oom, []) is not None and "out of memory" in str(end_hint(oom, []))
    assert end_hint(end(2, 1.0, -signal.SIGKILL), []) is None
    assert end_hint(end(2, 1.0, 7), []) is None


def test_when_no_rank_is_the_cause_every_failed_rank_is_a_consequence():
    # A node froze; the teardown stopped the others.
    order = after_a_fault([end(0, 5.0, -15, forwarded=(15,)), end(1, 4.0, 1), end(2, 3.0, 0)])
    assert order.cause is None and order.summary() is None
    assert [e.rank for e in order.consequences] == [1, 0]
    assert order.roles == {0: Role.CONSEQUENCE, 1: Role.CONSEQUENCE, 2: Role.SUCCEEDED}
