"""Values every layer shares. Imports nothing of orch, so anything may import it."""

from __future__ import annotations

from enum import StrEnum

LAUNCHERS = ("pdsh", "standard", "torchrun")
CONFIG_LAUNCHERS = ("pdsh", "standard")  # the launchers that run from an accelerate config
DEFAULT_LAUNCHER = "pdsh"


class Transport(StrEnum):
    """How orch's own commands reach the nodes, as job.json and `--transport` say it."""

    SSH = "ssh"  # paramiko, from the head
    SLURM = "slurm"  # srun steps inside the job's Slurm allocation


DEFAULT_MAIN_PORT = 29500  # torch.distributed's and accelerate's default rendezvous port
PORT_RANGE = (1, 65535)
# Where orch picks a job's main port when none is given: from the default up, below the
# Linux ephemeral range (32768+), so an outgoing connection never takes it first.
CHOSEN_PORT_RANGE = (DEFAULT_MAIN_PORT, DEFAULT_MAIN_PORT + 999)

# The first thing a node command orch times prints on stderr: the user's login shell (and
# its start-up files) ran before it, and what they printed on stderr came before it.
SHELL_UP_MARKER = "ORCH-SHELL-UP"

# Set on every process of a job on every node; the only way orch finds them again.
# remote/procs.py carries its own copy (it is shipped alone); a test holds them equal.
JOB_ID_VAR = "ORCH_JOB_ID"
# Which attempt of the job this is: 0 on the first, 1 after one restart (as torchrun's
# TORCHELASTIC_RESTART_COUNT), so a script knows to resume from its checkpoint.
RESTART_COUNT_VAR = "ORCH_RESTART_COUNT"
# How every stop of the job reaches its ranks: the signal's name (SIGTERM) and the seconds
# the ranks have to save and exit by themselves, so a script installs the right handler.
STOP_SIGNAL_VAR = "ORCH_STOP_SIGNAL"
STOP_GRACE_VAR = "ORCH_STOP_GRACE"
# torchrun and accelerate's launcher (torch elastic) KILL their ranks this many seconds after
# a signal reaches them (30 by default): a Slurm preemption or `scancel` signals every
# process of the job, launchers included, so orch sets it past the stop's grace.
LAUNCHER_SHUTDOWN_VAR = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
LAUNCHER_SHUTDOWN_MARGIN_S = 15  # after the grace: the head's own teardown comes first
# Where the job writes its checkpoints (--checkpoint-dir): the same absolute path on every node.
CHECKPOINT_DIR_VAR = "ORCH_CHECKPOINT_DIR"


def is_tcp_port(port: int) -> bool:
    return PORT_RANGE[0] <= port <= PORT_RANGE[1]


def port_range_text() -> str:
    return f"{PORT_RANGE[0]}..{PORT_RANGE[1]}"

# Files a launch writes (in runs/<job>/) and `orch config` writes (in its output directory).
HOSTFILE_NAME = "hostfile"
PDSH_CONFIG_NAME = "accelerate-pdsh.yaml"


def standard_config_name(machine_rank: int | str) -> str:
    """One accelerate config per machine for the standard launcher; a str rank may be a
    shell variable that the node expands."""
    return f"accelerate-rank{machine_rank}.yaml"

# Seconds between TERM and KILL when a job's processes are stopped on a node.
STOP_GRACE_S = 5.0

# The version of every JSON document orch writes (job.json) or prints (--json), beside its
# `schema` name (`orch.job`, `orch.doctor`, ...): raised when a field changes meaning or goes.
SCHEMA_VERSION = 1
