"""The profile taken now and then while a job runs, over fake nodes: when it is taken, what
it keeps in the record and what it says in the live view."""

from __future__ import annotations

import json
from pathlib import Path

from launch_support import wait_for

from orchestrator.nodes.fake import FakeNode, FakeTransport, Reply
from orchestrator.records.rundir import RunDir
from orchestrator.run.stacks import gather_stacks
from orchestrator.run.straggler_watch import EVERY_S, FIRST_AFTER_S, TAKEN_BY, StragglerWatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def _node(name: str, *ranks: tuple[int, int, str]) -> FakeNode:
    """A node whose stacks program answers with a py-spy profile of each (rank, pid, file)."""
    doc = {"node": name, "job_id": "job-1", "mode": "profile", "ranks": [
        {"rank": rank, "pid": pid, "method": "py-spy",
         "samples": (FIXTURES / sampled).read_text().splitlines()}
        for rank, pid, sampled in ranks
    ]}  # fmt: skip
    return FakeNode(name, {"": Reply(stdout=json.dumps(doc) + "\n")})


def _watch(tmp_path: Path, fake: FakeTransport) -> tuple[StragglerWatch, RunDir]:
    run = RunDir(tmp_path / "job-1").create()

    def take():  # type: ignore[no-untyped-def]
        return gather_stacks(["n1", "n2"], "job-1", "python3", 5.0, profile_seconds=1.0,
                             transport=fake)  # fmt: skip

    return StragglerWatch("job-1", take, run, lambda: "2026-11-29T00:00:00+00:00"), run


def _said(watch: StragglerWatch) -> list[str]:
    found: list[str] = []
    assert wait_for(lambda: found.extend(watch.said()) or found, 10)
    return found


def test_a_profile_is_taken_once_the_job_steps_and_names_the_rank_the_others_wait_for(
    tmp_path,
) -> None:
    fake = FakeTransport([_node("n1", (0, 13982, "record_waiting.txt")),
                          _node("n2", (1, 13983, "record_straggler.txt"))])  # fmt: skip
    watch, run = _watch(tmp_path, fake)
    watch.tick(100.0, stepped=False, busy=False)
    watch.tick(100.0 + 10 * FIRST_AFTER_S, stepped=False, busy=False)  # no step yet: no look
    watch.tick(1000.0, stepped=True, busy=False)
    watch.tick(1000.0 + FIRST_AFTER_S - 1, stepped=True, busy=False)
    assert fake.commands("n1") == []
    watch.tick(1000.0 + FIRST_AFTER_S, stepped=True, busy=False)
    [said] = _said(watch)
    assert said == (
        "profile: waited for: rank 1 on n2 (the other ranks wait 77% of their time in "
        "communication, it 3%), at /home/alice/train/stepping.py:29 compute"
    )
    [kept] = (run.path / "stacks").glob("*.json")
    doc = json.loads(kept.read_text())
    assert (doc["mode"], doc["taken_by"], doc["profile"]["straggler"]["rank"]) == (
        "profile", TAKEN_BY, 1)  # fmt: skip
    # The next one only EVERY_S later, and never while the job stops.
    watch.tick(1000.0 + FIRST_AFTER_S + EVERY_S - 1, stepped=True, busy=False)
    watch.tick(1000.0 + FIRST_AFTER_S + EVERY_S, stepped=True, busy=True)
    assert len(fake.commands("n1")) == 1


def test_a_node_that_cannot_be_profiled_is_said_and_nothing_raises(tmp_path) -> None:
    gone = _node("n2", (1, 13983, "record_straggler.txt")).unreachable()
    fake = FakeTransport([_node("n1", (0, 13982, "record_waiting.txt")), gone])
    watch, run = _watch(tmp_path, fake)
    watch.tick(0.0, stepped=True, busy=False)
    watch.tick(FIRST_AFTER_S, stepped=True, busy=False)
    [said] = _said(watch)
    # Not "no rank stands apart": the rank not read may be the one the others wait for.
    assert said.startswith("profile: incomplete, no rank named (n2")
    assert len(list((run.path / "stacks").glob("*.json"))) == 1
