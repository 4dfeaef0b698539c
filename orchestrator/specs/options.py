"""Checks of the options several commands share (launcher, ports), with one wording each."""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.specs.constants import LAUNCHERS, is_tcp_port, port_range_text


def check_launcher(launcher: str, allowed: tuple[str, ...] = LAUNCHERS) -> None:
    if launcher not in allowed:
        raise UsageError(f"unknown launcher {launcher!r}", f"use one of: {', '.join(allowed)}")


def check_port(port: int, what: str = "main port") -> None:
    if not is_tcp_port(port):
        raise UsageError(f"{what} {port} is out of range", f"use a port in {port_range_text()}")
