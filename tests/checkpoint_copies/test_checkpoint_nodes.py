"""The head's side of the checkpoint program on the job's nodes (checkpoint_copies/nodes.py),
on the fake transport: the scans repeated while a job runs go to one scanner left running
on each node, replaced when it fails, and a node that cannot scan is named."""

from __future__ import annotations

import json

from _checkpoint_scans import PATH, scan_doc

from orchestrator.checkpoint_copies.nodes import CheckpointNodes
from orchestrator.nodes.fake import FakeNode, FakeTransport, Reply
from orchestrator.specs.checkpoints import CheckpointSettings


def _answers(node: str, count: int) -> str:
    return "".join(json.dumps(scan_doc(node)) + "\n" for _ in range(count))


def _nodes(*nodes: FakeNode) -> tuple[CheckpointNodes, FakeTransport]:
    transport = FakeTransport(nodes)
    return CheckpointNodes(transport, "python3", "job-7", CheckpointSettings(PATH)), transport


def test_every_scan_of_a_node_goes_to_the_one_scanner_started_there():
    nodes, transport = _nodes(FakeNode("n1", {"": Reply(stdout=_answers("n1", 3))}))
    for _ in range(3):
        assert nodes.scan(["n1"])["n1"].value is not None
    [scanner] = transport.started
    assert "scans" in scanner.command
    asked = [json.loads(line) for line in scanner.sent.splitlines()]
    assert [(a["node"], a["dir"], a["job_id"]) for a in asked] == [("n1", PATH, "job-7")] * 3
    nodes.close()
    assert scanner.closed


def test_a_scanner_that_ends_is_replaced_and_the_scan_asked_again():
    # Each scanner answers once, then its output ends (it was killed, its node rebooted).
    nodes, transport = _nodes(FakeNode("n1", {"": Reply(stdout=_answers("n1", 1))}))
    assert nodes.scan(["n1"])["n1"].value is not None
    assert nodes.scan(["n1"])["n1"].value is not None
    first, second = transport.started
    assert first.closed and not second.closed


def test_a_node_whose_scanner_dies_at_once_is_named_with_what_it_said():
    dying = Reply(1, stderr="Traceback (most recent call last):\nModuleNotFoundError: json\n")
    nodes, transport = _nodes(FakeNode("n1", {"": Reply(stdout=_answers("n1", 1))}),
                              FakeNode("n2", {"": dying}), FakeNode("n3").refuse())  # fmt: skip
    found = nodes.scan(["n1", "n2", "n3"])
    assert found["n1"].value is not None
    assert found["n2"].value is None
    said = "n2: Traceback (most recent call last): | ModuleNotFoundError: json"
    assert found["n2"].problem == said
    assert len([s for s in transport.started if s.node == "n2"]) == 2  # tried once more
    assert found["n3"].problem == "n3: connection refused"
