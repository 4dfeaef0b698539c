"""The short re-check of a job's nodes over SSH: before its first attempt when it has spares,
and after a failed attempt when a restart may follow (the restart policy drops the nodes
that do not answer)."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.nodes.transport import NodeTransport, SshTransport

RECHECK_CONNECT_S, RECHECK_TIMEOUT_S = 5.0, 10.0


def unreachable_nodes(nodes: Sequence[str],
                      transport: NodeTransport | None = None) -> tuple[str, ...]:  # fmt: skip
    """The nodes that do not run a trivial command within a few seconds (over SSH unless
    `transport` says otherwise)."""
    if not nodes:
        return ()
    results = (transport or SshTransport()).run(nodes, "true", timeout=RECHECK_TIMEOUT_S,
                                                connect_timeout=RECHECK_CONNECT_S)  # fmt: skip
    return tuple(r.node for r in results if not r.ok or r.value.exit_code != 0)
