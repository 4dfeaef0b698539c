"""Checks of the options several commands share (launcher, ports, the heartbeat timeout),
with one wording each."""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.specs.constants import LAUNCHERS, is_tcp_port, port_range_text

# The launchers by the names of the tools they run: `deepspeed` is accelerate launch with
# DeepSpeed's pdsh multinode runner (orch's pdsh launcher), `accelerate` is accelerate
# launch on every node (orch's standard launcher).
LAUNCHER_ALIASES = {"deepspeed": "pdsh", "accelerate": "standard"}


def launcher_named(name: str, allowed: tuple[str, ...] = LAUNCHERS) -> str:
    """orch's name of the launcher `name` (its own, or a tool's: deepspeed, accelerate)."""
    launcher = LAUNCHER_ALIASES.get(name, name)
    check_launcher(launcher, allowed)
    return launcher


def check_launcher(launcher: str, allowed: tuple[str, ...] = LAUNCHERS) -> None:
    if launcher not in allowed:
        also = ", ".join(f"{alias} ({name})" for alias, name in LAUNCHER_ALIASES.items()
                         if name in allowed)  # fmt: skip
        raise UsageError(f"unknown launcher {launcher!r}",
                         f"use one of: {', '.join(allowed)}; also spelled {also}")  # fmt: skip


def check_port(port: int, what: str = "main port") -> None:
    if not is_tcp_port(port):
        raise UsageError(f"{what} {port} is out of range", f"use a port in {port_range_text()}")


# A node's agent beats this often (remote/channel.HEARTBEAT_S, shipped to the nodes on its
# own); a node is silent only once it missed this many beats in a row: one late beat (a
# busy node, a busy head) is not a dead node.
AGENT_BEAT_S = 2.0
MISSED_BEATS = 3


def check_heartbeat_timeout(seconds: float) -> None:
    least = AGENT_BEAT_S * MISSED_BEATS
    if seconds < least:
        raise UsageError(
            f"--heartbeat-timeout {seconds:g} is shorter than {least:g} s",
            f"a node's agent beats every {AGENT_BEAT_S:g} s, and one late beat is not a dead "
            f"node: use {least:g} or more (the default is 10)",
        )
