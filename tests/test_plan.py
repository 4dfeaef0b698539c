"""The launch plan, built and checked as a value: no process, no network."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file

from orchestrator.errors import UsageError
from orchestrator.plan.launch_plan import (
    ENV_FILE_NAME,
    HEAD_LAUNCHER_NAME,
    HOSTFILE_NAME,
    PDSH_CONFIG_NAME,
    PDSH_SPEC_NAME,
    build_plan,
    plan_summary,
    rendered_pdsh_config,
    standard_config_name,
)
from orchestrator.specs.inventory import make_hostfile
from orchestrator.specs.jobenv import JOB_ID_VAR

HOSTS = make_hostfile(["n1", "n2", "n3"], 2)


def _plan(launcher: str, **kw):
    base = dict(
        job_id="job-1",
        hostfile=HOSTS,
        script="train.py",
        args=["--lr", "0.1", "two words"],
        launcher=launcher,
        python="/opt/py/bin/python",
        workdir="/work/x",
        run_dir="/runs/job-1",
        main_port=29511,
        environ={"NCCL_DEBUG": "INFO", "HOME": "/root"},
    )
    base.update(kw)
    return build_plan(**base)


def test_torchrun_plan_rendezvous_at_node0_with_the_job_id():
    plan = _plan("torchrun")
    cmd = plan.node_command
    assert cmd[:3] == ("/opt/py/bin/python", "-m", "torch.distributed.run")
    assert "--nnodes=3" in cmd and "--nproc_per_node=2" in cmd
    assert "--rdzv_backend=c10d" in cmd
    assert "--rdzv_endpoint=n1:29511" in cmd and "--rdzv_id=job-1" in cmd
    assert cmd[-4:] == ("train.py", "--lr", "0.1", "two words")
    assert plan.head_command == ()
    assert plan.hosts == ("n1", "n2", "n3")


def test_job_env_carries_the_job_id_and_nccl_settings_not_the_rest():
    env = dict(_plan("torchrun", extra_env={"HF_TOKEN": "s3cret"}).env)
    assert env[JOB_ID_VAR] == "job-1"
    assert env["NCCL_DEBUG"] == "INFO"
    assert "HOME" not in env
    assert env["HF_TOKEN"] == "s3cret"


def test_pdsh_plan_runs_accelerate_on_the_head_with_its_files():
    plan = _plan("pdsh")
    assert plan.head_command[:5] == (
        "/opt/py/bin/python", f"/runs/job-1/{HEAD_LAUNCHER_NAME}",
        f"/runs/job-1/{PDSH_SPEC_NAME}", "--config_file", f"/runs/job-1/{PDSH_CONFIG_NAME}",
    )  # fmt: skip
    assert plan.head_command[-4:] == ("train.py", "--lr", "0.1", "two words")
    config = yaml.safe_load(rendered_pdsh_config(plan))
    assert config["num_machines"] == 3
    assert config["num_processes"] == 6
    assert config["deepspeed_config"]["deepspeed_multinode_launcher"] == "pdsh"
    assert config["deepspeed_config"]["deepspeed_hostfile"] == f"/runs/job-1/{HOSTFILE_NAME}"
    assert plan.file(HOSTFILE_NAME).content == "n1 slots=2\nn2 slots=2\nn3 slots=2\n"
    env_file = plan.file(ENV_FILE_NAME)
    assert f"{JOB_ID_VAR}=job-1\n" in env_file.content
    # The env file holds real values: it is never kept in the run directory.
    assert env_file.run_dir is False


def test_pdsh_head_launcher_writes_the_config_the_dry_run_shows(tmp_path):
    plan = _plan("pdsh", run_dir=str(tmp_path))
    for planned in plan.files:
        if planned.run_dir:
            (tmp_path / planned.name).write_text(planned.content)
    launcher = plan.file(HEAD_LAUNCHER_NAME).content
    # It runs in the job's interpreter, where orch need not be installed.
    assert "import orchestrator" not in launcher and "from orchestrator" not in launcher
    namespace: dict = {"__name__": "head_launcher"}
    exec(compile(launcher, HEAD_LAUNCHER_NAME, "exec"), namespace)
    written = namespace["write_config"](str(tmp_path / PDSH_SPEC_NAME))
    assert written == str(tmp_path / PDSH_CONFIG_NAME)
    text = (tmp_path / PDSH_CONFIG_NAME).read_text()
    assert text == plan_summary(plan)["files"][PDSH_CONFIG_NAME]
    assert text.startswith("# accelerate config written by orch (pdsh launcher, 3 x 2)")
    loaded = load_config_from_file(written)
    assert loaded.num_machines == 3 and loaded.main_process_port == 29511
    assert loaded.deepspeed_config["deepspeed_hostfile"] == str(tmp_path / HOSTFILE_NAME)


def test_pdsh_head_launcher_without_arguments_prints_its_usage(tmp_path):
    path = tmp_path / HEAD_LAUNCHER_NAME
    path.write_text(_plan("pdsh").file(HEAD_LAUNCHER_NAME).content)
    done = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "usage: accelerate_head.py SPEC.json" in done.stderr


def test_standard_plan_ships_one_config_per_machine_rank():
    plan = _plan("standard")
    configs = [yaml.safe_load(plan.file(standard_config_name(k)).content) for k in range(3)]
    assert [c["machine_rank"] for c in configs] == [0, 1, 2]
    for config in configs:
        config.pop("machine_rank")
        assert config == configs[0]
    assert all(plan.file(standard_config_name(k)).ship for k in range(3))
    assert plan.wait_for_main
    shell = plan.node_command[2]
    assert '"$ORCH_NODE_DIR/accelerate-rank$ORCH_NODE_RANK.yaml"' in shell
    assert shell.endswith(shlex.join(["train.py", "--lr", "0.1", "two words"]))


def test_nproc_per_node_overrides_the_slots():
    plan = _plan("torchrun", nproc_per_node=1)
    assert "--nproc_per_node=1" in plan.node_command
    assert plan_summary(plan)["world_size"] == 3


def test_dry_run_summary_redacts_secrets_everywhere():
    plan = _plan("pdsh", extra_env={"WANDB_API_KEY": "abcd1234"})
    text = str(plan_summary(plan))
    assert "abcd1234" not in text
    assert plan_summary(plan)["env"]["WANDB_API_KEY"] == "***"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"launcher": "mpirun"}, "unknown launcher"),
        ({"script": ""}, "no training script"),
        ({"main_port": 70000}, "out of range"),
    ],
)
def test_bad_options_are_usage_errors(change, message):
    with pytest.raises(UsageError, match=message):
        _plan(change.pop("launcher", "torchrun"), **change)


def test_plan_is_frozen():
    plan = _plan("torchrun")
    with pytest.raises(AttributeError):
        plan.job_id = "other"  # type: ignore[misc]
