"""Faults injected for real, for tests and benchmarks: a node frozen and thawed."""

from __future__ import annotations

import contextlib
import os
import signal

from orchestrator.sandbox.processes import node_pids
from orchestrator.sandbox.state import SandboxState


def _signal_node(state: SandboxState, name: str, signum: signal.Signals) -> None:
    for pid in node_pids(state, name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def freeze(state: SandboxState, name: str) -> None:
    """SIGSTOP every process of a node: sockets stay open, nothing answers."""
    _signal_node(state, name, signal.SIGSTOP)


def thaw(state: SandboxState, name: str) -> None:
    _signal_node(state, name, signal.SIGCONT)
