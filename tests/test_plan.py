"""The launch plan, built and checked as a value: no process, no network."""

from __future__ import annotations

import shlex

import pytest
import yaml

from orchestrator.errors import UsageError
from orchestrator.inventory import make_hostfile
from orchestrator.jobenv import JOB_ID_VAR
from orchestrator.plan import (
    ENV_FILE_NAME,
    HOSTFILE_NAME,
    PDSH_CONFIG_NAME,
    build_plan,
    plan_summary,
    standard_config_name,
)

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
        "/opt/py/bin/python", "-m", "accelerate.commands.launch", "--config_file",
        f"/runs/job-1/{PDSH_CONFIG_NAME}",
    )  # fmt: skip
    assert plan.head_command[-4:] == ("train.py", "--lr", "0.1", "two words")
    config = yaml.safe_load(plan.file(PDSH_CONFIG_NAME).content)
    assert config["num_machines"] == 3
    assert config["num_processes"] == 6
    assert config["deepspeed_config"]["deepspeed_multinode_launcher"] == "pdsh"
    assert config["deepspeed_config"]["deepspeed_hostfile"] == f"/runs/job-1/{HOSTFILE_NAME}"
    assert plan.file(HOSTFILE_NAME).content == "n1 slots=2\nn2 slots=2\nn3 slots=2\n"
    env_file = plan.file(ENV_FILE_NAME)
    assert f"{JOB_ID_VAR}=job-1\n" in env_file.content
    # The env file holds real values: it is never kept in the run directory.
    assert env_file.run_dir is False


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
    assert '"$ORCH_NODE_DIR/accelerate_$ORCH_NODE_RANK.yaml"' in shell
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
