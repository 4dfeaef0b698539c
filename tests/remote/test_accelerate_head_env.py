"""The pdsh launcher's head side, run for real (accelerate, then a stand-in for DeepSpeed's
runner): nothing of the head's environment is printed, whatever the user exported there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement, process_environment
from orchestrator.plan.request import LaunchSpec
from orchestrator.specs.inventory import make_hostfile

pytestmark = pytest.mark.process

# Words that hold spaces: one the user exported, and the two every SSH login has.
HEADS_OWN = {
    "MY_NOTE": "orch-test a phrase of several words",
    "SSH_CONNECTION": "10.9.8.7 40022 10.9.8.6 22",
    "SSH_CLIENT": "10.9.8.7 40022 22",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_head_launcher_says_nothing_of_the_heads_variables(tmp_path: Path) -> None:
    run_dir, workdir, fake_bin = tmp_path / "run", tmp_path / "work", tmp_path / "fake-bin"
    for folder in (run_dir, workdir, fake_bin):
        folder.mkdir()
    # DeepSpeed's runner is where the job would fan out: here it only ends the launch.
    runner = fake_bin / "deepspeed"
    runner.write_text("#!/bin/sh\nexit 0\n")
    runner.chmod(0o755)
    environ = {**os.environ, **HEADS_OWN}
    head = HeadContext("/usr/bin/pdsh", str(tmp_path / "private"), sys.executable,
                       environ=environ)  # fmt: skip
    place = Placement(job_id="job-1", hostfile=make_hostfile(["n1", "n2"], 1),
                      run_dir=str(run_dir), main_port=_free_port())  # fmt: skip
    spec = LaunchSpec(script="train.py", launcher="pdsh", python=sys.executable,
                      workdir=str(workdir))  # fmt: skip
    plan = build_plan(spec, place, head)
    for planned in plan.files:
        if planned.run_dir:
            (run_dir / planned.name).write_text(planned.content)
    env = process_environment(plan.launch.head_process, environ)
    env["PATH"] = os.pathsep.join([str(fake_bin), env["PATH"]])
    done = subprocess.run(plan.launch.head_process.argv, cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "Skipping" not in output, output[-3000:]
    for name, value in HEADS_OWN.items():
        assert value not in output, name
    assert not (workdir / ".deepspeed_env").exists()
