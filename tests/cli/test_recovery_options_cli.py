"""--nodes, --min-nodes, --max-restarts, --restart-on: what they take, and bad input refused
with the fix (exit 2) before anything runs."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from _report_job import JOB, failed_job

from orchestrator.plan.request import JobRequest, LaunchSpec, RecoveryRequest
from orchestrator.records.job import AttemptRecord
from orchestrator.specs.recipe import Recipe, RecoveryOptions


def _hostfile(tmp_path, nodes: int = 3) -> str:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"a{n} slots=2\n" for n in range(1, nodes + 1)))
    return str(path)


def _launch(tmp_path, orch_here, *options: str):
    runs = tmp_path / "runs"
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), *options, "--dry-run",
                        "--json", "train.py"], runs)  # fmt: skip
    assert not runs.exists()  # nothing written, nothing run
    return result


def test_nodes_takes_the_first_of_the_hostfile_the_rest_are_spares(tmp_path, orch_here):
    result = _launch(tmp_path, orch_here, "--nodes", "2", "--max-restarts", "2")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [h["host"] for h in plan["hosts"]] == ["a1", "a2"] and plan["world_size"] == 4


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (("--nodes", "4"),
         ["--nodes 4: ", "has 3 node(s) (a[1-3])", "hint: ask for at most 3 (--nodes 3)"]),
        (("--nodes", "2", "--min-nodes", "3"),
         ["--min-nodes 3 is above --nodes 2", "give --min-nodes 2 or less"]),
        (("--min-nodes", "4"), ["--min-nodes 4 is above the 3 node(s) of"]),
        (("--max-restarts", "-1"), ["'--max-restarts'", "greater than or equal to"]),
        (("--nodes", "0"), ["'--nodes'", "greater than or equal to"]),
        (("--min-nodes", "0"), ["'--min-nodes'", "greater than or equal to"]),
        (("--restart-on", "sometimes"), ["--restart-on 'sometimes'", "--restart-on any"]),
    ],
)
def test_bad_counts_exit_2_with_the_fix_before_anything_runs(tmp_path, orch_here, options,
                                                              said):  # fmt: skip
    result = _launch(tmp_path, orch_here, *options)
    assert result.returncode == 2, result.stderr
    for words in said:
        assert words in result.stderr, result.stderr


def _policy(request: JobRequest) -> tuple[int, str, int | None]:
    return request.max_restarts, request.restart_on, request.min_nodes


def test_the_command_line_wins_over_the_recipes_recovery():
    recovery = RecoveryOptions(max_restarts=3, restart_on="any", min_nodes=2)
    recipe = Recipe(name="r", script="train.py", recovery=recovery)
    assert _policy(JobRequest(spec=LaunchSpec("train.py"), recipe=recipe)) == (3, "any", 2)
    given = RecoveryRequest(max_restarts=0, restart_on="infra", min_nodes=1)
    request = JobRequest(spec=LaunchSpec("train.py"), recipe=recipe, recovery=given)
    assert _policy(request) == (0, "infra", 1)
    assert JobRequest(spec=LaunchSpec("train.py")).max_restarts == 0


def test_status_lists_the_attempts_and_logs_reads_an_earlier_ones(tmp_path, orch_here):
    runs = tmp_path / "runs"
    run = failed_job(runs)
    cause = {"class": "node-lost", "message": "node lost: n3 (did not answer the re-check)",
             "decision": "node-lost: a node was lost; restarting (1 restart(s) left)"}  # fmt: skip
    first = AttemptRecord(number=1, nodes=("n1", "n2", "n3"), started="t0", ended="t1",
                          exit_code=1, cause=cause, excluded=("n3",),
                          logs="attempts/1/logs")  # fmt: skip
    last = AttemptRecord(number=2, nodes=("n1", "n2"), started="t1", ended="t2", exit_code=1)
    run.save(replace(run.load(), attempt=2, attempts=(first, last)))
    earlier = run.path / "attempts" / "1" / "logs"
    earlier.mkdir(parents=True)
    (earlier / "n3.log").write_text("2026-11-25T10:00:00.000Z r0/0 out the first attempt\n")
    shown = orch_here(["status", JOB, "--runs-dir", str(runs)], runs)
    assert shown.returncode == 0, shown.stderr
    assert "attempts: 2" in shown.stdout
    assert ("  1: n1, n2, n3: exit 1: node lost: n3 (did not answer the re-check) (node-lost: "
            "a node was lost; restarting (1 restart(s) left)); dropped n3") in shown.stdout
    as_json = json.loads(orch_here(["status", JOB, "--json", "--runs-dir", str(runs)], runs).stdout)
    assert [a["number"] for a in as_json["attempts"]] == [1, 2]
    assert as_json["attempts"][0]["cause"]["class"] == "node-lost"
    logs = orch_here(["logs", JOB, "--attempt", "1", "-w", "n3", "--runs-dir", str(runs)], runs)
    assert logs.returncode == 0 and "the first attempt" in logs.stdout, logs.stderr
    missing = orch_here(["logs", JOB, "--attempt", "7", "--runs-dir", str(runs)], runs)
    assert missing.returncode == 2 and "has no attempt 7" in missing.stderr
