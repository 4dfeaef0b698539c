"""A job's processes on this node, found under /proc. STANDARD LIBRARY ONLY (shipped inline
beside the agent and the stacks program).

A process belongs to a job on a node when its environment carries the job's id (JOB_ID_VAR)
and, when it names a node (NODE_VAR, which the agent sets beside the id), that node: nodes
may share one kernel (two hostfile entries on one machine, several slurmd on one host,
containers that share the host's process table), and one node's agent must not take the
other nodes' processes for its own. Processes are found by their environment, never by a
command-line pattern, and only the user's own count (their real uid): an agent running as
root must not take another user's process that carries the job's id for one of the job's.

A rank is such a process with RANK in its environment whose parent is its keeper: orch-rank
(remote/rank.py) stays every rank's parent and names itself in the rank's environment
(KEEPER_VAR = its pid). The keeper itself carries RANK but no pid of a keeper; a rank's own
children (data loader workers, a forkserver) inherit the keeper's pid but have the rank
for a parent. A process with RANK and no trace of a keeper at all (started by something
other than orch-rank) is a rank when its parent does not carry the same RANK.

Every function takes the /proc directory to read (`proc`), so the rules are tested on
fabricated trees.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

JOB_ID_VAR = "ORCH_JOB_ID"
NODE_VAR = "ORCH_NODE"
RANK_VAR = "RANK"
KEEPER_VAR = "ORCH_RANK_KEEPER"  # as remote/rank.py sets it
KEPT_VAR = "ORCH_RANKS_KEPT"  # set by the agent for its launcher: every rank has a keeper
# What the agent tells each node's command about where it runs (the head plans commands with
# them too): the node's rank in the hostfile and its private directory. remote/rank.py and
# remote/rank_site.py run alone on a node and carry copies, held equal by a test.
NODE_RANK_VAR = "ORCH_NODE_RANK"
NODE_DIR_VAR = "ORCH_NODE_DIR"
PROC = "/proc"


# ----- the rules, on values ---------------------------------------------------------
def parse_environ(raw: bytes) -> dict[str, str]:
    """/proc/<pid>/environ's NUL-separated NAME=VALUE entries."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


SLURM_NODE = "-"  # under srun, this node's name as Slurm gives it (no pdsh fills in %h)


def node_name(word: str) -> str:
    """The node a program was started for: `word`, or under srun (`-`) Slurm's name for
    this node, else its short host name."""
    if word != SLURM_NODE:
        return word
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def started_for(env: Mapping[str, str], job_id: str, node: str | None) -> bool:
    """Whether a process with this environment was started for the job on this node (one
    that names no node is taken as this node's: nothing tells it apart); node None: on any
    node of the job."""
    if env.get(JOB_ID_VAR) != job_id:
        return False
    started_on = env.get(NODE_VAR)
    return started_on is None or node is None or started_on == node


def own_rank(
    env: Mapping[str, str] | None, parent_env: Mapping[str, str] | None, parent: int = 0
) -> int | None:
    """The rank a process with this environment (and this parent) is, or None: no RANK,
    a keeper, a rank's child (which inherits its RANK)."""
    rank = _rank_in(env)
    if rank is None:
        return None
    keeper = (env or {}).get(KEEPER_VAR)
    if keeper is not None:
        return rank if keeper == str(parent) else None
    if (env or {}).get(KEPT_VAR):
        return None  # a keeper: its rank is its child
    return None if _rank_in(parent_env) == rank else rank


def _rank_in(env: Mapping[str, str] | None) -> int | None:
    value = (env or {}).get(RANK_VAR, "")
    return int(value) if value.isdigit() else None


# ----- reading /proc ----------------------------------------------------------------
def all_pids(proc: str = PROC) -> list[int]:
    return [int(entry) for entry in os.listdir(proc) if entry.isdigit()]


def _read_environ(pid: int, proc: str) -> bytes | None:
    try:
        with open(f"{proc}/{pid}/environ", "rb") as handle:
            return handle.read()
    except OSError:  # gone, a zombie, or another user's
        return None


def environ_of(pid: int, proc: str = PROC) -> dict[str, str] | None:
    raw = _read_environ(pid, proc)
    return None if raw is None else parse_environ(raw)


def owner_of(pid: int, proc: str = PROC) -> int | None:
    """The process's real uid (status's Uid line; the /proc entry's owner where there is
    none), or None when it is gone."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    try:
        return os.stat(f"{proc}/{pid}").st_uid
    except OSError:
        return None


def job_environs(job_id: str, node: str | None, proc: str = PROC,
                 uid: int | None = None) -> dict[int, bytes]:  # fmt: skip
    """Every live process of the job started on this node (None: on any node of the job
    that shares this kernel) by this user (`uid`, this process's by default), this one
    left out: pid -> its environment as /proc has it (it changes when the process execs)."""
    needle = f"\0{JOB_ID_VAR}={job_id}\0".encode()
    me = os.getpid()
    user = os.getuid() if uid is None else uid
    found = {}
    for pid in all_pids(proc):
        raw = _read_environ(pid, proc) if pid != me else None
        # Most processes are not the job's: look for its id before parsing anything.
        if raw is None or needle not in b"\0" + raw + b"\0":
            continue
        if started_for(parse_environ(raw), job_id, node) and owner_of(pid, proc) == user:
            found[pid] = raw
    return found


def job_pids(job_id: str, node: str | None, proc: str = PROC, uid: int | None = None) -> list[int]:
    """The pids of job_environs."""
    return list(job_environs(job_id, node, proc, uid))


def stat_fields(pid: int, proc: str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        with open(f"{proc}/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def parent_of(pid: int, proc: str = PROC) -> int:
    fields = stat_fields(pid, proc)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def rank_at(pid: int, proc: str = PROC, environ: bytes | None = None) -> int | None:
    """The rank process `pid` is (own_rank's rule), or None; `environ`: its environment as
    already read from /proc."""
    env = environ_of(pid, proc) if environ is None else parse_environ(environ)
    if _rank_in(env) is None:
        return None
    parent = parent_of(pid, proc)
    return own_rank(env, environ_of(parent, proc), parent)


def job_ranks(job_id: str, node: str, proc: str = PROC) -> list[tuple[int, int]]:
    """(rank, pid) of the job's ranks started on this node, by rank."""
    found = [(rank_at(pid, proc), pid) for pid in job_pids(job_id, node, proc)]
    return sorted((rank, pid) for rank, pid in found if rank is not None)


def zombie_exit_code(pid: int, proc: str = PROC) -> int | None:
    """The exit code of a process that ended but is not reaped yet (Linux >= 3.5), negative
    for a signal."""
    fields = stat_fields(pid, proc)
    if len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[-1])
    return status >> 8 if status & 0x7F == 0 else -(status & 0x7F)
