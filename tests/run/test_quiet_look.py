"""The head's side of a look at a quiet job (run/quiet.py): every node's look document read
as one judgement. On values."""

from __future__ import annotations

import json

from orchestrator.pernode import NodeResult
from orchestrator.run.quiet import findings_of
from orchestrator.ssh import CommandResult


def _answer(node: str, doc: dict) -> NodeResult[CommandResult]:
    return NodeResult(node, CommandResult(node, 0, json.dumps(doc).encode(), b""))


def _no_rank(node: str, launcher: dict) -> dict:
    return {"node": node, "job_id": "j1", "seconds": 3.0, "kind": "no-ranks",
            "error": "no rank of job j1 runs on this node", "launcher": launcher}  # fmt: skip


def test_nodes_whose_launcher_is_still_starting_are_working_not_hung():
    answers = [
        _answer("n1", _no_rank("n1", {"processes": 3, "seconds": 3.0, "cpu": 2.7, "io": 0})),
        _answer("n2", _no_rank("n2", {"processes": 3, "seconds": 3.0, "cpu": 0.0, "io": 0})),
    ]
    finding = findings_of(answers, "/venv/bin/python", "j1", 3.0)
    assert finding.working
    assert finding.summary() == "n1: no rank yet, its launcher computing"


def test_nodes_with_nothing_of_the_job_left_and_an_unanswered_node_are_not_working():
    answers = [
        _answer("n1", _no_rank("n1", {"processes": 0, "seconds": 0.0, "cpu": None, "io": None})),
        NodeResult("n2", problem="n2: connection refused"),
    ]
    finding = findings_of(answers, "/venv/bin/python", "j1", 3.0)
    assert not finding.working
    assert finding.launchers == ()
    assert finding.summary() == "n2 did not answer (n2: connection refused)"
