"""pdsh command lines (pure) and running pdsh against real sandbox nodes."""

from __future__ import annotations

import os
import signal
import time

import pytest
from launch_support import wait_for

from orchestrator.errors import OrchError
from orchestrator.nodes.pdsh import (
    is_pdsh_own,
    run_pdsh,
    split_node_line,
    ssh_exit_of,
    start_streaming,
)
from orchestrator.plan.pdsh_command import (
    DEFAULT_WINDOW,
    SSH_ARGS_APPEND,
    build_pdsh_argv,
    job_window,
    pdsh_environment,
    split_pdsh_args,
)


def test_argv_runs_over_ssh_on_every_host_with_timeouts():
    argv = build_pdsh_argv(["a1", "a2"], "echo hi", window=8, command_timeout=30)
    assert argv[0] == "pdsh"
    assert argv[argv.index("-R") + 1] == "ssh"
    assert "-S" in argv  # exit with the largest remote exit code
    assert argv[argv.index("-f") + 1] == "8"
    assert argv[argv.index("-t") + 1] == "10"
    assert argv[argv.index("-u") + 1] == "30"
    assert argv[-2:] == ["a1,a2", "echo hi"]


def test_a_job_gets_one_window_slot_per_node_beyond_the_default_window():
    hosts = [f"gpu{k:03d}" for k in range(1, 201)]
    argv = build_pdsh_argv(hosts, "true", window=job_window(len(hosts)))
    assert argv[argv.index("-f") + 1] == "200"
    assert job_window(4) == DEFAULT_WINDOW


def test_no_hosts_is_an_error():
    with pytest.raises(OrchError, match="no hosts"):
        build_pdsh_argv([], "true")


def test_environment_keeps_the_users_ssh_args_and_adds_keepalives():
    env = pdsh_environment({"PDSH_SSH_ARGS_APPEND": "-p 2222"})
    assert env["PDSH_RCMD_TYPE"] == "ssh"
    assert env["PDSH_SSH_ARGS_APPEND"] == f"-p 2222 {SSH_ARGS_APPEND}"
    assert pdsh_environment(env) == env  # idempotent


def test_split_deepspeed_pdsh_call():
    # What DeepSpeed's PDSHRunner runs (its remote command is split into words).
    args = ["-S", "-f", "1024", "-w", "n1,n2", "export", "A=1;", "cd", "/w;", "python", "-u",
            "-m", "deepspeed.launcher.launch", "--node_rank=%n", "train.py"]  # fmt: skip
    options, hosts, words = split_pdsh_args(args)
    assert options == ["-S", "-f", "1024"]
    assert hosts == ["n1", "n2"]
    assert words[0] == "export" and words[-1] == "train.py"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"n1: hello: world", (b"n1", b"hello: world")),
        (b"pdsh@head: n2: ssh exited", (b"pdsh@head", b"n2: ssh exited")),
        (b"no prefix here", (b"", b"no prefix here")),
        (b"WARNING: a launcher's own line", (b"WARNING", b"a launcher's own line")),
        (b"a warning: with a space", (b"", b"a warning: with a space")),
        (b"n1:no space", (b"", b"n1:no space")),
        (b": empty node", (b"", b"empty node")),
    ],
)  # fmt: skip
def test_split_node_line(line, expected):
    assert split_node_line(line) == expected


def test_only_pdsh_itself_speaks_as_pdsh_at():
    assert is_pdsh_own("pdsh@head") and not is_pdsh_own("n1") and not is_pdsh_own("")
    assert ssh_exit_of("n2: ssh exited with exit code 255") == ("n2", 255)
    assert ssh_exit_of("n2: hello") is None


@pytest.mark.sandbox
def test_run_pdsh_reaches_every_node_and_reports_each(sandbox):
    _box, state = sandbox
    names = [n.name for n in state.nodes]
    run = run_pdsh(names, "hostname; echo rank=%n", timeout=20)
    assert run.exit_code == 0 and not run.timed_out
    for rank, name in enumerate(names):
        # (A login shell may add its own noise; the command's lines come in order.)
        lines = run.lines_of(name)
        assert lines.index(name) < lines.index(f"rank={rank}")


@pytest.mark.sandbox
def test_run_pdsh_returns_the_largest_exit_code(sandbox):
    _box, state = sandbox
    names = [n.name for n in state.nodes[:2]]
    run = run_pdsh(names, "exit %n", timeout=20)
    assert run.exit_code == 1
    assert any("exit code 1" in line for node, line in run.output if is_pdsh_own(node))


@pytest.mark.sandbox
def test_run_pdsh_never_outlives_its_timeout(sandbox):
    _box, state = sandbox
    name = state.nodes[0].name
    started = time.monotonic()
    run = run_pdsh([name], "sleep 60", timeout=2)
    assert run.exit_code != 0
    assert time.monotonic() - started < 30
    # pdsh's own command timeout ended it, and says so for the node.
    assert not run.timed_out
    said = [line for node, line in run.output if is_pdsh_own(node)]
    assert any(name in line and "command timeout" in line for line in said), run.output


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.process
def test_the_fan_out_is_looked_at_without_reaping_and_its_group_signalled_only_before(
    monkeypatch,
):
    proc = start_streaming(["sh", "-c", "exit 3"], env=dict(os.environ))
    wait_for(lambda: proc.poll() is not None, 10, 0.02)
    assert proc.poll() == 3
    assert _state(proc.pid) == "Z"  # ended, not reaped: its pid is still the group's id
    signalled: list[tuple[int, int]] = []
    real_killpg = os.killpg

    def killpg(pgid: int, signum: int) -> None:
        signalled.append((pgid, signum))
        real_killpg(pgid, signum)

    monkeypatch.setattr(os, "killpg", killpg)
    assert proc.stop(grace=2.0) == 3
    assert signalled == [(proc.pid, 9)]  # KILL for what is left of the group, before the reap
    assert proc.watchdog is not None and proc.watchdog.returncode is not None
    proc.signal(15)  # reaped: the group's id may be anyone's now
    assert signalled == [(proc.pid, 9)]
    assert proc.stop(grace=1.0) == 3


@pytest.mark.process
def test_a_killed_fan_out_reads_as_its_signal():
    proc = start_streaming(["sleep", "30"], env=dict(os.environ))
    os.kill(proc.pid, signal.SIGTERM)
    wait_for(lambda: proc.poll() is not None, 10, 0.02)
    assert proc.poll() == -signal.SIGTERM
    assert proc.stop(grace=1.0) == -signal.SIGTERM
