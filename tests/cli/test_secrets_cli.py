"""What `orch launch` and `orch submit` keep secret, through the real entry point: --env
values out of the dry run (and env.json) unless kept, a warning for script arguments that
look like secrets."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.cli.jobs.job_options import secret_args_warnings


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=1\na2 slots=1\n")
    return str(path)


def test_launch_redacts_every_env_value_but_the_kept_and_warns_of_secret_arguments(
    tmp_path: Path, orch_here
) -> None:
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "torchrun",
                        "--env", "DB_PASS=hunter22", "--env", "MODE=train",
                        "--env-keep", "MODE", "--dry-run", "--json",
                        "train.py", "--", "--hf_token", "hf_abc", "--lr", "1"],
                       tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)  # the warning goes to stderr only
    assert plan["env"]["DB_PASS"] == "***" and plan["env"]["MODE"] == "train"
    assert "hunter22" not in result.stdout
    [warning] = [line for line in result.stderr.splitlines() if "--hf_token" in line]
    assert "/proc/<pid>/cmdline" in warning and "--env HF_TOKEN" in warning
    assert "hf_abc" not in result.stderr  # the warning names the option, not its value


def test_submit_takes_the_recipes_env_keep_and_warns_of_its_arguments(tmp_path, orch_here):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: t.py\nlauncher: torchrun\n"
                      "args: [--api-key, k123]\nenv: {MODE: a, LEVEL: b}\n"
                      "env_keep: [MODE]\n")  # fmt: skip
    argv = ["submit", str(recipe), "--hostfile", _hostfile(tmp_path), "--env-keep", "LEVEL",
            "--dry-run", "--json"]  # fmt: skip
    result = orch_here(argv, tmp_path / "runs")
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["env"]
    assert (env["MODE"], env["LEVEL"]) == ("a", "b")
    assert "--api-key looks like a secret" in result.stderr


def test_no_warning_without_a_secret_argument() -> None:
    assert secret_args_warnings(("--tokenizer", "gpt2", "--lr", "1")) == []
    [line] = secret_args_warnings(("--password=x",))
    assert line.startswith("warning: the script's argument --password looks like a secret")
    assert "export PASSWORD=... on the head, add --env PASSWORD" in line
