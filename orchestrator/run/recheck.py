"""The short re-check of a job's nodes over SSH: before its first attempt when it has spares,
and after a failed attempt when a restart may follow (the restart policy drops the nodes
that do not answer)."""

from __future__ import annotations

from collections.abc import Sequence

RECHECK_CONNECT_S, RECHECK_TIMEOUT_S = 5.0, 10.0


def unreachable_nodes(nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes that do not run a trivial command over SSH within a few seconds."""
    from orchestrator.ssh import run_on_nodes

    if not nodes:
        return ()
    results = run_on_nodes(nodes, "true", timeout=RECHECK_TIMEOUT_S,
                           connect_timeout=RECHECK_CONNECT_S)  # fmt: skip
    return tuple(r.node for r in results if not r.ok or r.value.exit_code != 0)
