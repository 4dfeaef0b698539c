"""`orch launch --launcher torchrun` on a real sandbox: success, a failing rank, a frozen
node, Ctrl-C next to another job, `orch kill`, a dead head, and `orch status` on each."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from launch_support import (
    ALLREDUCE,
    all_ranks_up,
    job_ids,
    job_json,
    job_processes,
    launch_args,
    log_text,
    run_orch,
    start_orch,
    wait_for,
)

from orchestrator.run.collect import fetch_command

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def sandbox(sandbox_factory):
    """The module's 3-node, 2-slot sandbox (conftest's has 4 nodes): each job of one rank per
    node starts a torchrun and a rank on each node, so every node more costs two processes
    that import torch."""
    return sandbox_factory(3, 2)


def _names(state) -> list[str]:
    return [n.name for n in state.nodes]


def _status(runs: Path, job_id: str) -> dict:
    result = run_orch(["status", job_id, "--json"], runs)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_success_leaves_every_ranks_output_and_a_complete_record(sandbox, hostfile, tmp_path):
    _box, state = sandbox
    names = _names(state)
    result = run_orch(launch_args(hostfile, "torchrun", "--steps", "3"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "succeeded" in result.stderr
    [job_id] = job_ids(tmp_path)
    for rank, node in enumerate(names):
        log = log_text(tmp_path, job_id, node)
        assert f" r{rank}/0 out rank {rank} step 2 sum {sum(range(1, len(names) + 1))}\n" in log
        assert f" r{rank}/0 out rank {rank} done\n" in log
        assert "\r" not in log
    record = job_json(tmp_path, job_id)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert record["launcher"] == "torchrun" and record["hosts"] == names
    assert record["name"] == "allreduce"  # the script's, none being given
    # Hangs were looked for with no flag: the floor held, before or after a pace was learned.
    assert record["hang_watch"]["source"] in ("start-up floor", "floor")
    assert record["node_exit_codes"] == dict.fromkeys(names, 0)
    assert record["started_at"] and record["ended_at"]
    assert "--rdzv_backend=c10d" in record["command"]
    assert (tmp_path / job_id / "hostfile").read_text().split()[0] == names[0]
    assert json.loads((tmp_path / job_id / "env.json").read_text())["ORCH_JOB_ID"] == job_id
    assert _status(tmp_path, job_id)["state"] == "succeeded"


def test_failing_rank_sets_the_exit_code_names_node_and_rank_and_leaves_nothing(
    sandbox, hostfile, tmp_path
):
    """With --json: the final record alone on stdout, the job's output and summary on
    stderr, the job's exit code."""
    _box, state = sandbox
    names = _names(state)
    args = launch_args(hostfile, "torchrun", "--steps", "2", "--fail-rank", "2", "--exit-code", "7")
    result = run_orch([args[0], "--json", *args[1:]], tmp_path)
    assert result.returncode == 7, result.stderr
    assert f"first failure: {names[2]} rank 2" in result.stderr
    assert "rank 2 failing with exit code 7" in result.stderr or "exitcode  : 7" in result.stderr
    assert f"{names[0]}" in result.stderr and "step 0" in result.stderr  # the job's output
    [job_id] = job_ids(tmp_path)
    for node in names:
        assert job_processes(node, job_id) == [], f"job left running on {node}"
    doc = _status(tmp_path, job_id)
    assert json.loads(result.stdout) == doc
    assert doc["state"] == "failed" and doc["exit_code"] == 7
    assert doc["first_failure"]["node"] == names[2] and doc["first_failure"]["rank"] == 2
    text = run_orch(["status", job_id], tmp_path).stdout
    assert f"first failure: {names[2]} rank 2" in text


def test_sigint_stops_only_its_job_and_orch_kill_stops_the_other(sandbox, hostfile, tmp_path):
    _box, state = sandbox
    names = _names(state)
    first = start_orch(launch_args(hostfile, "torchrun", "--sleep", "600"), tmp_path,
                       tmp_path / "first.out")  # fmt: skip
    assert wait_for(lambda: len(job_ids(tmp_path)) == 1, 30)
    [job_a] = job_ids(tmp_path)
    # Two jobs on the same nodes need their own rendezvous ports (launch_args picks one).
    second_args = launch_args(hostfile, "torchrun", "--sleep", "600", "--steps", "1")
    second = start_orch(second_args, tmp_path, tmp_path / "second.out")
    try:
        assert wait_for(lambda: len(job_ids(tmp_path)) == 2, 30)
        job_b = next(j for j in job_ids(tmp_path) if j != job_a)
        assert wait_for(lambda: all_ranks_up(tmp_path, job_a, names), 120)
        assert wait_for(lambda: all_ranks_up(tmp_path, job_b, names), 120)

        first.send_signal(signal.SIGINT)
        assert first.wait(60) == 130
        for node in names:
            assert job_processes(node, job_a) == [], f"first job left on {node}"
            assert job_processes(node, job_b), f"second job was touched on {node}"
        assert _status(tmp_path, job_a)["state"] == "interrupted"
        assert _status(tmp_path, job_b)["state"] == "running"

        killed = run_orch(["kill", job_b], tmp_path, timeout=120)
        assert killed.returncode == 0, killed.stderr
        assert second.wait(60) == 143
        for node in names:
            assert job_processes(node, job_b) == [], f"second job left on {node}"
        assert _status(tmp_path, job_b)["state"] == "killed"
        listing = run_orch(["status"], tmp_path).stdout
        assert "interrupted" in listing and "killed" in listing
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()


def test_frozen_node_is_named_and_the_job_ends_long_before_the_collective_timeout(
    sandbox_factory, tmp_path
):
    box, state = sandbox_factory(2, 1)
    names = _names(state)
    out = tmp_path / "orch.out"
    runs = tmp_path / "runs"
    proc = start_orch(
        launch_args(state.hostfile, "torchrun", "--steps", "100000", "--step-sleep", "0.2"),
        runs, out,
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(job_ids(runs)) == 1, 30)
        [job_id] = job_ids(runs)
        assert wait_for(lambda: "step 5 " in log_text(runs, job_id, names[1]), 120)
        box.freeze(names[1])
        frozen_at = time.monotonic()
        code = proc.wait(90)
        took = time.monotonic() - frozen_at
        text = out.read_text()
        # Noticed by its silence (10 s without a heartbeat) and torn down without waiting
        # for it: well within a minute, never gloo's 300 s timeout. How fast exactly is
        # bench_teardown.py's to measure, not a test's on a shared machine.
        assert took < 60, text
        assert code != 0
        assert f"first failure: {names[1]}: stopped answering" in text
        # Its stop request went out, and nobody waited for the frozen node to answer it.
        assert f"stop request sent, not waited for; pdsh's answer goes to {runs}/{job_id}" in text
        assert job_processes(names[0], job_id) == []
        record = job_json(runs, job_id)
        assert record["first_failure"]["node"] == names[1]
        # Not asked twice: the teardown could not reach it, so its logs were not tried.
        assert record["node_logs"][names[0]] == "ok"
        assert record["node_logs"][names[1]].startswith(f"{names[1]}: not tried")
        assert fetch_command(names[1], job_id) in text
    finally:
        if proc.poll() is None:
            proc.kill()
        box.thaw(names[1])
    # Once it runs again, the frozen node's agent finds its head gone and cleans up.
    assert wait_for(lambda: job_processes(names[1], job_id) == [], 60)


def test_dead_head_nodes_clean_up_by_themselves(sandbox, hostfile, tmp_path):
    _box, state = sandbox
    names = _names(state)
    proc = start_orch(launch_args(hostfile, "torchrun", "--sleep", "600", "--steps", "1"),
                      tmp_path, tmp_path / "orch.out")  # fmt: skip
    try:
        assert wait_for(lambda: len(job_ids(tmp_path)) == 1, 30)
        [job_id] = job_ids(tmp_path)
        assert wait_for(lambda: all_ranks_up(tmp_path, job_id, names), 120)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _status(tmp_path, job_id)["state"] == "head-died"
    for node in names:
        assert wait_for(lambda node=node: job_processes(node, job_id) == [], 60), node


def test_uneven_slots_run_each_nodes_own_count(sandbox, tmp_path):
    _box, state = sandbox
    names = _names(state)
    hostfile = tmp_path / "uneven"
    hostfile.write_text("".join(f"{n} slots={k}\n" for n, k in zip(names, (2, 1, 2), strict=True)))
    args = ["launch", "--hostfile", str(hostfile), "--launcher", "torchrun", "--no-doctor",
            ALLREDUCE, "--", "--steps", "2"]  # fmt: skip
    result = run_orch(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "torchrun on 3 nodes (2+1+2 ranks)" in result.stderr
    [job_id] = job_ids(tmp_path)
    ups = {node: re.findall(r"rank (\d+)/(\d+) up on", log_text(tmp_path, job_id, node))
           for node in names}  # fmt: skip
    assert [len(ups[node]) for node in names] == [2, 1, 2]
    ranks = sorted(int(rank) for found in ups.values() for rank, _world in found)
    assert ranks == [0, 1, 2, 3, 4]
    assert {world for found in ups.values() for _rank, world in found} == {"5"}
    # every rank summed 1+2+3+4+5 in its all_reduce
    assert all("sum 15" in log_text(tmp_path, job_id, node) for node in names)


def test_a_hostfile_of_loopback_addresses_has_node_0_host_the_store(sandbox_factory, tmp_path):
    # Left to guess, every torchrun of a loopback endpoint hosts the store: the first to bind
    # the port wins. Node 0 starting late lets node 1's win, and node 0's agent then finds
    # the main port held by no process of the job it can see (another PID namespace).
    box, state = sandbox_factory(2, 1)
    addresses = [node.address for node in state.nodes]
    box.shell_startup(state.nodes[0].name, "sleep 3\n")
    hostfile = tmp_path / "by-address"
    hostfile.write_text("".join(f"{address} slots=1\n" for address in addresses))
    result = run_orch(launch_args(hostfile, "torchrun", "--steps", "2"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is not this job's" not in result.stderr
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["hosts"] == addresses and record["state"] == "succeeded"
    assert "--rdzv_conf=is_host=true" in record["command"]
    for rank, address in enumerate(addresses):
        assert f" r{rank}/0 out rank {rank} step 1 sum 3\n" in log_text(tmp_path, job_id, address)
