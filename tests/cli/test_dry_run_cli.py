"""`orch launch/submit --dry-run` as a validator, through the real entry point in this
process: what the user sees of a missing script, an unset variable, a runs directory the
launch cannot use, the accelerate settings, secrets, and commands to paste."""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from launch_support import REPO


def _hostfile(tmp_path: Path) -> str:
    path = tmp_path / "hostfile"
    path.write_text("a1 slots=2\na2 slots=2\n")
    return str(path)


def test_a_missing_script_is_a_warning_and_the_plan_still_shows(tmp_path, orch_here):
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "torchrun",
                        "--dry-run", "no_such_train.py"], tmp_path / "runs")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("job ")
    assert f"warning: training script no_such_train.py does not exist on this machine " \
           f"({REPO}/no_such_train.py)\n  fix: check the path" in result.stderr
    as_json = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--dry-run", "--json",
                         "no_such_train.py"], tmp_path / "runs")  # fmt: skip
    [finding] = json.loads(as_json.stdout)["findings"]
    assert (finding["level"], finding["subject"], as_json.returncode) == ("warning", "script", 0)


def test_a_runs_directory_others_can_write_is_an_error_with_the_launchs_exit_code(
    tmp_path, orch_here
):
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    runs.chmod(0o777)
    script = str(REPO / "recipes" / "scripts" / "cpu_smoke.py")
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--dry-run", script], runs)
    assert result.returncode == 73  # as the real launch, which refuses to write there
    assert "record: " in result.stdout  # the plan is shown all the same
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"{runs} (owner " in error and "mode 0777) is writable by others" in error
    assert f"fix: chmod go-w -- {runs}, and run again" in result.stderr
    assert list(runs.iterdir()) == []  # nothing written


def test_an_unset_variable_in_a_recipe_is_a_usage_error_at_its_line(
    tmp_path, orch_here, monkeypatch
):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: train.py\nlauncher: torchrun\n"
                      "args: [--data, '${ORCH_TEST_DATA}/set']\n")  # fmt: skip
    monkeypatch.delenv("ORCH_TEST_DATA", raising=False)
    argv = ["submit", str(recipe), "--hostfile", _hostfile(tmp_path), "--dry-run"]
    refused = orch_here(argv, tmp_path / "runs")
    assert refused.returncode == 2 and refused.stdout == ""
    assert f"error: {recipe}:4: args.1: ${{ORCH_TEST_DATA}} in '${{ORCH_TEST_DATA}}/set' is " \
           "not set on the head" in refused.stderr
    assert "hint: export ORCH_TEST_DATA=... before running orch" in refused.stderr
    monkeypatch.setenv("ORCH_TEST_DATA", "/data")
    shown = orch_here([*argv, "--json"], tmp_path / "runs")
    assert shown.returncode == 0 and json.loads(shown.stdout)["args"] == ["--data", "/data/set"]


def test_a_misspelled_recipe_key_gets_its_spelling_and_an_example(tmp_path, orch_here):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nscript: train.py\naccelerate:\n  zero_stag: 3\n")
    result = orch_here(["submit", str(recipe), "--dry-run"], tmp_path / "runs")
    assert result.returncode == 2
    assert f"error: {recipe}:4: unknown key 'accelerate.zero_stag'" in result.stderr
    assert "hint: did you mean 'zero_stage'? see recipes/diffsynth-wan22-i2v-4x8.yaml" \
        in result.stderr


def test_the_plain_dry_run_shows_deepspeed_settings_and_masks_only_secrets(tmp_path, orch_here):
    recipe = str(REPO / "recipes" / "deepspeed-zero3-fp16-pdsh-2x8.yaml")
    result = orch_here(["submit", recipe, "--dry-run", "--env", "HF_TOKEN=hunter22",
                        "--env", "CUDA_VISIBLE_DEVICES=0,1"], tmp_path / "runs")  # fmt: skip
    lines = result.stdout.splitlines()
    assert ("accelerate: DeepSpeed ZeRO stage 3, zero3_init_flag, zero3_save_16bit_model, "
            "mixed precision fp16, gradient accumulation 1, gradient clipping 1") in lines
    agent = next(line for line in lines if line.startswith("every node's agent"))
    assert "NCCL_DEBUG=INFO" in agent and "CUDA_VISIBLE_DEVICES=0,1" in agent
    assert "HF_TOKEN='***'" in agent and "hunter22" not in result.stdout
    assert any(line.startswith("record: ") and line.endswith(" (not written)") for line in lines)


def test_long_commands_are_written_whole_and_named_to_run(tmp_path, orch_here):
    result = orch_here(["launch", "--hostfile", _hostfile(tmp_path), "--launcher", "standard",
                        "--dry-run", "--", "train.py", "--lr", "1"], tmp_path / "runs")  # fmt: skip
    job_id = result.stdout.split()[1].rstrip(":")
    # In the user's own directory under the temporary one (the test's: conftest's orch_here).
    written = sorted(Path(tempfile.gettempdir()).glob(f"orch-*/dry-runs/{job_id}/*.sh"))
    assert [path.name for path in written] == ["head.sh", "teardown.sh"]
    assert written[0].parent.stat().st_mode & 0o777 == 0o700
    for path in written:
        line = next(line for line in result.stdout.splitlines() if str(path) in line)
        assert shlex.split(line)[:2] == ["sh", str(path)]
    command = written[0].read_text().splitlines()[-1]
    assert "..." not in command and " -w a1,a2 " in command
    assert not (tmp_path / "runs").exists()
