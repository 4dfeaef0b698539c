"""The short re-check of a job's nodes, over a fake transport."""

from __future__ import annotations

from orchestrator.nodes.fake import FakeNode, FakeTransport, Reply
from orchestrator.run.recheck import unreachable_nodes


def test_the_recheck_names_the_nodes_that_do_not_run_a_trivial_command() -> None:
    fake = FakeTransport([FakeNode("n1", {"true": Reply()}), FakeNode("n2").time_out(),
                          FakeNode("n3", {"true": Reply(1)}), FakeNode("n4").refuse()])  # fmt: skip
    assert unreachable_nodes(["n1", "n2", "n3", "n4"], fake) == ("n2", "n3", "n4")
    assert [(c.node, c.command) for c in fake.calls] == [(n, "true") for n in ("n1", "n2", "n3",
                                                                              "n4")]  # fmt: skip
    assert unreachable_nodes([], fake) == () and len(fake.calls) == 4
