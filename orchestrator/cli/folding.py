"""Many node names in the width of a table cell: `node[01-32,40]`."""

from __future__ import annotations

from collections.abc import Sequence

from ClusterShell.NodeSet import NodeSet


def nodes_text(nodes: Sequence[str]) -> str:
    """The node set of `nodes`, names that are no host names (`the head`) first."""
    plain = [n for n in nodes if " " in n]
    names = [n for n in nodes if " " not in n]
    try:
        folded = str(NodeSet.fromlist(names)) if names else ""
    except Exception:  # a name NodeSet cannot fold is shown as it is
        folded = ",".join(names)
    return ", ".join([*plain, folded] if folded else plain)
