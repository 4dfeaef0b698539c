"""Checks of the options several commands share (launcher, ports), with one wording each."""

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
