"""A plan's checkpoints, built as a value: the directory made absolute in the job's workdir,
in every rank's environment on every attempt, refused where srun starts the nodes."""

from __future__ import annotations

import json
import sys

import pytest

from orchestrator.errors import UsageError
from orchestrator.plan.build import build_plan
from orchestrator.plan.describe import plan_summary, plan_text
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import CheckpointRequest, LaunchSpec, with_checkpoints
from orchestrator.specs.checkpoints import CheckpointSettings
from orchestrator.specs.constants import Transport
from orchestrator.specs.inventory import make_hostfile

HOSTS = make_hostfile(["n1", "n2"], 2)
HEAD = HeadContext("pdsh", "/tmp/orch-job-1", sys.executable, cwd="/home/me/project")


def _plan(spec: LaunchSpec, **place: object):
    values: dict = dict(job_id="job-1", hostfile=HOSTS, run_dir="/runs/job-1", main_port=29511)
    return build_plan(spec, Placement(**{**values, **place}), HEAD)


def test_a_relative_directory_is_the_workdirs_and_every_rank_sees_it() -> None:
    spec = LaunchSpec("train.py", launcher="torchrun", workdir="/work/x",
                      checkpoints=CheckpointSettings("out/ckpt", copies=2))  # fmt: skip
    plan = _plan(spec)
    assert plan.checkpoints == CheckpointSettings("/work/x/out/ckpt", copies=2)
    assert plan.job.env["ORCH_CHECKPOINT_DIR"] == "/work/x/out/ckpt"
    assert json.loads(plan.node_private)["env"]["ORCH_CHECKPOINT_DIR"] == "/work/x/out/ckpt"
    restarted = _plan(spec, restart_count=2)
    assert restarted.job.env["ORCH_CHECKPOINT_DIR"] == "/work/x/out/ckpt"
    assert restarted.job.env["ORCH_RESTART_COUNT"] == "2"


def test_without_a_workdir_the_heads_is_taken() -> None:
    spec = LaunchSpec("train.py", launcher="torchrun", checkpoints=CheckpointSettings("ckpt"))
    assert _plan(spec).job.env["ORCH_CHECKPOINT_DIR"] == "/home/me/project/ckpt"


def test_the_dry_run_shows_the_settings_and_the_json_keeps_them() -> None:
    spec = LaunchSpec("train.py", launcher="torchrun",
                      checkpoints=CheckpointSettings("/data/ckpt", bandwidth=0))  # fmt: skip
    plan = _plan(spec)
    assert "checkpoints: /data/ckpt, 1 copy on another node, no bandwidth cap" in \
        plan_text(plan).splitlines()
    assert plan_summary(plan)["checkpoints"] == {"dir": "/data/ckpt", "copies": 1,
                                                 "bandwidth": 0}  # fmt: skip


@pytest.mark.parametrize(
    "place",
    [{"fanout": "srun", "slurm_job": "77"}, {"fanout": "srun", "slurm_job": "77",
                                             "transport": Transport.SLURM}],
)  # fmt: skip
def test_nodes_srun_starts_are_refused(place: dict) -> None:
    spec = LaunchSpec("train.py", launcher="torchrun", checkpoints=CheckpointSettings("/c"))
    _plan(LaunchSpec("train.py", launcher="torchrun"), **place)  # fine without checkpoints
    with pytest.raises(UsageError, match="not supported yet on nodes started by srun") as no:
        _plan(spec, **place)
    assert no.value.hint and no.value.hint.startswith("run over SSH with a hostfile")


def test_the_options_given_win_over_the_recipes_settings() -> None:
    recipe = LaunchSpec("t.py", checkpoints=CheckpointSettings("ckpt", copies=2, bandwidth=5))
    given = with_checkpoints(recipe, CheckpointRequest(copies=3))
    assert given.checkpoints == CheckpointSettings("ckpt", copies=3, bandwidth=5)
    moved = with_checkpoints(recipe, CheckpointRequest(dir="/data/c/", bandwidth="off"))
    assert moved.checkpoints == CheckpointSettings("/data/c", copies=2, bandwidth=0)
    assert with_checkpoints(LaunchSpec("t.py"), CheckpointRequest()).checkpoints is None
    fresh = with_checkpoints(LaunchSpec("t.py"), CheckpointRequest(dir="c"))
    assert fresh.checkpoints == CheckpointSettings("c", copies=1, bandwidth=200_000_000)
