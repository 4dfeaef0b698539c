"""The sandbox lifecycle against the real system sshd: up, ssh by name, status, down."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from launch_support import wait_for

from orchestrator.errors import SandboxError
from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.render import SANDBOX_ENV

pytestmark = pytest.mark.sandbox

ORCH = [str(Path(sys.executable).with_name("orch"))]


def _ssh(name: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-o", "BatchMode=yes", name, command],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_nodes_answer_by_name_over_plain_ssh(sandbox):
    _box, state = sandbox
    for node in state.nodes:
        result = _ssh(node.name, "echo ok-$USER")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("ok-")


def test_pdsh_reaches_every_node_with_its_own_hostname(sandbox):
    _box, state = sandbox
    names = [n.name for n in state.nodes]
    result = subprocess.run(
        ["pdsh", "-R", "ssh", "-w", ",".join(names), "hostname"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    replies = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert sorted(replies) == sorted(names)
    if state.namespaces:
        assert all(replies[name] == name for name in names)


def test_nodes_resolve_each_other(sandbox):
    _box, state = sandbox
    if not state.namespaces:
        pytest.skip("this machine cannot give nodes their own /etc/hosts (no namespaces)")
    first, last = state.nodes[0], state.nodes[-1]
    result = _ssh(first.name, f"getent hosts {last.name}")
    assert result.stdout.split()[0] == last.address


def test_hostfile_lists_every_node_with_its_slots(sandbox):
    _box, state = sandbox
    lines = Path(state.hostfile).read_text().splitlines()
    assert lines == [f"{n.name} slots={state.slots}" for n in state.nodes]


def test_known_hosts_trusts_exactly_the_nodes_keys(sandbox):
    _box, state = sandbox
    entries = Path(state.known_hosts).read_text().splitlines()
    assert len(entries) == len(state.nodes)
    # Strict checking: a name the sandbox does not know is refused, not accepted.
    config = Path(state.ssh_config).read_text()
    assert "StrictHostKeyChecking yes" in config
    assert "StrictHostKeyChecking no" not in config


def test_lifecycle_up_twice_status_down_twice(tmp_path, request):
    ssh_config = Path.home() / ".ssh" / "config"
    before = ssh_config.read_text() if ssh_config.exists() else None
    box = Sandbox(tmp_path / "box")
    prefix = f"l{uuid.uuid4().hex[:5]}n"
    request.addfinalizer(box.down)  # a failed assertion below leaves no node running
    state = box.up(nodes=2, slots=1, prefix=prefix)
    again = box.up(nodes=2, slots=1, prefix=prefix)
    assert [n.pid for n in again.nodes] == [n.pid for n in state.nodes]
    assert all(s.process_alive and s.port_open for s in box.status())
    assert f"Include {tmp_path / 'box' / 'ssh_config'}" in ssh_config.read_text()

    # A session that leaves a process behind: down must end it too.
    result = _ssh(state.nodes[0].name, "nohup sleep 600 >/dev/null 2>&1 & echo started")
    assert result.stdout.strip() == "started", result.stderr
    # The session's shell has gone; its background child may be in the middle of exec, when
    # /proc/<pid>/environ reads empty for a moment.
    assert wait_for(lambda: _processes_with(SANDBOX_ENV, state.sandbox_id), 10, 0.05)

    box.down()
    assert box.status() == []
    assert _processes_with(SANDBOX_ENV, state.sandbox_id) == []
    after = ssh_config.read_text() if ssh_config.exists() else None
    assert after == before
    assert box.down() is None  # down with nothing up is fine


def test_cli_up_prints_hostfile_and_status_json(tmp_path):
    env = {**os.environ, "ORCH_SANDBOX_DIR": str(tmp_path / "cli")}
    prefix = f"c{uuid.uuid4().hex[:5]}n"
    up = subprocess.run(
        [*ORCH, "sandbox", "up", "--nodes", "2", "--prefix", prefix],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        hostfile = Path(up.stdout.strip())
        assert hostfile.read_text() == f"{prefix}1 slots=2\n{prefix}2 slots=2\n"
        status = subprocess.run(
            [*ORCH, "sandbox", "status", "--json"],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        doc = json.loads(status.stdout)
        assert doc["up"] is True
        assert [n["name"] for n in doc["nodes"]] == [f"{prefix}1", f"{prefix}2"]
        assert all(n["port_open"] for n in doc["nodes"])
    finally:
        down = subprocess.run(
            [*ORCH, "sandbox", "down"], capture_output=True, text=True, env=env, timeout=60,
            check=False,
        )  # fmt: skip
    assert down.returncode == 0
    status = subprocess.run(
        [*ORCH, "sandbox", "status"], capture_output=True, text=True, env=env, timeout=60,
        check=False,
    )  # fmt: skip
    assert "no sandbox is up" in status.stdout


def test_missing_sshd_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCH_SSHD", str(tmp_path / "no-such-sshd"))
    with pytest.raises(SandboxError) as err:
        Sandbox(tmp_path / "box").up(nodes=1)
    assert "no-such-sshd" in err.value.message
    assert err.value.hint


def test_cli_missing_sshd_exits_1_with_hint(tmp_path):
    env = {**os.environ, "ORCH_SSHD": str(tmp_path / "nope"), "ORCH_SANDBOX_DIR": str(tmp_path)}
    result = subprocess.run(
        [*ORCH, "sandbox", "up", "--nodes", "1"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "error:" in result.stderr and "hint:" in result.stderr
    assert "Traceback" not in result.stderr


def test_freeze_stops_every_process_of_a_node(sandbox_factory):
    box, state = sandbox_factory(1, 1)
    name = state.nodes[0].name
    box.freeze(name)
    try:
        result = subprocess.run(
            ["ssh", "-o", "ConnectTimeout=2", name, "true"],
            capture_output=True, timeout=30, check=False,
        )  # fmt: skip
        assert result.returncode == 255  # frozen: no banner, connect times out
        assert b"timed out during banner exchange" in result.stderr, result.stderr
    finally:
        box.thaw(name)
    assert _ssh(name, "true").returncode == 0


def _start_sleep_on(node: str) -> tuple[int, str]:
    """A process left running on `node`; its pid as the node sees it, and a pgrep pattern
    that matches its command line and nothing else (the bracket keeps the pattern from
    matching the shell that carries it)."""
    duration = f"900.{random.randrange(10**6):06d}"
    result = _ssh(node, f"nohup sleep {duration} >/dev/null 2>&1 & echo $!")
    assert result.returncode == 0, result.stderr
    return int(result.stdout), f"sleep {duration[:-1]}[{duration[-1]}]"


def _sees(node: str, pattern: str) -> bool:
    return _ssh(node, f"pgrep -f '{pattern}'").returncode == 0


def _wait_seen(node: str, pattern: str) -> None:
    assert wait_for(lambda: _sees(node, pattern), 10), f"{pattern!r} never ran on {node}"


def test_shared_pids_nodes_see_each_others_processes(sandbox_factory):
    box, state = sandbox_factory(2, 1, shared_pids=True)
    first, second = (node.name for node in state.nodes)
    pid, pattern = _start_sleep_on(first)
    _wait_seen(first, pattern)
    assert _sees(second, pattern)
    # One process table: the node's pid is this machine's, and the sandbox still knows
    # which node started it.
    assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
    assert pid in box.node_pids(first)
    assert pid not in box.node_pids(second)
    if state.namespaces:
        assert _ssh(second, "hostname").stdout.strip() == second  # its own UTS still


def test_default_nodes_do_not_see_each_others_processes(sandbox):
    _box, state = sandbox
    if not state.namespaces:
        pytest.skip("without namespaces every node shares this machine's process table")
    first, second = state.nodes[0].name, state.nodes[1].name
    _pid, pattern = _start_sleep_on(first)
    try:
        _wait_seen(first, pattern)
        assert not _sees(second, pattern)
    finally:
        _ssh(first, f"pkill -f '{pattern}'")


def _processes_with(name: str, value: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if f"{name}={value}".encode() in environ.split(b"\0"):
            found.append(int(entry))
    return found
