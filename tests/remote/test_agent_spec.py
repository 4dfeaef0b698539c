"""The agent's spec as one value (remote/agent_spec.py): its wire form, what each node runs,
and the agent run from its shipped form on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from orchestrator.plan.agent_command import agent_command
from orchestrator.remote.agent_spec import AgentSpec, decode, encode, runs_root
from orchestrator.remote.logwire import decode_wire
from orchestrator.remote.procs import job_pids

FULL = AgentSpec(
    job_id="j1",
    workdir="/w",
    grace=3.0,
    files=(("a.json", "{}"), ("b.yaml", "x: 1\n")),
    private_sha256="ab" * 32,
    wait_for=("n1", 29500),
    main_port=29500,
    command=("python", "-m", "torch.distributed.run", "--node_rank=%n"),
    commands=(("a", "0"), ("b", "1")),
    node_rank_word="%n",
    env=(("ACCELERATE_MIXED_PRECISION", "no"),),
    path_first=(("PYTHONPATH", "/w"),),
    hosts=("n1", "n2"),
    label_lines=True,
    linger_s=60.0,
)


@pytest.mark.parametrize("spec", [AgentSpec("j"), FULL], ids=["least", "every-field"])
def test_the_spec_survives_its_wire_form(spec):
    assert AgentSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert decode(encode(spec)) == spec


def test_the_wire_form_keeps_pairs_as_objects():
    doc = FULL.to_dict()
    assert doc["files"] == {"a.json": "{}", "b.yaml": "x: 1\n"}
    assert doc["wait_for"] == ["n1", 29500] and doc["commands"] == [["a", "0"], ["b", "1"]]
    # What is left at its default stays off the agent's command line.
    assert AgentSpec("j").to_dict() == {"job_id": "j"}


def test_an_unknown_field_is_refused():
    with pytest.raises(TypeError):
        AgentSpec.from_dict({"job_id": "j", "wait_timeout": 120})


@pytest.mark.parametrize(
    ("spec", "rank", "argv"),
    [
        (AgentSpec("j", command=("run", "--node_rank=%n"), node_rank_word="%n"), "2",
         ["run", "--node_rank=2"]),
        (AgentSpec("j", command=("run", "%n")), "2", ["run", "%n"]),
        (AgentSpec("j", command=("all",), commands=(("first",), ("second",))), "1", ["second"]),
        (AgentSpec("j", command=("ignored",), shell="exec x $ORCH_NODE_RANK"), "1",
         ["/bin/sh", "-c", "exec x $ORCH_NODE_RANK"]),
    ],
)  # fmt: skip
def test_each_node_runs_its_command(spec, rank, argv):
    assert spec.node_argv(rank) == argv


@pytest.mark.process
def test_the_shipped_agent_runs_a_command_and_sweeps_what_it_left(tmp_path):
    # The agent as a node runs it (every part loaded beside it), with pdsh's %h and %n filled.
    job_id = f"spec-{uuid.uuid4().hex[:8]}"
    spec = AgentSpec(job_id, workdir=str(tmp_path), command=(
        "sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo node=$ORCH_NODE rank=$ORCH_NODE_RANK",
    ))  # fmt: skip
    command = agent_command(sys.executable, spec).replace("%h", "here").replace("%n", "0")
    result = subprocess.run(["sh", "-c", command], capture_output=True, timeout=60, check=False)
    records = [decode_wire(line + b"\n") for line in result.stdout.splitlines()]
    lines = [r.text for r in records if r and r.kind == "line"]
    [exit_fields] = [r.fields for r in records if r and r.kind == "control" and r.text == "exit"]
    assert result.returncode == 0, result.stderr
    assert "node=here rank=0" in lines
    assert exit_fields == {"code": 0, "node": "here"}
    assert job_pids(job_id, "here") == []  # the sleep left behind was ended
    subprocess.run(["rm", "-rf", f"{runs_root(os.getuid())}/{job_id}"], check=False)
