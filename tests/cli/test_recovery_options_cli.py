"""--nodes, --min-nodes, --max-restarts, --restart-on: what they take, and bad input refused
with the fix (exit 2) before anything runs."""

from __future__ import annotations

import json

import pytest

from orchestrator.plan.request import JobRequest, LaunchSpec, RecoveryRequest
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
