"""--checkpoint-dir, --checkpoint-copies and --checkpoint-bandwidth on launch and submit: what
the ranks and the dry run see, a recipe's keys under the options given, and bad input
refused with the fix (exit 2) before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.plan.request import CheckpointRequest, JobRequest, LaunchSpec
from orchestrator.plan.sbatch_script import submit_argv


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=2\na2 slots=2\n")
    return str(path)


def _launch(tmp_path: Path, orch_here, *options: str, as_json: bool = True):
    runs = tmp_path / "runs"
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--workdir", "/work/x",
                        *options, "--dry-run", *(["--json"] if as_json else []), "train.py"],
                       runs)  # fmt: skip
    assert not runs.exists()  # nothing written, nothing run
    return result


def test_the_ranks_see_the_directory_in_the_workdir_and_the_plan_keeps_the_settings(
    tmp_path: Path, orch_here
) -> None:
    result = _launch(tmp_path, orch_here, "--checkpoint-dir", "ckpt", "--checkpoint-copies", "2",
                     "--checkpoint-bandwidth", "1G")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["env"]["ORCH_CHECKPOINT_DIR"] == "/work/x/ckpt"
    assert plan["checkpoints"] == {"dir": "/work/x/ckpt", "copies": 2, "bandwidth": 10**9}


def test_without_a_checkpoint_dir_orch_sets_nothing(tmp_path: Path, orch_here) -> None:
    plan = json.loads(_launch(tmp_path, orch_here).stdout)
    assert "ORCH_CHECKPOINT_DIR" not in plan["env"] and plan["checkpoints"] is None
    text = _launch(tmp_path, orch_here, as_json=False).stdout
    assert "checkpoints:" not in text


def test_the_dry_run_says_where_and_how_checkpoints_are_copied(tmp_path: Path, orch_here) -> None:
    result = _launch(tmp_path, orch_here, "--checkpoint-dir", "/data/ckpt", as_json=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "checkpoints: /data/ckpt, 1 copy on another node, at most 200 MB/s" in lines
    off = _launch(tmp_path, orch_here, "--checkpoint-dir", "/data/ckpt", "--checkpoint-copies",
                  "3", "--checkpoint-bandwidth", "off", as_json=False)  # fmt: skip
    assert "checkpoints: /data/ckpt, 3 copies on other nodes, no bandwidth cap" in \
        off.stdout.splitlines()


@pytest.mark.parametrize(
    ("options", "said"),
    [(("--checkpoint-dir", "~/ckpt"),
      ["--checkpoint-dir '~/ckpt': ~ is each node's own home", "give an absolute path",
       "hint: e.g. --checkpoint-dir /data/ckpt"]),
     (("--checkpoint-dir", "/c", "--checkpoint-copies", "0"),
      ["--checkpoint-copies 0: each checkpoint is copied to at least 1 other node"]),
     (("--checkpoint-dir", "/c", "--checkpoint-bandwidth", "fast"),
      ["--checkpoint-bandwidth 'fast' is not a rate in bytes per second"]),
     (("--checkpoint-copies", "2"),
      ["--checkpoint-copies goes with --checkpoint-dir", "hint: add --checkpoint-dir PATH"]),
     (("--checkpoint-bandwidth", "1G"), ["--checkpoint-bandwidth goes with --checkpoint-dir"]),
     (("--env", "ORCH_CHECKPOINT_DIR=/c"),
      ["ORCH_CHECKPOINT_DIR is set by orch for each job", "give --checkpoint-dir PATH"])],
)  # fmt: skip
def test_bad_checkpoint_options_exit_2_with_the_fix(tmp_path: Path, orch_here, options, said):
    result = _launch(tmp_path, orch_here, *options)
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    for words in said:
        assert words in text, text


def test_the_srun_fan_out_is_refused_with_the_way_over_ssh(tmp_path: Path, orch_here,
                                                            monkeypatch) -> None:  # fmt: skip
    for name, value in (("SLURM_JOB_ID", "77"), ("SLURM_JOB_NODELIST", "a[1-2]"),
                        ("SLURM_TASKS_PER_NODE", "2(x2)")):  # fmt: skip
        monkeypatch.setenv(name, value)
    argv = ["launch", "--slurm", "--launcher", "torchrun", "--dry-run", "--json", "train.py"]
    assert orch_here(argv, tmp_path / "runs").returncode == 0  # the allocation is fine alone
    result = orch_here([*argv[:-1], "--checkpoint-dir", "/c", "train.py"], tmp_path / "runs")
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert "--checkpoint-dir is not supported yet on nodes started by srun" in text
    assert "hint: run over SSH with a hostfile" in text


def test_a_recipes_checkpoints_are_used_and_the_options_given_win(tmp_path: Path,
                                                                   orch_here) -> None:  # fmt: skip
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: train.py\nlauncher: torchrun\nworkdir: /work/r\n"
                      "checkpoint_dir: ckpt\ncheckpoint_copies: 2\n")  # fmt: skip
    args = ["submit", str(recipe), "--hostfile", _hostfile(tmp_path), "--dry-run", "--json"]
    plan = json.loads(orch_here(args, tmp_path / "runs").stdout)
    assert plan["checkpoints"] == {"dir": "/work/r/ckpt", "copies": 2, "bandwidth": 200_000_000}
    assert plan["env"]["ORCH_CHECKPOINT_DIR"] == "/work/r/ckpt"
    given = orch_here([*args, "--checkpoint-copies", "3", "--checkpoint-bandwidth", "500k"],
                      tmp_path / "runs")  # fmt: skip
    assert json.loads(given.stdout)["checkpoints"] == {"dir": "/work/r/ckpt", "copies": 3,
                                                       "bandwidth": 500_000}  # fmt: skip
    moved = orch_here([*args, "--checkpoint-dir", "/data/c"], tmp_path / "runs")
    assert json.loads(moved.stdout)["checkpoints"]["dir"] == "/data/c"


def test_the_batch_scripts_submit_is_given_the_checkpoint_options_as_given() -> None:
    given = CheckpointRequest(dir="ckpt", copies=2, bandwidth="1G")
    argv = submit_argv(JobRequest(spec=LaunchSpec("t.py"), checkpoints=given), python="/py",
                       recipe="/r.yaml", job_id="j1", runs_dir="/runs")  # fmt: skip
    text = " ".join(argv)
    assert "--checkpoint-dir ckpt --checkpoint-copies 2 --checkpoint-bandwidth 1G" in text
    plain = submit_argv(JobRequest(spec=LaunchSpec("t.py")), python="/py", recipe="/r.yaml",
                        job_id="j1", runs_dir="/runs")  # fmt: skip
    assert not any(word.startswith("--checkpoint") for word in plain)


def test_a_batch_job_that_srun_would_start_is_refused_when_submitted(
    tmp_path: Path, orch_here
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: train.py\nlauncher: torchrun\ncheckpoint_dir: /c\n")
    argv = ["submit", str(recipe), "--sbatch", "--nodes", "2", "--dry-run"]
    result = orch_here(argv, tmp_path / "runs")
    assert result.returncode == 2, result.stderr
    assert "not supported yet on nodes started by srun" in " ".join(result.stderr.split())
    over_ssh = orch_here([*argv, "--fanout", "pdsh"], tmp_path / "runs")
    assert over_ssh.returncode == 0, over_ssh.stderr
    assert "#SBATCH --nodes=2" in over_ssh.stdout
