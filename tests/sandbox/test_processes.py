"""A pid the sandbox saved is signalled only while it is still the sandbox's process: once
that process has ended, the kernel may give the pid (and so a group's id) to anyone's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from orchestrator.sandbox.nodes import stop_node
from orchestrator.sandbox.processes import still_ours
from orchestrator.sandbox.slurm import stop

pytestmark = pytest.mark.process


def _sleeper(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv],
                            start_new_session=True)  # fmt: skip


def test_a_process_is_ours_while_it_runs_with_the_sandboxs_directory_in_its_command(tmp_path):
    ours, stranger = _sleeper(str(tmp_path / "nodes" / "n1")), _sleeper("elsewhere")
    try:
        assert still_ours(ours.pid, str(tmp_path))
        assert not still_ours(stranger.pid, str(tmp_path))
        ours.kill()
        ours.wait()
        assert not still_ours(ours.pid, str(tmp_path))  # ended: its pid is nobody's or anyone's
    finally:
        for process in (ours, stranger):
            process.kill()
            process.wait()


def test_stopping_a_node_or_the_daemons_by_a_pid_now_anothers_leaves_that_process(tmp_path):
    """The pid a sandbox saved, now another process's (as after the node died and the pid was
    given again): neither `stop_node` nor the Slurm daemons' stop signals it or its group."""
    stranger = _sleeper("another user's job")
    try:
        stop_node(stranger.pid, tmp_path)
        stop([stranger.pid], tmp_path)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()
    daemon = _sleeper(f"--conf={tmp_path / 'slurm' / 'slurm.conf'}")
    stop([daemon.pid], tmp_path)  # its own daemon: stopped, and reaped (no zombie left)
    assert not still_ours(daemon.pid, str(tmp_path))
    with pytest.raises(ChildProcessError):
        os.waitpid(daemon.pid, os.WNOHANG)
    daemon.wait(timeout=10)
