"""`--requeue`: a usage error outside --sbatch, before anything runs; with it, the batch
script lets Slurm requeue the job, keeps every allocation's output, and passes the option on
to the orch inside; the recipe's `slurm: {requeue: true}` does the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan.request import JobRequest, LaunchSpec, RequeueRequest
from orchestrator.plan.sbatch_script import submit_argv
from orchestrator.specs.recipe import parse_recipe
from orchestrator.specs.slurm import DEFAULT_MAX_REQUEUES, RequeueSettings


def _recipe(tmp_path: Path, slurm: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nscript: train.py\nlauncher: torchrun\nslurm:\n  nodes: 2\n" + slurm)
    return path


@pytest.mark.parametrize("extra", [["--requeue"], ["--max-requeues", "2"]])
def test_requeue_outside_sbatch_is_a_usage_error_before_anything_runs(
    tmp_path: Path, orch_here, extra: list[str]
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a1 slots=2\n")
    runs = tmp_path / "runs"
    result = orch_here(["submit", str(_recipe(tmp_path)), "--hostfile", str(hostfile), *extra],
                       runs)  # fmt: skip
    assert result.returncode == 2
    assert f"{extra[0]}: only a Slurm batch job is requeued" in result.stderr
    assert "--sbatch" in result.stderr
    assert not runs.exists()


def test_the_batch_script_asks_slurm_to_requeue_and_keeps_every_allocations_output(
    tmp_path: Path, orch_here
) -> None:
    args = ["submit", str(_recipe(tmp_path)), "--sbatch", "--dry-run"]
    plain = orch_here(args, tmp_path / "runs")
    assert plain.returncode == 0, plain.stderr
    assert "--requeue" not in plain.stdout and "--open-mode" not in plain.stdout
    result = orch_here([*args, "--requeue", "--max-requeues", "4"], tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --requeue\n#SBATCH --open-mode=append\n" in result.stdout
    inner = result.stdout.splitlines()[-1]
    assert inner.startswith("exec ") and " --requeue" in inner and "--max-requeues 4" in inner


def test_the_recipes_requeue_is_used_and_the_options_given_win(tmp_path: Path, orch_here) -> None:
    recipe = _recipe(tmp_path, "  requeue: true\n  max_requeues: 2\n")
    result = orch_here(["submit", str(recipe), "--sbatch", "--dry-run"], tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --requeue\n" in result.stdout
    assert "--max-requeues" not in result.stdout  # the recipe says it again inside
    loaded = parse_recipe(recipe.read_text(), source=str(recipe))
    request = JobRequest(spec=LaunchSpec("t.py"), recipe=loaded)
    assert request.requeue_settings == RequeueSettings(requeue=True, max_requeues=2)
    given = JobRequest(spec=LaunchSpec("t.py"), recipe=loaded,
                       requeue=RequeueRequest(max_requeues=7))  # fmt: skip
    assert given.requeue_settings.max_requeues == 7
    assert JobRequest(spec=LaunchSpec("t.py")).requeue_settings == RequeueSettings(
        requeue=False, max_requeues=DEFAULT_MAX_REQUEUES)


def test_the_batch_scripts_own_submit_is_given_requeue_as_given() -> None:
    asked = JobRequest(spec=LaunchSpec("t.py"), requeue=RequeueRequest(True, 3))
    argv = submit_argv(asked, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert "--requeue" in argv and argv[argv.index("--max-requeues") + 1] == "3"
    plain = submit_argv(JobRequest(spec=LaunchSpec("t.py")), python="/py", recipe="/r.yaml",
                        job_id="j1", runs_dir="/runs")  # fmt: skip
    assert "--requeue" not in plain and "--max-requeues" not in plain
