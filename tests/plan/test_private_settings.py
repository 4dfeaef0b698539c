"""What a job keeps secret in its plan: env.json's values (--env-keep), the nonce that keeps
the private settings' hash on the agent's command line from saying anything of them."""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import replace

import pytest

from orchestrator.errors import UsageError
from orchestrator.plan.build import build_plan
from orchestrator.plan.describe import plan_summary, plan_text
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import (
    HostsRequest,
    JobRequest,
    LaunchSpec,
    SbatchRequest,
    kept_env,
    recipe_spec,
)
from orchestrator.plan.sbatch_script import submit_argv
from orchestrator.specs.inventory import make_hostfile
from orchestrator.specs.recipe import parse_recipe

HOSTS = make_hostfile(["n1", "n2"], 2)
PLACE = Placement(job_id="job-1", hostfile=HOSTS, run_dir="/runs/job-1", main_port=29511)
HEAD = HeadContext("/usr/bin/pdsh", "/tmp/orch-job-1", sys.executable,
                   environ={"NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_head", "DB_URL": "pg://u:p@h"})
ENV = (("DB_PASS", "hunter22"), ("MODE", "train"), ("CUDA_VISIBLE_DEVICES", "0,1"),
       ("WANDB_API_KEY", "wandb123"))  # fmt: skip


def _plan(launcher: str = "torchrun", head: HeadContext = HEAD, **spec):
    values = dict(script="train.py", launcher=launcher, python="/py", workdir="/w", env=ENV,
                  passthrough=("DB_URL",))  # fmt: skip
    return build_plan(LaunchSpec(**{**values, **spec}), PLACE, head)


def test_only_values_that_look_secret_are_redacted() -> None:
    plan = _plan(env=(*ENV, ("API_HOST_ID", "3f2a9c1e7b4d8a6f0e5c2b9d1a7f3e8c"),
                      ("KEPT_ID", "3f2a9c1e7b4d8a6f0e5c2b9d1a7f3e8d")),
                 env_keep=("KEPT_ID", "WANDB_API_KEY"))  # fmt: skip
    assert plan.redacted_env == {
        "ORCH_JOB_ID": "job-1",  # orch's own, and the head's NCCL_*, show as they are
        "ORCH_RESTART_COUNT": "0",
        "ORCH_STOP_SIGNAL": "SIGTERM",  # how a stop reaches the ranks, and their grace
        "ORCH_STOP_GRACE": "120",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "135",
        "NCCL_DEBUG": "INFO",
        "DB_PASS": "***",  # a secret by its name (the word PASS)
        "MODE": "train",  # what the user set shows, unless it looks secret
        "CUDA_VISIBLE_DEVICES": "0,1",
        "WANDB_API_KEY": "***",  # a secret by name stays one, kept or not
        "DB_URL": "***",  # forwarded from the head: always
        "API_HOST_ID": "***",  # no secret by its name, but its value reads as a token
        "KEPT_ID": "3f2a9c1e7b4d8a6f0e5c2b9d1a7f3e8d",  # --env-keep: shown all the same
    }
    for shown in (json.dumps(plan_summary(plan)), plan_text(plan)):
        assert "hunter22" not in shown and "pg://" not in shown and "wandb123" not in shown
        assert "3f2a9c1e7b4d8a6f0e5c2b9d1a7f3e8c" not in shown


def test_what_is_secret_by_name_value_or_forwarding_is_masked_in_logs() -> None:
    # Log lines are masked by value: every `train` or `0,1` in a rank's output must survive.
    assert _plan().secret_names == {"WANDB_API_KEY", "DB_URL", "DB_PASS"}


def test_the_private_settings_hold_a_nonce_their_hash_covers() -> None:
    plan = _plan()
    private = json.loads(plan.node_private)
    assert len(private["nonce"]) == 32 and private["nonce"] == HEAD.private_nonce
    wanted = hashlib.sha256(plan.node_private.encode()).hexdigest()
    assert plan.launch.agent_spec.private_sha256 == wanted
    command = " ".join(plan.launch.head_process.argv)
    assert HEAD.private_nonce not in command and "hunter22" not in command
    # Two jobs with the same settings and a new head each: nothing in common on the line.
    other = _plan(head=replace(HEAD, private_nonce=HeadContext("p", "d", "py").private_nonce))
    assert other.launch.agent_spec.private_sha256 != plan.launch.agent_spec.private_sha256
    # The same job built again (with the port node 0 picks) keeps the same settings.
    again = build_plan(
        LaunchSpec(script="train.py", launcher="torchrun", python="/py", workdir="/w", env=ENV,
                   passthrough=("DB_URL",)),
        replace(PLACE, main_port=29600), HEAD,
    )  # fmt: skip
    assert again.node_private == plan.node_private


@pytest.mark.parametrize("launcher", ["pdsh", "standard"])
def test_every_launcher_hashes_the_settings_with_their_nonce(launcher: str) -> None:
    plan = _plan(launcher)
    assert json.loads(plan.node_private)["nonce"] == HEAD.private_nonce
    wanted = hashlib.sha256(plan.node_private.encode()).hexdigest()
    assert plan.launch.agent_spec.private_sha256 == wanted


def test_env_keep_comes_from_the_recipe_and_the_command_line_and_reaches_the_batch() -> None:
    recipe = parse_recipe("name: r\nscript: t.py\nnproc_per_node: 1\nenv: {MODE: a, PW: b}\n"
                          "env_keep: [MODE]\nslurm: {nodes: 1}\n")  # fmt: skip
    spec = kept_env(recipe_spec(recipe, "r.yaml"), ["LEVEL", "MODE"])
    assert spec.env_keep == ("MODE", "LEVEL")
    with pytest.raises(UsageError, match="invalid environment variable name"):
        kept_env(spec, ["NOT-A-NAME"])
    request = JobRequest(spec=spec, recipe=recipe, sbatch=SbatchRequest(),
                         hosts=HostsRequest(nodes=1), env_keep=("LEVEL",))  # fmt: skip
    argv = submit_argv(request, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert argv[-2:] == ("--env-keep", "LEVEL")  # the recipe says MODE again itself


def test_a_recipe_env_keep_name_is_checked() -> None:
    with pytest.raises(UsageError, match="env_keep"):
        parse_recipe("name: r\nscript: t.py\nenv_keep: ['a b']\n")
