"""A real Slurm over the sandbox's nodes: `orch sandbox up --slurm`.

One munged and one slurmctld run on the head; one slurmd runs inside each node's
namespaces (entered with nsenter), so it answers under the node's own hostname. Every
daemon listens on the one network namespace of this machine, so each slurmd has its own
port (`Port=` on its NodeName line) and `%n` in its spool, pid and log paths. Nothing
outside the sandbox's state directory is touched: the munge key and socket, the config
and every daemon's files live under `<sandbox>/slurm/`; clients find the config through
SLURM_CONF.

Accounting is off (no slurmdbd): `squeue` and `scontrol show job` know a job until
MinJobAge after it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import SandboxError
from orchestrator.nodes.slurm import node_states
from orchestrator.sandbox.ports import pick_slurm_ports
from orchestrator.sandbox.processes import is_zombie, namespace_init, pid_alive, still_ours
from orchestrator.sandbox.state import SandboxState

PARTITION = "sandbox"
# A job submitted here preempts the sandbox partition's jobs (requeued, after the grace),
# as a cluster's high-priority partition does.
URGENT_PARTITION = "urgent"
PREEMPT_GRACE_S = 90  # what Slurm grants a preempted job between its SIGTERM and SIGKILL
CLUSTER = "orchsandbox"
_READY_TIMEOUT_S = 120.0  # on a loaded 2-core machine, slurmctld and the slurmds take a while
# Long enough for orch inside a cancelled batch job to tear its job down before Slurm's
# SIGKILL (Slurm's own default).
KILL_WAIT_S = 30
PACKAGES = "slurmctld slurmd slurm-client munge"


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    port: int


@dataclass(frozen=True)
class SlurmDaemons:
    """What `up --slurm` started: the head's daemons and each node's nsenter."""

    conf: str
    controller_port: int
    pids: tuple[int, ...]  # munged, slurmctld, then one nsenter per node


def slurm_dir(sandbox_dir: Path) -> Path:
    return sandbox_dir / "slurm"


def conf_path(sandbox_dir: Path) -> Path:
    return slurm_dir(sandbox_dir) / "slurm.conf"


def require_tools() -> dict[str, str]:
    found = {tool: shutil.which(tool) for tool in ("munged", "slurmctld", "slurmd", "sinfo",
                                                 "nsenter")}  # fmt: skip
    missing = [tool for tool, path in found.items() if path is None]
    if missing:
        raise SandboxError(
            f"Slurm for the sandbox needs {', '.join(missing)}, not installed on this machine",
            f"install them: `sudo apt-get install -y {PACKAGES}` (scripts/setup.sh does)",
        )
    return {tool: str(path) for tool, path in found.items()}


def render_conf(directory: Path, controller_host: str, controller_port: int,
                nodes: Sequence[SlurmNode], cpus: int) -> str:  # fmt: skip
    """slurm.conf for the sandbox: no cgroups, no accounting, every path under `directory`."""
    d = directory
    lines = [
        "# Written by `orch sandbox up --slurm`; removed by `orch sandbox down`.",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={controller_host}(127.0.0.1)",
        f"SlurmctldPort={controller_port}",
        f"SlurmdPort={controller_port + 1}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d / 'munge' / 'munge.sock'}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={d / 'ctld'}",
        f"SlurmctldPidFile={d / 'ctld' / 'slurmctld.pid'}",
        f"SlurmctldLogFile={d / 'ctld' / 'slurmctld.log'}",
        f"SlurmdSpoolDir={d / '%n' / 'spool'}",
        f"SlurmdPidFile={d / '%n' / 'slurmd.pid'}",
        f"SlurmdLogFile={d / '%n' / 'slurmd.log'}",
        # The sandbox's nodes share one kernel and have no cgroup of their own.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # A node an admin (or a test) sets down stays down, with its reason, until resumed.
        "ReturnToService=1",
        # Nodes declare the CPUs the sandbox gives them, whatever the machine has.
        "SlurmdParameters=config_overrides",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "MinJobAge=300",
        f"KillWait={KILL_WAIT_S}",
        "Waittime=0",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
    ]
    lines += [
        f"NodeName={n.name} NodeAddr={n.address} Port={n.port} CPUs={cpus} State=UNKNOWN"
        for n in nodes
    ]
    lines += [
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
        f"PriorityTier=1 GraceTime={PREEMPT_GRACE_S}",
        f"PartitionName={URGENT_PARTITION} Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 "
        "PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


def slurm_environment(conf: str | os.PathLike[str]) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": os.fspath(conf)}


def start_over(state: SandboxState) -> SandboxState:
    """Start Slurm over a sandbox's running nodes; the state then names its daemons."""
    base = pick_slurm_ports(len(state.nodes) + 1)
    nodes = [SlurmNode(n.name, n.address, base + 1 + k) for k, n in enumerate(state.nodes)]
    inits = [namespace_init(n.pid) or n.pid for n in state.nodes]
    daemons = start(Path(state.directory), nodes, inits, cpus=state.slots)
    return replace(state, slurm_conf=daemons.conf, slurm_pids=daemons.pids)


def sinfo_states(state: SandboxState) -> dict[str, str]:
    """Each node's state in Slurm (sinfo), with --slurm; {} without, or no answer."""
    if not state.slurm_conf:
        return {}
    return node_states(slurm_environment(state.slurm_conf))


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> int:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
            start_new_session=True, close_fds=True,
        )  # fmt: skip
    return proc.pid


def _munge_key(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(1024))


def start(sandbox_dir: Path, nodes: Sequence[SlurmNode], node_inits: Sequence[int],
          cpus: int) -> SlurmDaemons:  # fmt: skip
    """Start munged, slurmctld and one slurmd per node (inside the node's namespaces, whose
    first process is `node_inits[k]`); wait until every node is idle."""
    tools = require_tools()
    d = slurm_dir(sandbox_dir)
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("munge", "ctld", *(n.name for n in nodes)):
        (d / sub).mkdir(parents=True, mode=0o700)
    (d / "munge").chmod(0o711)  # munged wants its socket's directory reachable by all
    _munge_key(d / "munge" / "munge.key")
    conf = conf_path(sandbox_dir)
    controller_port = nodes[0].port - 1
    conf.write_text(render_conf(d, socket.gethostname().split(".")[0], controller_port,
                                nodes, cpus))  # fmt: skip
    pids: list[int] = []
    try:
        pids.append(_spawn([
            tools["munged"], "--foreground", "--force",
            f"--key-file={d / 'munge' / 'munge.key'}", f"--socket={d / 'munge' / 'munge.sock'}",
            f"--pid-file={d / 'munge' / 'munged.pid'}", f"--seed-file={d / 'munge' / 'seed'}",
            f"--log-file={d / 'munge' / 'munged.log'}",
        ], d / "munge" / "out.log"))  # fmt: skip
        _wait_for(lambda: (d / "munge" / "munge.sock").exists(), 10, "munged", d / "munge")
        pids.append(_spawn([tools["slurmctld"], "-D", "-f", str(conf)], d / "ctld" / "out.log"))
        for node, init in zip(nodes, node_inits, strict=True):
            argv = [tools["nsenter"], "-t", str(init), "-u", "-m", "-p", "--",
                    tools["slurmd"], "-D", "-N", node.name, "-f", str(conf)]  # fmt: skip
            pids.append(_spawn(argv, d / node.name / "out.log"))
        env = slurm_environment(conf)
        _wait_for(lambda: _all_idle(env, len(nodes)), _READY_TIMEOUT_S, "Slurm's nodes", d)
    except BaseException:
        stop(pids, sandbox_dir)
        raise
    return SlurmDaemons(conf=str(conf), controller_port=controller_port, pids=tuple(pids))


def _all_idle(env: dict[str, str], count: int) -> bool:
    states = node_states(env)
    return len(states) == count and all(s == "idle" for s in states.values())


def _wait_for(ready, timeout: float, what: str, logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise SandboxError(f"{what} did not come up within {timeout:.0f}s",
                       f"see the logs under {logs}")  # fmt: skip


def stop(pids: Sequence[int], sandbox_dir: Path) -> None:
    """Stop the daemons (a node's slurmd also ends with its node's namespace). Each group is
    signalled only while its leader is still ours (alive, or our unreaped child): a daemon
    that ended and was reaped has left its pid, and so its group's id, to any process."""
    ours = [pid for pid in pids if still_ours(pid, sandbox_dir)]
    for pid in ours:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in ours:
        # Still running, or our own child not reaped yet: the pid is still this daemon's. A
        # daemon of an earlier `orch sandbox up` that ended was reaped by init: its pid is free.
        if still_ours(pid, sandbox_dir) or is_zombie(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
