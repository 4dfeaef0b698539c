"""Tearing a job down through a transport other than pdsh (srun steps), over fake nodes:
the kill program goes to every node, and each node's answer, or its silence, is reported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.nodes.fake import FakeCall, FakeNode, FakeTransport, Reply
from orchestrator.remote.procs import JOB_ID_VAR, NODE_VAR
from orchestrator.run.teardown import StopProblem, StopReport, teardown_job

STOPPED = Reply(stdout='{"found": 2, "killed": 1, "left": 0}\n')


def _sent_within(fake: FakeTransport, node: str, seconds: float = 5.0) -> list[str]:
    """The commands `node` was sent, once one arrives (those not waited for are sent from
    a thread of their own)."""
    deadline = time.monotonic() + seconds
    while not fake.commands(node) and time.monotonic() < deadline:
        time.sleep(0.01)
    return fake.commands(node)


def test_the_kill_program_goes_to_every_node_and_each_answer_is_reported() -> None:
    fake = FakeTransport([
        FakeNode("n1", {"": STOPPED}),
        FakeNode("n2", {"": STOPPED}).unreachable(),
        FakeNode("n3", {"": Reply(1, stderr="python3: not found\n")}),
        FakeNode("n4", {"": STOPPED}),
    ], slurm_job="7")  # fmt: skip
    stopped, gone, broken, silent = teardown_job(
        ["n1", "n2", "n3", "n4"], "job-1", "/opt/venv/bin/python", grace=2.0, timeout=5.0,
        not_answering=["n4"], transport=fake,
    )  # fmt: skip
    assert stopped.value == StopReport(found=2, killed=1, left=0)
    assert (gone.kind, gone.problem) == (StopProblem.UNREACHABLE, "n2: unreachable")
    assert (broken.kind, broken.problem) == (StopProblem.KILL_FAILED, "n3: kill failed (exit 1)")
    assert silent.kind == StopProblem.NO_ANSWER
    assert silent.problem == "n4: stopped answering; stop request sent, not waited for"
    assert _sent_within(fake, "n4") == fake.commands("n1")  # sent, though not waited for
    for node in ("n1", "n2", "n3"):
        [command] = fake.commands(node)
        assert "job-1" in command and "/opt/venv/bin/python" in command


def test_a_node_whose_program_does_not_end_in_time_is_named_and_the_others_still_stop() -> None:
    fake = FakeTransport([FakeNode("n1", {"": Reply(hangs=True)}), FakeNode("n2", {"": STOPPED})],
                         slurm_job="7")  # fmt: skip
    late, stopped = teardown_job(["n1", "n2"], "job-1", "python3", grace=1.0, timeout=1.0,
                                 transport=fake)  # fmt: skip
    # a node gets at least the grace and 5 s
    assert late.kind == StopProblem.UNREACHABLE
    assert late.problem == "n1: command did not finish within 6s"
    assert stopped.ok and stopped.value is not None and stopped.value.found == 2


@pytest.mark.process
def test_through_srun_the_kill_program_finds_the_jobs_processes_by_slurms_node_name(
    tmp_path: Path,
) -> None:
    """Each node runs the command as srun would (a shell, SLURMD_NODENAME set, no pdsh to
    fill in %h): the kill program must stop the processes the agent started for that node,
    which carry Slurm's name for it."""
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, JOB_ID_VAR: "job-x", NODE_VAR: "c1"})  # fmt: skip

    def as_srun_would(call: FakeCall) -> Reply:
        env = {**os.environ, "SLURMD_NODENAME": call.node}
        done = subprocess.run(["/bin/sh", "-c", call.command], capture_output=True, timeout=30,
                              env=env, check=False)  # fmt: skip
        return Reply(done.returncode, done.stdout, done.stderr)

    try:
        fake = FakeTransport([FakeNode("c1", as_srun_would)], slurm_job="7")
        [stopped] = teardown_job(["c1"], "job-x", sys.executable, grace=2.0, timeout=20.0,
                                 transport=fake)  # fmt: skip
        assert stopped.ok, stopped.problem
        assert stopped.value.found == 1 and stopped.value.left == 0
        assert victim.wait(10) == -signal.SIGTERM
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
