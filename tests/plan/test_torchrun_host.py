"""torchrun's c10d store host, said by the plan: node 0's torchrun hosts it, no other,
whatever names or addresses the hostfile gives (torch's own guess makes every node the host
of a loopback endpoint, and none of an address on a secondary NIC)."""

from __future__ import annotations

import sys

import pytest

from orchestrator.plan.build import build_plan
from orchestrator.plan.describe import node_runs
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.launchers.torchrun import rdzv_conf_with_host, split_rdzv_conf
from orchestrator.plan.request import LaunchSpec
from orchestrator.specs.inventory import make_hostfile

HEAD = HeadContext("pdsh", "/tmp/orch-job-1", sys.executable)


def _plan(hosts: list[str], slots: int = 2, torchrun_args: tuple[str, ...] = ()):
    spec = LaunchSpec(script="train.py", launcher="torchrun", python="/opt/py/bin/python",
                      workdir="/work/x", torchrun_args=torchrun_args)  # fmt: skip
    place = Placement(job_id="job-1", hostfile=make_hostfile(hosts, slots),
                      run_dir="/runs/job-1", main_port=29511)  # fmt: skip
    return build_plan(spec, place, HEAD)


def _rdzv_confs(command: tuple[str, ...]) -> list[str]:
    return [word for word in command if word.startswith(("--rdzv_conf", "--rdzv-conf"))]


@pytest.mark.parametrize("hosts", [["n1", "n2", "n3"], ["127.0.0.1", "127.0.0.2", "127.0.0.3"]])
def test_node_0s_torchrun_hosts_the_store_and_no_other(hosts):
    plan = _plan(hosts)
    commands = [plan.command_of(rank) for rank in range(3)]
    assert [_rdzv_confs(c) for c in commands] == [
        ["--rdzv_conf=is_host=true"], ["--rdzv_conf=is_host=false"], ["--rdzv_conf=is_host=false"]
    ]  # fmt: skip
    # Each node's agent runs its own, as the spec says and the dry run shows.
    spec = plan.launch.agent_spec
    assert [tuple(spec.node_argv(str(rank))) for rank in range(3)] == commands
    assert "--rdzv_conf=is_host=true" in node_runs(plan, 0)
    assert "--rdzv_conf=is_host=false" in node_runs(plan, 2)
    assert f"--rdzv_endpoint={hosts[0]}:29511" in commands[2]


def test_a_recipes_rdzv_conf_is_kept_beside_is_host_which_orch_says():
    plan = _plan(["n1", "n2"], torchrun_args=(
        "--max_restarts=1", "--rdzv_conf", "read_timeout=120,is_host=false",
        "--rdzv-conf=join_timeout=30", "--monitor_interval=1",
    ))  # fmt: skip
    node0, node1 = plan.command_of(0), plan.command_of(1)
    assert _rdzv_confs(node0) == ["--rdzv_conf=read_timeout=120,join_timeout=30,is_host=true"]
    assert _rdzv_confs(node1) == ["--rdzv_conf=read_timeout=120,join_timeout=30,is_host=false"]
    assert "--max_restarts=1" in node0 and "--monitor_interval=1" in node0
    assert "read_timeout=120,is_host=false" not in node0


def test_rdzv_conf_values_merge_as_torch_parses_them():
    assert split_rdzv_conf(["--a", "--rdzv_conf", "x=1", "--b=2", "--rdzv-conf=y=2"]) == (
        ("--a", "--b=2"), ("x=1", "y=2")
    )  # fmt: skip
    assert split_rdzv_conf(["--rdzv_conf"]) == ((), ("",))
    assert rdzv_conf_with_host(["x=1, y=2", "x=3"], False) == "x=3,y=2,is_host=false"
    assert rdzv_conf_with_host([], True) == "is_host=true"
