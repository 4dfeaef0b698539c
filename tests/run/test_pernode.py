"""One result per node: the type every many-node operation returns, and teardown's reading
of pdsh's output into it. Values only."""

from __future__ import annotations

import threading

import pytest

from orchestrator.pernode import GroupResult, failed, for_each_node, succeeded
from orchestrator.run.teardown import StopProblem, StopReport, stop_results


def test_a_group_keeps_order_and_tells_success_from_failure():
    group = GroupResult((succeeded("n1", 1), failed("n2", "n2: refused", "start sshd"),
                         succeeded("n3", 3)))  # fmt: skip
    assert group.nodes == ("n1", "n2", "n3")
    assert not group.ok
    assert [r.node for r in group.succeeded] == ["n1", "n3"]
    assert [r.node for r in group.failed] == ["n2"]
    assert group["n2"].why == "n2: refused (start sshd)"
    assert group["n1"].why == "ok" and group["n3"].value == 3
    with pytest.raises(KeyError):
        group["n9"]


def test_for_each_node_runs_nodes_at_once_and_keeps_their_order():
    started = threading.Barrier(3, timeout=10)  # all three must be under way together

    def work(node: str):
        started.wait()
        return failed(node, f"{node}: broken") if node == "b" else succeeded(node, node.upper())

    group = for_each_node(["a", "b", "c"], work, max_parallel=3)
    assert group.nodes == ("a", "b", "c")
    assert [r.value for r in group.succeeded] == ["A", "C"]
    assert group["b"].problem == "b: broken"  # one bad node hides no other
    assert for_each_node([], work).results == ()


def test_teardown_reads_each_nodes_answer_and_names_the_ones_it_could_not_reach():
    output = [
        ("n1", '{"found": 3, "killed": 1, "left": 0}'),
        ("pdsh@head", "n2: ssh exited with exit code 255"),
        ("n3", "Traceback (most recent call last):"),
        ("pdsh@head", "n3: ssh exited with exit code 1"),
    ]
    group = stop_results(("n1", "n2", "n3", "n4"), output, timed_out=True)
    assert group["n1"].value == StopReport(found=3, killed=1, left=0)
    assert str(group["n1"].value) == "stopped 3 process(es), 1 with KILL"
    assert group["n2"].kind == StopProblem.UNREACHABLE == "unreachable"
    assert group["n2"].problem == "n2: unreachable (ssh exit 255)"
    assert group["n3"].problem == "n3: kill failed (exit 1)" and "python3" in group["n3"].hint
    assert group["n4"].kind == StopProblem.NO_ANSWER == "no-answer"
    assert group["n4"].problem == "n4: no answer (timed out)"
    assert [r.node for r in group.failed] == ["n2", "n3", "n4"]


def test_a_node_with_processes_left_says_so():
    group = stop_results(("n1",), [("n1", '{"found": 2, "killed": 2, "left": 1}')],
                         timed_out=False)  # fmt: skip
    assert group.ok and str(group["n1"].value).endswith("1 still running")
