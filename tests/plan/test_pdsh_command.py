"""DeepSpeed's per-node launcher as orch's agent runs it (plan/pdsh_command.py
NODE_LAUNCH_CODE), run for real: on a SIGTERM (what a Slurm preemption sends every process
of the step) it TERMs its ranks and waits the stop's grace, not its own fixed 30 s, before
the KILL, so a rank that saves for longer than 30 s finishes its save."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys

import pytest
from launch_support import free_port, wait_for

from orchestrator.plan.pdsh_command import node_launch_words
from orchestrator.specs.constants import LAUNCHER_SHUTDOWN_VAR

pytestmark = pytest.mark.process

SAVE_S = 33  # longer than DeepSpeed's own 30 s


def test_deepspeeds_launcher_waits_the_grace_for_a_rank_saving_longer_than_its_30_s(tmp_path):
    started, saved = tmp_path / "started", tmp_path / "saved"
    # A rank that saves for SAVE_S seconds when told to stop, then exits 0 by itself.
    rank = (f"trap 'sleep {SAVE_S}; echo done > {saved}; exit 0' TERM; touch {started}; "
            "while :; do sleep 0.2; done")  # fmt: skip
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0]}).encode()).decode()
    argv = node_launch_words(sys.executable, [
        f"--world_info={world}", "--node_rank=0", "--master_addr=127.0.0.1",
        f"--master_port={free_port()}", "--no_python", "--no_local_rank", "sh", "-c", rank,
    ])  # fmt: skip
    env = {**os.environ, LAUNCHER_SHUTDOWN_VAR: str(SAVE_S + 20), "DS_ACCELERATOR": "cpu"}
    launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert wait_for(started.exists, 60), launcher.communicate(timeout=5)[0].decode()[-3000:]
        launcher.send_signal(signal.SIGTERM)
        output = launcher.communicate(timeout=SAVE_S + 30)[0].decode(errors="replace")
    finally:
        if launcher.poll() is None:
            launcher.kill()
    # Killed at DeepSpeed's 30 s, the rank would not have written it.
    assert saved.read_text() == "done\n", output[-3000:]
    assert "Main process received SIGTERM" in output
