"""The node agent on real sandbox nodes (shipped inline over pdsh), and its pure parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from orchestrator.nodes.pdsh import run_pdsh
from orchestrator.plan.agent_command import agent_command, kill_command
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import LaunchSpec
from orchestrator.remote import agent, procs
from orchestrator.remote.agent_spec import AgentSpec, decode, node_dir
from orchestrator.remote.logwire import decode_wire
from orchestrator.remote.rank_watch import failure_from_text, first_failed_rank
from orchestrator.specs import constants
from orchestrator.specs.inventory import make_hostfile

TORCHRUN_REPORT = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-21_23:32:29
  host      : n2
  rank      : 3 (local_rank: 1)
  exitcode  : 7 (pid: 445)
  error_file: <N/A>
============================================================
"""


def test_torchrun_root_cause_gives_rank_and_exit_code():
    assert failure_from_text("noise\n" + TORCHRUN_REPORT) == (3, 7)
    assert failure_from_text("no report here") == (None, None)


def _records(run, node):
    return [r for r in (decode_wire(line.encode()) for line in run.lines_of(node)) if r]


def _control(run, node, kind):
    return [r.fields for r in _records(run, node) if r.kind == "control" and r.text == kind]


@pytest.mark.sandbox
def test_agent_frames_output_tees_raw_logs_and_reports_the_exit_code(sandbox):
    _box, state = sandbox
    node = state.nodes[0].name
    job_id = f"t-{uuid.uuid4().hex[:8]}"
    spec = AgentSpec(
        job_id,
        workdir="/tmp",
        env=(("GREETING", "it's \"quoted\" $HOME"),),
        command=("sh", "-c", 'echo "$GREETING $ORCH_JOB_ID $ORCH_NODE"; '
                 "printf '10%%\\r50%%\\r100%%\\n' >&2; exit 3"),
    )  # fmt: skip
    run = run_pdsh([node], agent_command(sys.executable, spec), timeout=60)
    lines = [r.text for r in _records(run, node) if r.kind == "line"]
    assert f'it\'s "quoted" $HOME {job_id} {node}' in lines
    assert "100%" in lines
    [exit_fields] = _control(run, node, "exit")
    assert exit_fields["code"] == 3
    assert _control(run, node, "started")
    raw = subprocess.run(["ssh", node, f"cat {node_dir(job_id, node, os.getuid())}/stderr.raw"],
                         capture_output=True, timeout=30, check=True).stdout  # fmt: skip
    assert raw == b"10%\r50%\r100%\n"


@pytest.mark.sandbox
def test_agent_reports_a_missing_working_directory(sandbox):
    _box, state = sandbox
    node = state.nodes[1].name
    spec = AgentSpec(f"t-{uuid.uuid4().hex[:8]}", workdir="/no/such/dir", command=("true",))
    run = run_pdsh([node], agent_command(sys.executable, spec), timeout=60)
    [exit_fields] = _control(run, node, "exit")
    assert exit_fields["code"] != 0
    assert "/no/such/dir does not exist" in exit_fields["error"]


def _start_tagged_sleep(node: str, job_id: str, started_for: str = "") -> None:
    """A process of the job on `node`; with `started_for`, marked as another node's."""
    marker = f"ORCH_NODE={started_for} " if started_for else ""
    subprocess.run(
        ["ssh", node, f"ORCH_JOB_ID={job_id} {marker}setsid sleep 300 >/dev/null 2>&1 "
                      "< /dev/null &"],
        timeout=30, check=True,
    )  # fmt: skip


def _count(node: str, job_id: str) -> int:
    script = (
        f"for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null "
        f"| grep -qx 'ORCH_JOB_ID={job_id}' && echo hit; done; true"
    )
    out = subprocess.run(["ssh", node, script], capture_output=True, text=True, timeout=30)
    return out.stdout.split().count("hit")


@pytest.mark.sandbox
def test_kill_by_job_id_stops_only_that_job(sandbox):
    _box, state = sandbox
    nodes = [n.name for n in state.nodes[:2]]
    mine, other = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    for node in nodes:
        _start_tagged_sleep(node, mine)
        _start_tagged_sleep(node, other)
    try:
        assert all(_count(n, mine) == 1 and _count(n, other) == 1 for n in nodes)
        run = run_pdsh(nodes, kill_command(sys.executable, mine, grace=2), timeout=30)
        for node in nodes:
            report = json.loads(run.lines_of(node)[-1])
            assert report["found"] == 1 and report["left"] == 0
            assert _count(node, mine) == 0
            assert _count(node, other) == 1
    finally:
        run_pdsh(nodes, kill_command(sys.executable, other, grace=1), timeout=30)
    assert all(_count(n, other) == 0 for n in nodes)


@pytest.mark.sandbox
def test_kill_on_a_node_leaves_the_jobs_processes_of_another_node_on_the_same_kernel(sandbox):
    # As where nodes share one kernel: this node's process of the job, and another's.
    _box, state = sandbox
    node = state.nodes[0].name
    job_id = f"s-{uuid.uuid4().hex[:8]}"
    _start_tagged_sleep(node, job_id, started_for=node)
    _start_tagged_sleep(node, job_id, started_for="elsewhere")
    try:
        run = run_pdsh([node], kill_command(sys.executable, job_id, grace=2), timeout=30)
        report = json.loads(run.lines_of(node)[-1])
        assert report["found"] == 1 and report["left"] == 0
        assert _count(node, job_id) == 1
    finally:  # what the other node's own sweep would do (pdsh fills in %h there)
        elsewhere = kill_command(sys.executable, job_id, grace=1).replace("%h", "elsewhere")
        subprocess.run(["ssh", node, elsewhere], timeout=30, check=False)
    assert _count(node, job_id) == 0


# (time, rank, exit code or None when the launcher reaped the rank before it was seen,
# whether its keeper reported it: exact)
@pytest.mark.parametrize(
    ("ended", "node_code", "expected"),
    [
        # Reported by the keepers: time alone decides, whatever code the launcher chose.
        ([(10.000, 3, 7, True), (10.004, 2, 1, True)], 1, (3, 7)),
        ([(10.004, 2, 1, True), (10.000, 3, 7, True)], 1, (3, 7)),
        ([(10.0, 1, -9, True), (10.3, 0, -15, True)], -15, (1, -9)),
        # Seen by the scan only: the launcher passes the failing rank's code on.
        ([(10.0, 6, 1, False), (10.1, 7, 7, False)], 7, (7, 7)),
        # Rank 7's code went unseen; rank 6 was stopped by the launcher (-15).
        ([(10.0, 6, -15, False), (10.05, 7, None, False)], 7, (7, None)),
        ([(10.0, 7, None, False), (10.2, 6, -15, False)], 7, (7, None)),
        # Far enough apart, the first failure stands whatever the codes.
        ([(10.0, 3, 1, False), (12.0, 2, 7, False)], 7, (3, 1)),
        # Ranks that finished cleanly before are not suspects.
        ([(5.0, 0, 0, True), (10.0, 1, 9, False)], 9, (1, 9)),
        ([(5.0, 0, 0, True)], 1, (None, None)),
        ([], 1, (None, None)),
    ],
)
def test_first_failed_rank_tells_tied_ends_apart(ended, node_code, expected):
    assert first_failed_rank(ended, node_code, tie_s=0.3) == expected


def test_the_agent_command_for_256_standard_configs_fits_in_one_argument():
    # The remote shell gets the command as one argument: Linux caps that at 128 KiB.
    hosts = make_hostfile([f"gpu{i:03d}" for i in range(256)], 8)
    spec = LaunchSpec(script="train.py", launcher="standard", python="/usr/bin/python3",
                      workdir="/w")  # fmt: skip
    place = Placement(job_id="j1", hostfile=hosts, run_dir="/r/j1", main_port=29500)
    plan = build_plan(spec, place, HeadContext("pdsh", "/tmp/orch-j1", sys.executable))
    files = {f.name: f.content for f in plan.files if f.ship}
    assert len(files) == 257  # a config spec per machine, and the program that writes it
    agent_spec = AgentSpec("j1", files=tuple(files.items()), command=plan.launch.node_command)
    command = agent_command("/usr/bin/python3", agent_spec)
    assert len(command.encode()) < 128 * 1024
    word = command.split()[-3]  # ... run SPEC %h %n
    assert decode(word) == agent_spec


def test_the_agent_names_the_variables_the_head_plans_with():
    # The agent is shipped without orch, so it carries its own copies of these names.
    assert procs.JOB_ID_VAR == agent.JOB_ID_VAR == constants.JOB_ID_VAR
    assert agent.NODE_RANK_VAR == procs.NODE_RANK_VAR
    assert agent.NODE_DIR_VAR == procs.NODE_DIR_VAR
