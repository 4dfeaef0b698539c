"""The user's shell on a node is part of its environment: a sandbox node whose ~/.bashrc
(its own, bind-mounted in that node only) prints on stderr and sleeps, as a stale
`pyenv rehash` lock makes `eval "$(pyenv init -)"` do. Doctor names it with what it
printed, and a node command that times out says what the node printed on stderr."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox.state import SandboxState
from orchestrator.ssh import run_on_nodes

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))
PYENV = "pyenv: cannot rehash: couldn't acquire lock /root/.pyenv/shims/.pyenv-shim for 60 seconds"
# Far from the timeouts each test gives: a healthy node under the suite's load may take
# seconds to log in and answer; the slow one always takes SLEEP_S more.
SLEEP_S = 10


@pytest.fixture(scope="module")
def slow_shell(sandbox_factory) -> tuple[SandboxState, str]:
    box, state = sandbox_factory(3, 1)
    slow = state.nodes[1].name
    box.shell_startup(slow, f"echo \"{PYENV}\" >&2\nsleep {SLEEP_S}\n")
    return state, slow


def _doctor(state: SandboxState, *extra: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as sock:
        sock.bind((state.nodes[0].address, 0))
        port = sock.getsockname()[1]
    argv = [ORCH, "doctor", "--hostfile", state.hostfile, "--main-port", str(port), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_doctor_names_a_slow_shell_and_what_it_printed(slow_shell) -> None:
    state, slow = slow_shell
    done = _doctor(state, "--json", "--timeout", "40")
    report = json.loads(done.stdout)
    assert done.returncode == 0, report["findings"]  # a slow shell is a warning
    [finding] = [f for f in report["findings"] if f["node"] == slow]
    assert finding["check"] == "shell" and finding["severity"] == "warning"
    took = re.search(rf"the shell on {slow} takes (\d+\.\d)s to start", finding["problem"])
    assert took and float(took.group(1)) >= SLEEP_S, finding["problem"]
    assert f"prints on stderr on {slow}: {PYENV}" in finding["problem"]
    assert "~/.bashrc" in finding["fix"]
    for node in report["nodes"]:
        assert node["checks"]["shell"] == ("warning" if node["node"] == slow else "ok")
    text = _doctor(state, "--timeout", "40").stdout
    assert f"the shell on {slow} takes" in text and "pyenv: cannot rehash" in text


def test_a_command_that_times_out_says_what_the_node_printed_on_stderr(slow_shell) -> None:
    _, slow = slow_shell
    [result] = run_on_nodes([slow], "true", timeout=1.5)
    assert not result.ok and result.kind == "timeout"
    assert result.problem == (
        f"{slow}: command did not finish within 1.5s; the node printed on stderr: {PYENV}"
    )


def test_doctor_whose_probe_times_out_names_the_shell(slow_shell) -> None:
    state, slow = slow_shell
    done = _doctor(state, "--json", "--timeout", "6", "--probe-timeout", "6")
    report = json.loads(done.stdout)
    assert done.returncode == 1
    [finding] = [f for f in report["findings"] if f["node"] == slow]
    assert finding["problem"] == (
        f"{slow}: command did not finish within 6s; the node printed on stderr: {PYENV}"
    )
    assert "~/.bashrc" in finding["fix"]
    assert [f for f in report["findings"] if f["node"] != slow] == []
