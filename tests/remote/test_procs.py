"""Which processes are a job's on a node, and which of them are ranks (remote/procs.py): on
environments as values, on fabricated /proc trees, and the sweep on real processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _fake_proc import fake_process
from launch_support import wait_for

from orchestrator.plan.agent_command import kill_command
from orchestrator.remote import procs
from orchestrator.remote.sweep import stop_job

JOB = "job-1"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"ORCH_JOB_ID": JOB, "ORCH_NODE": "n1"}, True),
        # Another node on the same kernel (two hostfile entries on one machine, several
        # slurmd on one host, containers sharing the host's process table) keeps its own.
        ({"ORCH_JOB_ID": JOB, "ORCH_NODE": "n2"}, False),
        # Nothing tells an unmarked process of the job apart: every node takes it.
        ({"ORCH_JOB_ID": JOB}, True),
        ({"ORCH_JOB_ID": "job-10", "ORCH_NODE": "n1"}, False),
        ({"ORCH_NODE": "n1"}, False),
        ({}, False),
    ],
)
def test_a_process_is_the_jobs_on_this_node_by_its_environment(env, expected):
    assert procs.started_for(env, JOB, "n1") is expected


def test_a_process_of_the_job_on_any_node_is_asked_for_with_no_node():
    # Node 0's main port may be bound by another node's launcher where nodes share a kernel.
    assert procs.started_for({"ORCH_JOB_ID": JOB, "ORCH_NODE": "n2"}, JOB, None)
    assert not procs.started_for({"ORCH_JOB_ID": "job-10", "ORCH_NODE": "n2"}, JOB, None)


@pytest.mark.parametrize(
    ("env", "parent_env", "expected"),
    [
        ({"RANK": "3"}, {}, 3),
        ({"RANK": "3"}, None, 3),  # the parent is gone or unreadable
        ({"RANK": "3"}, {"RANK": "3"}, None),  # a rank's own child inherits its RANK
        ({"RANK": "3"}, {"RANK": "0"}, 3),
        ({}, {}, None),  # the launcher
        ({"RANK": "x"}, {}, None),
        (None, {}, None),
    ],
)
def test_a_rank_carries_rank_and_its_parent_does_not_carry_the_same(env, parent_env, expected):
    assert procs.own_rank(env, parent_env) == expected


def test_environ_entries_are_split_at_the_first_equals_sign():
    raw = b"A=1\0B=x=y\0EMPTY=\0junk\0"
    assert procs.parse_environ(raw) == {"A": "1", "B": "x=y", "EMPTY": ""}


def _job(node: str, **more: str) -> dict[str, str]:
    return {"ORCH_JOB_ID": JOB, "ORCH_NODE": node, "PATH": "/usr/bin", **more}


@pytest.fixture
def shared_proc(tmp_path: Path) -> str:
    """One kernel, two nodes of the job: n1's launcher (100) with ranks 0 and 1 and a data
    loader worker of rank 0; n2's launcher (200) with ranks 2 and 3; another job's rank."""
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 1, 0, {})
    fake_process(proc, 100, 1, _job("n1"))
    fake_process(proc, 101, 100, _job("n1", RANK="0"))
    fake_process(proc, 102, 100, _job("n1", RANK="1"))
    fake_process(proc, 103, 101, _job("n1", RANK="0"))  # rank 0's worker
    fake_process(proc, 200, 1, _job("n2"))
    fake_process(proc, 201, 200, _job("n2", RANK="2"))
    fake_process(proc, 202, 200, _job("n2", RANK="3"))
    fake_process(proc, 300, 1, {"ORCH_JOB_ID": "other", "ORCH_NODE": "n1", "RANK": "0"})
    (proc / "self").mkdir()  # not a pid
    return str(proc)


def test_each_node_finds_only_its_own_processes_of_the_job(shared_proc):
    assert sorted(procs.job_pids(JOB, "n1", shared_proc)) == [100, 101, 102, 103]
    assert sorted(procs.job_pids(JOB, "n2", shared_proc)) == [200, 201, 202]
    assert procs.job_pids(JOB, "n3", shared_proc) == []


def test_another_users_process_with_the_jobs_id_is_not_the_jobs(shared_proc):
    # An agent running as root, and another user's process that carries the job's id and a
    # RANK: it is neither the job's process nor one of its ranks.
    fake_process(Path(shared_proc), 400, 1, _job("n1", RANK="5"))
    Path(shared_proc, "400", "status").write_text("Name:\tx\nUid:\t65534\t65534\t65534\t65534\n")
    assert sorted(procs.job_pids(JOB, "n1", shared_proc)) == [100, 101, 102, 103]
    assert procs.job_ranks(JOB, "n1", shared_proc) == [(0, 101), (1, 102)]
    assert procs.owner_of(400, shared_proc) == 65534
    assert procs.owner_of(100, shared_proc) == os.getuid()  # no status: its entry's owner
    assert procs.job_pids(JOB, "n1", shared_proc, uid=65534) == [400]


def test_each_node_finds_only_its_own_ranks(shared_proc):
    assert procs.job_ranks(JOB, "n1", shared_proc) == [(0, 101), (1, 102)]
    assert procs.job_ranks(JOB, "n2", shared_proc) == [(2, 201), (3, 202)]
    assert procs.rank_at(103, shared_proc) is None
    assert procs.parent_of(103, shared_proc) == 101
    assert procs.parent_of(999, shared_proc) == 0


def test_an_ended_rank_s_exit_code_is_read_until_it_is_reaped(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 5, 1, {}, state="Z")
    stat = proc / "5" / "stat"
    for status, code in ((7 << 8, 7), (15, -15), (0, 0)):
        fields = stat.read_text().split()
        stat.write_text(" ".join([*fields[:-1], str(status)]) + "\n")
        assert procs.zombie_exit_code(5, str(proc)) == code
    fake_process(proc, 6, 1, {})
    assert procs.zombie_exit_code(6, str(proc)) is None  # still running
    assert procs.zombie_exit_code(7, str(proc)) is None  # reaped


# ----- the sweep, on real processes that share this machine's kernel ---------------------
@pytest.fixture
def two_nodes_processes() -> Iterator[tuple[str, subprocess.Popen, subprocess.Popen]]:
    """A process of one job for node n1 and one for node n2, on this one kernel."""
    job_id = f"sweep-{uuid.uuid4().hex[:8]}"
    started = [
        subprocess.Popen(["sleep", "120"], env={**os.environ, "ORCH_JOB_ID": job_id,
                                                "ORCH_NODE": node}, start_new_session=True)
        for node in ("n1", "n2")
    ]  # fmt: skip
    try:
        yield job_id, started[0], started[1]
    finally:
        for process in started:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(10)


def _ended(process: subprocess.Popen, timeout: float = 10) -> bool:
    return wait_for(lambda: process.poll() is not None, timeout, 0.05)


@pytest.mark.process
def test_the_sweep_ends_only_its_own_nodes_processes(two_nodes_processes):
    job_id, on_n1, on_n2 = two_nodes_processes
    assert stop_job(job_id, "n1", grace=2) == {"found": 1, "killed": 0, "left": 0}
    assert _ended(on_n1) and on_n1.returncode == -15
    assert on_n2.poll() is None


@pytest.mark.process
def test_orch_kill_on_a_node_ends_that_nodes_processes_of_the_job(two_nodes_processes):
    # The shipped program, as pdsh runs it on n2 (pdsh puts the node's name for %h).
    job_id, on_n1, on_n2 = two_nodes_processes
    command = kill_command(sys.executable, job_id, grace=2).replace("%h", "n2")
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"found": 1, "killed": 0, "left": 0}
    assert _ended(on_n2)
    assert on_n1.poll() is None
