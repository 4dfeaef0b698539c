"""The collective check (--deep): what each node's all_reduce reported, and NCCL's
transport read from its output. Pure."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.checks.model import CollectiveResult, Finding, NodeProbe

if TYPE_CHECKING:
    pass

# ----- the collective check -----------------------------------------------------------------
_NCCL_VIA = re.compile(r"via (NET/[A-Za-z]+|P2P|SHM|direct)")


def nccl_transport(output: str) -> str | None:
    """The network transport NCCL_DEBUG=INFO says it used (NET/IB, NET/Socket, ...)."""
    found = Counter(m.group(1) for m in _NCCL_VIA.finditer(output))
    net = [t for t in found if t.startswith("NET/")]
    if net:
        return max(net, key=lambda t: found[t])
    match = re.search(r"NCCL INFO Using network (\w+)", output)
    if match:
        return f"NET/{match.group(1)}"
    return found.most_common(1)[0][0] if found else None


def check_collective(
    results: Sequence[CollectiveResult], probes: Sequence[NodeProbe]
) -> list[Finding]:
    findings = []
    ib = {p.node for p in probes if p.facts is not None and p.facts.ib_devices}
    speeds = [r.bus_bandwidth_mbps for r in results if r.ok and r.bus_bandwidth_mbps]
    typical = sorted(speeds)[len(speeds) // 2] if speeds else None
    for r in results:
        if not r.ok:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"all_reduce failed on {r.node}: {r.error}",
                    "check the node's network (firewall between nodes, NCCL_SOCKET_IFNAME) "
                    "and its torch install",
                )
            )
            continue
        if r.transport == "NET/Socket" and r.node in ib:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"NCCL on {r.node} fell back to sockets although it has InfiniBand",
                    "set NCCL_NET=IB (and NCCL_IB_HCA / NCCL_IB_GID_INDEX for RoCE), "
                    "and check NCCL_IB_DISABLE is not 1",
                )
            )
        if typical and r.bus_bandwidth_mbps and r.bus_bandwidth_mbps < typical / 2:
            findings.append(
                Finding(
                    r.node,
                    "deep",
                    f"{r.node} reached {r.bus_bandwidth_mbps:.0f} MB/s in all_reduce, under half "
                    f"the typical {typical:.0f} MB/s",
                    "check its link (speed, errors: `ethtool`, `ibstat`) and NCCL transport",
                    "warning",
                )
            )
    return findings
