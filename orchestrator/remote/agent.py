"""The orch agent: the supervisor that runs the job's command on one node.

STANDARD LIBRARY ONLY. The head ships this file and the remote/ modules it imports to each
node inline (`python -c <zlib+base64 blob>`, plan/agent_command.py), so a node needs no
orch install, just the job's interpreter.

`run SPEC NODE RANK`: start the node's command (its launcher) in its own session with the
job's id and this node's name in its environment (remote/procs.py finds them by those),
holding the lock of the environment it runs from shared while it runs (remote/env_lock.py:
`orch env push` does not swap that environment under the job);
tee the launcher's raw stdout/stderr into its node directory (/tmp/orch-<uid>/runs/<job>/<node>/,
the user's own, or below the spec's node_root: agent_spec.py) as {stdout,stderr}.raw,
and each rank's, which arrive on connections of their own (remote/rank_streams.py), into
rank<R>.{stdout,stderr}.raw; frame all of them onto the agent's own stdout, the channel
back to the head (remote/channel.py), with heartbeats and an `exit` control message at the
end, naming the rank that failed first (remote/rank_watch.py). When the head goes away
the agent tears its job down by itself; when the command ends it sweeps what is left of
the job on this node (remote/sweep.py).

The parts:
  agent_spec.py      the spec (one frozen value) and where the job's files live on a node
  procs.py           the job's processes and ranks on this node, under /proc
  main_port.py       on node 0: whether what listens on the main port is the job's
  sweep.py           TERM, grace, KILL of the job's processes on this node (also `orch kill`)
  channel.py         the channel to the head: wire lines, control messages, heartbeats
  rank_streams.py    the ranks' own output, over a unix socket
  rank_watch.py      which rank failed first
  flight_recorder.py NCCL's flight recorder, in the names the node's torch reads
  env_lock.py        the lock beside the environment that keeps a push's swap out
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

try:  # shipped inline: the bootstrap loaded them beside this program as orch_<name>
    import orch_agent_spec as agent_spec
    import orch_channel as channel
    import orch_env_lock as env_lock
    import orch_flight_recorder as flight_recorder
    import orch_logwire as logwire
    import orch_main_port as main_port
    import orch_owned as owned
    import orch_procs as procs
    import orch_rank as rank_program
    import orch_rank_site as rank_site
    import orch_rank_streams as rank_streams
    import orch_rank_watch as rank_watch
    import orch_sweep as sweep
except ImportError:
    from orchestrator.remote import (
        agent_spec,
        channel,
        env_lock,
        flight_recorder,
        logwire,
        main_port,
        owned,
        procs,
        rank_site,
        rank_streams,
        rank_watch,
        sweep,
    )
    from orchestrator.remote import rank as rank_program

AgentSpec = agent_spec.AgentSpec
node_dir = agent_spec.node_dir
PRIVATE_FILE = agent_spec.PRIVATE_FILE
JOB_ID_VAR = procs.JOB_ID_VAR
NODE_VAR = procs.NODE_VAR
NODE_RANK_VAR = procs.NODE_RANK_VAR
NODE_DIR_VAR = procs.NODE_DIR_VAR
RANK_PROGRAM = agent_spec.RANK_PROGRAM
MAIN_PORT_WAIT_S = 120.0  # how long a worker waits for node 0's main port
_EXIT_SCAN_S = 0.2


def _source(module: ModuleType) -> str:
    """A shipped module's text: as the bootstrap loaded it, or its installed file."""
    source = getattr(module, "__orch_source__", None)
    if source is None:
        source = Path(str(module.__file__)).read_text(encoding="utf-8")
    return source


class Supervisor:
    def __init__(self, spec: AgentSpec, node: str, rank: str) -> None:
        self.spec = spec
        self.job_id = spec.job_id
        self.node = node
        self.rank = rank
        self.uid = os.getuid()  # the node's account, whatever the head's is
        # Where the node directory will be; _prepare makes it and holds the place it made.
        self.dir = Path(node_dir(self.job_id, node, self.uid, spec.node_root))
        self.channel = channel.Channel(f"{node}: ".encode() if spec.label_lines else b"")
        self.tail = channel.Tail()
        self.stop_reason: str | None = None
        self.slurm_term = sweep.SlurmTerm(os.environ)
        self.ranks = rank_watch.RankWatch(self.job_id, node)
        self.rank_channels: rank_streams.RankChannels | None = None
        self.job_env: dict[str, str] = {}  # from the private file: secrets included
        self.rank_argv: list[str] = []
        self.port_watch: main_port.Watch | None = None  # node 0's, once its launcher runs
        self.error: str | None = None  # why the job was ended here, when not by its command
        self.env_hold: int | None = None  # the environment's lock, held shared while the job runs

    def _load_private(self) -> str | None:
        """Take in what the head wrote for this job on the node (the job's env, the rank's
        argv) and remove it: it holds secrets, and the node directory comes back to the
        head's record. Returns why it could not, or None."""
        wanted = self.spec.private_sha256
        if not wanted:
            return None
        path = self.dir / PRIVATE_FILE
        try:
            with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                data = handle.read()
        except OSError as err:
            return f"the job's settings did not reach {self.node} ({path}: {err.strerror})"
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
        if hashlib.sha256(data).hexdigest() != wanted:
            return f"the job's settings on {self.node} ({path}) are not the ones this job wrote"
        private = json.loads(data)
        self.job_env = {str(k): str(v) for k, v in private["env"].items()}
        self.rank_argv = [str(word) for word in private["rank_argv"]]
        return None

    def _env(self) -> dict[str, str]:
        env = without_step_variables(os.environ)
        # The launcher's own settings (accelerate's, on the pdsh launcher) first; the job's win.
        env.update(self.spec.env)
        env.update(self.job_env)
        for name, first in self.spec.path_first:
            env[name] = os.pathsep.join(p for p in (first, env.get(name, "")) if p)
        env[JOB_ID_VAR] = self.job_id
        env[NODE_VAR] = self.node
        env[NODE_RANK_VAR] = self.rank
        env[NODE_DIR_VAR] = str(self.dir)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.rank_channels is not None:  # the launchers find orch-rank on PATH
            start_dir = self.dir / rank_program.START_DIR
            env["PATH"] = os.pathsep.join([str(start_dir), env.get("PATH", "")])
            env[procs.KEPT_VAR] = "1"  # every rank has a keeper: procs.py tells them apart
        recorder = flight_recorder.flight_recorder_env(
            str(self.dir), flight_recorder.torch_version()
        )
        for name, value in recorder.items():
            env.setdefault(name, value)  # the user's own settings win
        return env

    def _write_files(self) -> None:
        for name, content in self.spec.files:
            path = self.dir / os.path.basename(name)
            owned.write_private_file(str(path), content.encode())

    def _private_subdir(self, name: str) -> Path:
        path = self.dir / name
        owned.private_directory(str(path), self.uid)
        return path

    def _prepare_ranks(self) -> None:
        """What the launcher's `--no_python orch-rank` starts: the per-rank program, the
        rank's exact command (readable by this user only), and the socket it reports to."""
        if not self.rank_argv:
            return
        # What every rank runs: made and checked like the node directory, never through a
        # link, and readable by the user alone.
        bin_dir = self._private_subdir(rank_program.START_DIR)
        program = bin_dir / "orch_rank.py"
        owned.write_private_file(str(program), _source(rank_program).encode())
        path = rank_streams.socket_path(self.dir)
        command = {"argv": self.rank_argv, "socket": path}
        owned.write_private_file(str(self.dir / rank_program.COMMAND_FILE),
                                 json.dumps(command).encode())  # fmt: skip
        site_dir = self._private_subdir(rank_program.SITE_DIR)
        owned.write_private_file(str(site_dir / "sitecustomize.py"), _source(rank_site).encode())
        # -I -S: the wrapper needs nothing but the standard library, and starts fastest so.
        launcher = (
            "#!/bin/sh\n"
            f"exec {shlex.quote(self.rank_argv[0])} -I -S {shlex.quote(str(program))} \"$@\"\n"
        )
        owned.write_private_file(str(bin_dir / RANK_PROGRAM), launcher.encode(), 0o700)
        self.rank_channels = rank_streams.RankChannels(
            self.channel, self.dir, self.node, path, self._rank_ended
        )

    def _prepare(self) -> str | None:
        """The node directory (made by the head's settings writer, or here: checked either
        way), the job's settings taken in, its files and the ranks' program written; why
        not, or None."""
        try:
            made = agent_spec.make_node_dir(self.job_id, self.node, self.uid, self.spec.node_root)
            self.dir = Path(made)  # chosen once: what was checked is what is used
            problem = self._load_private()
            if problem:
                return problem
            self._write_files()
            self._prepare_ranks()
        except owned.UnsafeDirectory as err:
            return f"the job's directory on {self.node} is not safe to use: {err}"
        except OSError as err:
            return f"the job's files on {self.node}: {err.filename}: {err.strerror or err}"
        return None

    def _rank_ended(self, rank: int, local_rank: int, report: dict) -> None:
        """A keeper reported its rank's end: the head hears of it at once."""
        kept = self.ranks.reported(rank, local_rank, report)
        if kept is not None:
            self.channel.control(logwire.ControlKind.RANK_END, node=self.node, **kept)

    def _pump_stream(self, fd: int, stream: str, raw: Path) -> None:
        framer = logwire.WireFramer(stream, max_line=self.channel.line_max)
        pump = channel.OutputPump(self.channel, framer, raw, self.tail)
        pump.run(lambda: os.read(fd, 65536))
        os.close(fd)

    def _wait_for_main(self) -> bool:
        target = self.spec.wait_for
        if target is None or self.rank == "0":
            return True
        host, port = target
        deadline = time.monotonic() + MAIN_PORT_WAIT_S
        while time.monotonic() < deadline and not self.channel.broken.is_set():
            self.channel.heartbeat(waiting=f"{host}:{port}")
            with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
                return True
            time.sleep(0.5)
        return False

    def _guarded_port(self) -> int:
        """The main port this agent vouches for: node 0's, where every launcher listens."""
        return self.spec.main_port if self.rank == "0" else 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        # Slurm's SIGTERM inside a step is the head's to act on (sweep.SlurmTerm).
        if not self.slurm_term.take(signum, time.monotonic()):
            self.stop_reason = signal.Signals(signum).name

    def _slurm_signal(self) -> None:
        if self.slurm_term.at is None:
            return
        if self.slurm_term.to_say():
            self.channel.control(logwire.ControlKind.SIGNALLED, node=self.node,
                                 signal=signal.SIGTERM.name)  # fmt: skip
        begun = rank_program.stop_until(str(self.dir)) is not None
        if self.slurm_term.overdue(begun, time.monotonic()):
            self.stop_reason = signal.SIGTERM.name

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        problem = self._prepare()
        if problem:
            return self._finish(127, error=problem)
        workdir = self.spec.workdir or os.getcwd()
        if not os.path.isdir(workdir):
            return self._finish(
                127, error=f"working directory {workdir} does not exist on {self.node}"
            )
        if not self._wait_for_main():
            host, port = self.spec.wait_for or ("", 0)
            return self._finish(1, error=f"main port {host}:{port} never answered")
        port = self._guarded_port()
        taken = port and main_port.check_before_start(port, self.job_id, self.node, self.uid)
        if taken:  # another's listener there before the launcher even started
            return self._finish(1, error=taken)
        argv = self.spec.node_argv(self.rank)
        self._hold_environment()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=self._env(),
                cwd=workdir,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as err:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            return self._finish(127, error=f"cannot start {argv[0]}: {err}")
        os.close(out_w)
        os.close(err_w)
        if port:  # the workers connect as soon as it listens: what listens must be the job's
            self.port_watch = main_port.Watch(port, self.job_id, self.node, self.uid).start()
        step = os.environ.get("SLURM_STEP_ID")
        where = {"slurm_step": f"{os.environ.get('SLURM_JOB_ID')}.{step}"} if step else {}
        self.channel.control(logwire.ControlKind.STARTED, pid=child.pid, node=self.node,
                             node_rank=int(self.rank), **where)  # fmt: skip
        pumps = [
            threading.Thread(target=self._pump_stream, args=(fd, name, self.dir / raw), daemon=True)
            for fd, name, raw in ((out_r, "out", "stdout.raw"), (err_r, "err", "stderr.raw"))
        ]
        for pump in pumps:
            pump.start()
        code = self._watch(child)
        if self.port_watch is not None:
            self.port_watch.stop()
        for pump in pumps:
            pump.join(5.0)
        # A stream still open now (a process of the job kept it) is not waited for: the head
        # hears how many, so a log that ends short says why.
        unfinished = sum(pump.is_alive() for pump in pumps)
        if self.rank_channels is not None:
            unfinished += self.rank_channels.close(5.0)
        return self._finish(code, error=self.error, unfinished=unfinished)

    def _hold_environment(self) -> None:
        """The environment this agent (the job's interpreter) runs from, held shared until
        the job ends: a push waits for the start, and is refused while the job runs."""

        def beat() -> None:
            self.channel.heartbeat(waiting="the environment's lock")

        self.env_hold = env_lock.hold_shared(env_lock.own_environment(), waiting=beat)

    def _watch(self, child: subprocess.Popen[bytes]) -> int:
        while True:
            code = child.poll()
            self.ranks.scan_if_due(time.monotonic())
            if code is not None:
                return code
            if self.channel.gone():
                self.stop_reason = "head gone"
            self._slurm_signal()
            problem = self.port_watch.problem if self.port_watch is not None else None
            if self.stop_reason or problem:
                self._sweep()
                child.wait()
                if self.stop_reason:
                    return 128 + signal.SIGTERM
                self.error = problem  # the head hears it and tears the job down everywhere
                return 1
            self.channel.heartbeat()
            time.sleep(_EXIT_SCAN_S)

    def _sweep(self) -> dict[str, int]:
        return sweep.stop_job(self.job_id, self.node, self.spec.grace)

    def _finish(self, code: int, error: str | None = None, unfinished: int = 0) -> int:
        # Nothing of the job may outlive its command on this node.
        stopped = self._sweep()
        self.ranks.scan()  # the ranks the sweeps ended: seen gone before the ends are told
        if self.env_hold is not None:  # the job is gone: a push may swap its environment
            os.close(self.env_hold)
            self.env_hold = None
        for at, rank_seen, rank_seen_code in self.ranks.unreported():
            self.channel.control(logwire.ControlKind.RANK_END, node=self.node, rank=rank_seen,
                                 end=round(at, 6), code=rank_seen_code, seen="scan")  # fmt: skip
        rank, rank_code = None, None
        if code != 0:
            rank, rank_code = self.ranks.first_failed(code)
        if rank is None:  # no end seen here: torchrun's own report may name one
            rank, rank_code = rank_watch.failure_from_text(self.tail.text())
        fields: dict[str, object] = {"code": code, "node": self.node}
        if rank is not None:
            fields["rank"] = rank
        if rank_code is not None:
            fields["rank_code"] = rank_code
        if code != 0 and self.ranks.gone_at is not None:
            fields["failed_at"] = round(self.ranks.gone_at, 3)
        if error:
            fields["error"] = error
        if self.stop_reason:
            fields["stopped"] = self.stop_reason
        if stopped["killed"]:
            fields["killed_leftovers"] = stopped["killed"]
        if unfinished:
            fields["unfinished_streams"] = unfinished
        self.channel.control(logwire.ControlKind.EXIT, **fields)
        if code != 0 and not self.stop_reason:
            self._linger(self.spec.linger_s)
        self.channel.close()
        return code if code >= 0 else 128 - code

    def _linger(self, seconds: float) -> None:
        """Under srun, a failed node's agent stays until the head ends the step (or this
        bound passes): its exit would make Slurm end every node's ranks at once
        (--kill-on-bad-exit), before the head has taken the survivors' stacks."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop_reason:
            if self.channel.broken.is_set():
                return
            time.sleep(0.1)


# ----- under srun ----------------------------------------------------------------------
# What srun sets about orch's own step (one agent task per node), which says nothing true
# of the ranks: a library that trusts SLURM_PROCID and SLURM_NTASKS (Lightning does, ahead of
# torchrun's RANK) would take a node's index for a rank. The job's own SLURM_JOB_* stay.
STEP_VARIABLES = frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_GTIDS", "SLURM_TASK_PID",
    "SLURM_STEPID", "SLURM_DISTRIBUTION",
})  # fmt: skip
STEP_PREFIXES = ("SLURM_STEP_", "SLURM_SRUN_COMM_", "SLURM_CPU_BIND")


def without_step_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment for the launcher and its ranks: the agent's, minus what describes the
    srun step that started the agent."""
    return {
        name: value
        for name, value in environ.items()
        if name not in STEP_VARIABLES and not name.startswith(STEP_PREFIXES)
    }


def slurm_node_and_rank(spec: AgentSpec, node: str, rank: str) -> tuple[str, str]:
    """Under srun, `-` for the node is Slurm's name for it, and `-` for its rank is that
    name's place in the job's hosts (the order of the plan, node 0 first)."""
    node = procs.node_name(node)
    if rank == "-":
        hosts = spec.hosts
        rank = str(hosts.index(node)) if node in hosts else os.environ.get("SLURM_NODEID", "0")
    return node, rank


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "run":
        spec = agent_spec.decode(argv[1])
        node, rank = slurm_node_and_rank(spec, argv[2], argv[3])
        return Supervisor(spec, node, rank).run()
    print("usage: agent run SPEC NODE RANK", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
