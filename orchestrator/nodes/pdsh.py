"""Running pdsh: the one module that builds pdsh command lines, starts pdsh and reads
its output.

`build_pdsh_argv` is pure. `start_streaming` starts a fan-out (pdsh itself, or
the head-side launcher that runs pdsh for us) in its own session with one merged
output pipe, so the caller can read `node: line` output as it comes and stop the
whole process group at once. `split_node_line` (pure) is the one reader of that
output, srun's too (its agents label their lines as pdsh does). `run_pdsh` runs a
short command on every node with a timeout (used for teardown). `shim_main` is the
`pdsh` that orch puts first on DeepSpeed's PATH: it wraps DeepSpeed's per-node
launcher in the orch agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.plan.pdsh_command import (
    DEFAULT_CONNECT_TIMEOUT,
    build_pdsh_argv,
    pdsh_environment,
    split_pdsh_args,
)


def find_pdsh() -> str:
    found = shutil.which("pdsh")
    if not found:
        raise OrchError(
            "pdsh is not installed on the head node", "install it: `sudo apt-get install -y pdsh`"
        )
    return found


@dataclass
class StreamingProcess:
    """A started fan-out: read `.stdout` line by line; `stop()` ends its whole group.

    Its group is signalled only while its leader is known not to be reaped: until then the
    leader's pid, which is the group's id, cannot be another process's, while after it the
    kernel may give it to any new process of any user. So `poll()` looks without reaping,
    and only `stop()` (or `wait()`) reaps, once the group has had its last signal."""

    process: subprocess.Popen[bytes]
    watchdog: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stdout(self):
        return self.process.stdout

    def poll(self) -> int | None:
        """The exit code once the leader has ended (negative: its signal), else None; the
        leader is left unreaped."""
        if self.process.returncode is not None:
            return self.process.returncode
        return exit_unreaped(self.process)

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def signal(self, signum: int) -> None:
        if self.process.returncode is not None:
            return  # reaped: the group's id may be another process's by now
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def stop(self, grace: float = 3.0) -> int:
        """TERM the process group, KILL it after `grace` seconds, then reap the leader."""
        if self.poll() is None:
            self.signal(signal.SIGTERM)
            self._wait_unreaped(grace)
        # Children of the group may outlive its leader; KILL whatever is left, while the
        # unreaped leader still holds the group's id.
        self.signal(signal.SIGKILL)
        self._release_watchdog()
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            return -9

    def _wait_unreaped(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    def _release_watchdog(self) -> None:
        """The watchdog is ended, not let go: let go (its pipe closed), it signals the group
        itself, and could do so after the leader is reaped."""
        if self.watchdog is not None and self.watchdog.returncode is None:
            with contextlib.suppress(OSError):
                self.watchdog.kill()  # our own child, not reaped yet: its pid is its own
            if self.watchdog.stdin is not None:
                with contextlib.suppress(OSError):
                    self.watchdog.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(2.0)


def exit_unreaped(process: subprocess.Popen[bytes]) -> int | None:
    """A child's exit code (negative: its signal) once it has ended, looked at without
    reaping it (waitid's WNOWAIT); None while it runs. Where there is no waitid, the child
    is polled (and reaped): its group is then no longer signalled."""
    if not hasattr(os, "waitid"):
        return process.poll()
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return process.poll()
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def start_streaming(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    term_first: bool = False,
) -> StreamingProcess:
    """Start argv in its own session, stdout and stderr merged into one pipe. If orch dies
    first, the watchdog KILLs the session, or with `term_first` TERMs it first."""
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as err:
        raise OrchError(f"cannot start {argv[0]}: {err}", "check that it is installed") from err
    return StreamingProcess(process, _watchdog(process.pid, term_first))


# If orch dies without cleaning up (kill -9), pdsh would live on and keep the job's
# ssh channels open; this reader of a pipe only orch holds then kills pdsh's group,
# the channels break, and every node's agent tears its job down.
_WATCHDOG = 'read _ignored; kill -9 -"$1" 2>/dev/null'
# srun's tasks do not notice srun's death (slurmstepd holds their output): srun is TERMed,
# which it forwards to every task of its step (the agents tear the job down), and KILLed
# only if it is still there 15 s later. A group already gone ends the watchdog at once.
_WATCHDOG_TERM_FIRST = (
    'read _ignored; kill -TERM -"$1" 2>/dev/null || exit 0; sleep 15; kill -9 -"$1" 2>/dev/null'
)


def _watchdog(pgid: int, term_first: bool = False) -> subprocess.Popen[bytes] | None:
    script = _WATCHDOG_TERM_FIRST if term_first else _WATCHDOG
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", script, "orch-watchdog", str(pgid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        return None


# pdsh's own messages read `pdsh@<head>: <text>`, e.g. `pdsh@head: n2: ssh exited with ...`.
PDSH_OWN_PREFIX = "pdsh@"


def split_node_line(line: bytes) -> tuple[bytes, bytes]:
    """One line of a fan-out's merged output, without its newline, into (source, text):
    `node: text` -> (node, text); pdsh's own `pdsh@head: text` -> (b"pdsh@head", text)
    (see is_pdsh_own); `: text` -> (b"", text); a line with no such prefix -> (b"", line).
    Node names hold no space, so `a warning: ...` is not a node's line."""
    node, sep, text = line.partition(b": ")
    # find, not `in`: this runs once per line of a job, and `in` on bytes is twice as slow.
    if sep and node.find(b" ") < 0:
        return node, text
    return b"", line


def is_pdsh_own(source: str) -> bool:
    """Whether a source split_node_line found is pdsh itself, not a node."""
    return source.startswith(PDSH_OWN_PREFIX)


@dataclass(frozen=True)
class PdshRun:
    exit_code: int
    # (source, text) in arrival order, as split_node_line splits them (decoded)
    output: tuple[tuple[str, str], ...]
    timed_out: bool

    def lines_of(self, node: str) -> list[str]:
        return [line for name, line in self.output if name == node]


_SSH_EXIT = re.compile(r"^(\S+): ssh exited with exit code (\d+)")


def ssh_exit_of(message: str) -> tuple[str, int] | None:
    """(node, ssh's exit code) from pdsh's own `node: ssh exited with exit code N` message."""
    match = _SSH_EXIT.match(message)
    return (match.group(1), int(match.group(2))) if match else None


def _decoded(line: bytes) -> tuple[str, str]:
    source, text = split_node_line(line)
    return source.decode(errors="replace"), text.decode(errors="replace")


def _short_command_argv(hosts: Sequence[str], remote_command: str, timeout: float) -> list[str]:
    return build_pdsh_argv(
        hosts,
        remote_command,
        connect_timeout=min(DEFAULT_CONNECT_TIMEOUT, max(1, int(timeout))),
        command_timeout=max(1, int(timeout)),
        pdsh=find_pdsh(),
    )


def run_pdsh(
    hosts: Sequence[str],
    remote_command: str,
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> PdshRun:
    """Run a short command on every host; never longer than `timeout` seconds."""
    argv = _short_command_argv(hosts, remote_command, timeout)
    proc = start_streaming(argv, env=pdsh_environment(env if env is not None else os.environ))
    timed_out = False
    try:
        out, _ = proc.process.communicate(timeout=timeout + 5)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.stop(grace=1.0)
        out, _ = proc.process.communicate()
    finally:
        proc._release_watchdog()  # it would signal pdsh's group, reaped by then
    return PdshRun(
        exit_code=proc.process.returncode,
        output=tuple(_decoded(line) for line in out.splitlines()),
        timed_out=timed_out,
    )


def send_pdsh(hosts: Sequence[str], remote_command: str, *, timeout: float, log: Path) -> None:
    """Start a short command on hosts that may not answer, and do not wait for it: pdsh
    runs on by itself (its own session, bounded by its own timeouts) after orch exits,
    and writes what it got to `log`."""
    argv = _short_command_argv(hosts, remote_command, timeout)
    try:
        with log.open("ab") as out:
            subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=pdsh_environment(os.environ),
                start_new_session=True,
                close_fds=True,
            )
    except OSError:
        pass  # the node's agent stops the job by itself once it notices the head is gone


# ----- the pdsh shim on DeepSpeed's PATH (plan/pdsh_command.py writes it) ---------
def shim_main(config_path: str, args: list[str]) -> int:
    """Rewrite DeepSpeed's pdsh call so the agent runs its command, then exec the real pdsh."""
    # Imported here: the shim runs in its own process, after the runner started it.
    from orchestrator.plan.agent_command import agent_command, kill_command
    from orchestrator.plan.pdsh_command import node_launcher_spec
    from orchestrator.remote.agent_spec import AgentSpec

    config = json.loads(Path(config_path).read_text())
    options, hosts, words = split_pdsh_args(args)
    if " ".join(words).lstrip().startswith("pkill"):
        # DeepSpeed's Ctrl-C cleanup is `pkill -f <pattern>`, which would hit other
        # jobs on the same nodes; stop this job by its id instead.
        remote = kill_command(config["python"], config["job_id"], grace=3.0)
    else:
        agent = AgentSpec.from_dict(config["agent"])
        remote = agent_command(config["python"], node_launcher_spec(agent, words, os.environ))
    real = config["real_pdsh"]
    argv = [real, *options, "-w", ",".join(hosts), remote]
    env = pdsh_environment(os.environ)
    os.execve(real, argv, env)
    return 127  # not reached
