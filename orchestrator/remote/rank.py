"""orch-rank: the per-rank start-up, run by the node's launcher in place of the training script.

STANDARD LIBRARY ONLY, shipped inline with the agent, which writes it to the job's node
directory with a small `orch-rank` program on the launcher's PATH. Every launcher starts
it through its own option for this: accelerate and DeepSpeed `--no_python orch-rank`,
torchrun `--no-python orch-rank`. For one rank it

1. reads the rank's exact command (interpreter, script, the user's arguments) from the
   node directory, where the agent wrote it: nothing the user typed passes through a
   launcher's command line or a shell on the node;
2. connects its stdout and stderr to the agent, each on a connection of its own that
   names the rank (RANK, LOCAL_RANK, set by the launcher), so no other rank's bytes can
   land inside its lines;
3. gives the rank its own TORCHELASTIC_ERROR_FILE where the launcher set none;
4. puts the agent's sitecustomize (remote/rank_site.py) first on the rank's PYTHONPATH,
   so its stack can be taken on a signal where py-spy cannot;
5. stays the rank's parent (its keeper): the rank's end is known the moment it happens,
   with its own exit code or signal, and reported to the agent on a third connection.
   A launcher only learns of an end when it polls (DeepSpeed's, once a second, in no
   useful order), and an agent scanning /proc learns of it later still: two ranks that end
   milliseconds apart would look simultaneous, and the launcher's choice would name the
   wrong one. The keeper forwards the launcher's signals to the rank, notes which it
   forwarded (a teardown, not the rank's own fault), and ends as the rank ended: the same
   exit code, or the same signal raised on itself, so every launcher sees the rank's end.
   The rank dies with its keeper (PR_SET_PDEATHSIG), so a launcher's SIGKILL still ends it.
6. while the job is being stopped (STOP_FILE, written by remote/rank_stop.py, which sends
   the rank itself the stop signal), passes nothing on: the rank has its grace to save,
   whatever its launcher does then; and a rank not started yet is not started at all.

When the agent cannot be reached, the rank still starts, with the launcher's pipes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import MutableMapping

START_DIR = "bin"  # under the node directory: start-up files, not logs, so never pulled back
COMMAND_FILE = os.path.join(START_DIR, "rank.json")
# A stop under way on this node: {"signal": N, "until": the grace's end on this node's clock}.
STOP_FILE = os.path.join(START_DIR, "stop.json")
SITE_DIR = os.path.join(START_DIR, "site")  # sitecustomize.py: stacks without ptrace
SITE_DIR_VAR = "ORCH_RANK_SITE"
NODE_DIR_VAR = "ORCH_NODE_DIR"  # procs.NODE_DIR_VAR: this program runs alone on the node
# Set by the keeper in its rank's environment to its own pid: remote/procs.py tells the
# rank (whose parent is that pid) from its keeper and from the rank's own children.
KEEPER_VAR = "ORCH_RANK_KEEPER"
CONNECT_TIMEOUT_S = 10.0
SOCKET_PATH_MAX = 100  # rank_streams.SOCKET_PATH_MAX: AF_UNIX paths are capped at 108 bytes
END_STREAM = "end"
# What a launcher sends to stop its ranks, or a user to the launcher: passed on to the rank.
FORWARDED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
    signal.SIGUSR2,
)  # fmt: skip
_PR_SET_PDEATHSIG = 1


def rank_ids(environ: dict[str, str]) -> tuple[int, int] | None:
    """(global rank, local rank) as the launcher set them."""
    try:
        return int(environ["RANK"]), int(environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        return None


def rank_command(command: list[str], launcher_args: list[str]) -> list[str]:
    """The rank's argv: the interpreter and script, then what the launcher added (as it
    would have passed it right after the script), then the user's own arguments."""
    return [*command[:2], *launcher_args, *command[2:]]


def _connect(path: str, header: dict[str, object]) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    if len(path.encode()) <= SOCKET_PATH_MAX:
        conn.connect(path)
    else:  # a node directory too deep for AF_UNIX: through a descriptor of it, as bound
        where = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
        try:
            conn.connect(f"/proc/self/fd/{where}/{os.path.basename(path)}")
        finally:
            os.close(where)
    conn.sendall(json.dumps(header).encode() + b"\n")
    conn.settimeout(None)
    conn.shutdown(socket.SHUT_RD)  # the agent never writes back
    return conn


def own_streams(path: str, who: dict[str, object]) -> socket.socket | None:
    """Put fd 1 and 2 on connections of their own to the agent, and open the connection
    the rank's end is reported on; None if the agent cannot be reached (then fd 1 and 2
    stay as they are)."""
    try:
        conns = [_connect(path, {**who, "stream": s}) for s in ("out", "err", END_STREAM)]
    except OSError:
        return None
    for fd, conn in zip((1, 2), conns, strict=False):
        os.dup2(conn.fileno(), fd)
        conn.close()
    conns[2].set_inheritable(False)
    return conns[2]


def use_site(site_dir: str, environ: MutableMapping[str, str]) -> None:
    """Put `site_dir` first on PYTHONPATH (its sitecustomize takes itself back out)."""
    if not os.path.isfile(os.path.join(site_dir, "sitecustomize.py")):
        return
    environ[SITE_DIR_VAR] = site_dir
    rest = environ.get("PYTHONPATH", "")
    environ["PYTHONPATH"] = site_dir + (os.pathsep + rest if rest else "")


# ----- the keeper --------------------------------------------------------------------
def stop_until(directory: str) -> float | None:
    """The end of the grace of a stop under way (STOP_FILE), or None."""
    try:
        with open(os.path.join(directory, STOP_FILE), encoding="utf-8") as handle:
            return float(json.load(handle)["until"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stopping(directory: str, now: float) -> bool:
    """Whether the job is being stopped on this node, its grace not over yet."""
    until = stop_until(directory)
    return until is not None and now < until


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer ended in this process's cgroup (v2),
    or None where that cannot be read."""
    try:
        with open("/proc/self/cgroup", encoding="ascii") as handle:
            group = handle.read().split("::", 1)[1].strip()
        with open(f"/sys/fs/cgroup{group}/memory.events", encoding="ascii") as handle:
            for line in handle:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, IndexError, ValueError):
        return None
    return None


def end_report(
    started: float, ended: float, pid: int, status: int, usage: resource.struct_rusage,
    forwarded: list[int], oom_before: int | None, oom_after: int | None,
    held: list[int] | None = None,
) -> dict[str, object]:
    """What the agent learns of a rank's end: when, how, and what may explain it."""
    code = os.waitstatus_to_exitcode(status)
    report: dict[str, object] = {
        "pid": pid, "start": round(started, 6), "end": round(ended, 6), "code": code,
        "maxrss_kb": usage.ru_maxrss,
    }  # fmt: skip
    if forwarded:
        report["forwarded"] = sorted(set(forwarded))
    if held:
        report["held"] = sorted(set(held))
    if code == -signal.SIGKILL and oom_before is not None and oom_after is not None:
        report["oom_kill"] = oom_after > oom_before
    return report


class Keeper:
    """Starts the rank as its child and waits for it, passing signals on."""

    def __init__(self, command: list[str], environ: dict[str, str], directory: str = "") -> None:
        self.command = command
        self.environ = environ
        self.directory = directory  # the node directory, where a stop leaves STOP_FILE
        self.child = 0
        self.forwarded: list[int] = []
        self.held: list[int] = []  # the launcher's signals not passed on during a stop

    def _forward(self, signum: int, _frame: object) -> None:
        if self.directory and stopping(self.directory, time.time()):
            self.held.append(signum)  # the rank has the stop signal and its grace
            return
        self.forwarded.append(signum)
        if self.child:
            with contextlib.suppress(OSError):
                os.kill(self.child, signum)

    def start(self) -> int:
        """Fork and exec the rank; returns its pid. Signals are held across the fork, so
        none reaches the child's copy of the keeper's handlers."""
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
        keeper = os.getpid()
        pid = os.fork()
        if pid == 0:  # the rank-to-be
            self._exec(keeper, held)
        self.child = pid
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return pid

    def _exec(self, keeper: int, held: set[signal.Signals]) -> None:
        try:
            # As subprocess does: the rank starts with default dispositions, not Python's.
            for signum in (*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(signum, signal.SIG_DFL)
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != keeper:  # the keeper died before the rank could follow it
                os._exit(128 + signal.SIGKILL)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            os.execvpe(self.command[0], self.command, self.environ)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.write(2, f"orch-rank: cannot start {self.command[0]}: {err}\n".encode())
        finally:
            os._exit(127)

    def wait(self) -> tuple[int, resource.struct_rusage]:
        """The rank's wait status and resource usage, the moment it ends."""
        _pid, status, usage = os.wait4(self.child, 0)  # retried after each signal (PEP 475)
        return status, usage


def end_as(status: int) -> int:
    """End this keeper as the rank ended: raise the same signal on itself (no core file),
    or return the same exit code."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        return 128 + signum  # not reached, but for a signal that could not be raised
    return os.waitstatus_to_exitcode(status)


def _report(conn: socket.socket | None, report: dict[str, object]) -> None:
    if conn is None:
        return
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(report).encode() + b"\n")
        conn.close()


def main(argv: list[str]) -> int:
    directory = os.environ.get(NODE_DIR_VAR, "")
    try:
        with open(os.path.join(directory, COMMAND_FILE), encoding="utf-8") as handle:
            spec = json.load(handle)
    except (OSError, ValueError) as err:
        sys.stderr.write(f"orch-rank: cannot read the rank's command in {directory!r}: {err}\n")
        return 127
    command = rank_command([str(word) for word in spec["argv"]], argv)
    ids = rank_ids(dict(os.environ))
    ended_on = None
    if ids is not None:
        rank, local_rank = ids
        who = {"rank": rank, "local_rank": local_rank, "pid": os.getpid()}
        ended_on = own_streams(str(spec["socket"]), who)
        os.environ.setdefault(
            "TORCHELASTIC_ERROR_FILE", os.path.join(directory, f"rank{rank}.error.json")
        )
        use_site(os.path.join(directory, SITE_DIR), os.environ)
    environ = {**os.environ, KEEPER_VAR: str(os.getpid())}
    started = time.time()
    if directory and stopping(directory, started):  # stopped before it started: nothing to save yet
        _report(ended_on, {"pid": os.getpid(), "start": round(started, 6),
                           "end": round(started, 6), "code": 0, "not_started": True})
        return 0
    oom_before = oom_kills()
    keeper = Keeper(command, environ, directory)
    pid = keeper.start()
    status, usage = keeper.wait()
    ended = time.time()
    report = end_report(started, ended, pid, status, usage, keeper.forwarded, oom_before,
                        oom_kills() if oom_before is not None else None,
                        keeper.held)  # fmt: skip
    _report(ended_on, report)
    sys.stdout.flush()
    return end_as(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
