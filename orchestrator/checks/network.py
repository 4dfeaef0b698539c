"""Network checks: name resolution, hostnames, the main port, NCCL and InfiniBand
settings against the interfaces. Pure: facts in, findings out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from orchestrator.checks.model import Finding, NodeProbe, Severity, with_facts
from orchestrator.checks.parity import majority_value

if TYPE_CHECKING:
    pass

_DEBIAN_HOSTNAME_TRAP = ("127.0.0.1", "127.0.1.1")


# ----- network --------------------------------------------------------------------------
def check_resolution(probes: Sequence[NodeProbe], names: Sequence[str]) -> list[Finding]:
    """Every node resolves every hostfile name, all to the same addresses."""
    facts = with_facts(probes)
    findings: list[Finding] = []
    main = names[0] if names else None
    for f in facts:
        for name, error in f.resolve_errors.items():
            severity: Severity = "error" if name == main else "warning"
            why = " (it is the main node: ranks rendezvous there)" if name == main else ""
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node} cannot resolve {name}{why}: {error}",
                    f"add `<address> {name}` to /etc/hosts on {f.node}, or fix DNS",
                    severity,
                )
            )
    for name in names:
        seen = [(f.node, f.resolved[name]) for f in facts if name in f.resolved]
        if len({addrs for _, addrs in seen}) > 1:
            majority = majority_value([addrs for _, addrs in seen])
            for node, addrs in seen:
                if addrs != majority:
                    findings.append(
                        Finding(
                            node,
                            "network",
                            f"{node} resolves {name} to {', '.join(addrs)}, most nodes to "
                            f"{', '.join(majority or ())}",
                            f"make /etc/hosts or DNS on {node} agree with the other nodes",
                        )
                    )
        if len(names) > 1:
            for node, addrs in seen:
                trap = sorted(set(addrs) & set(_DEBIAN_HOSTNAME_TRAP))
                if trap:
                    findings.append(
                        Finding(
                            node,
                            "network",
                            f"{node} resolves {name} to {trap[0]}, a loopback address other "
                            "nodes cannot reach (the Debian /etc/hosts hostname line)",
                            f"in /etc/hosts on {node}, map {name} to its network address",
                            "error" if name == main else "warning",
                        )
                    )
    return findings


def check_hostnames(probes: Sequence[NodeProbe]) -> list[Finding]:
    """Each node's own hostname must resolve on node 0 (gloo and NCCL look it up)."""
    main = probes[0].facts if probes else None
    if main is None or not main.hostnames:
        return []
    findings = []
    for f in with_facts(probes):
        answer = main.hostnames.get(f.hostname)
        if isinstance(answer, str):
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node}'s hostname {f.hostname!r} does not resolve on the main node "
                    f"{main.node}: {answer}",
                    f"add `<{f.node}'s address> {f.hostname}` to /etc/hosts on {main.node} "
                    "(and on every node), or fix DNS",
                )
            )
    return findings


def check_main_port(
    probes: Sequence[NodeProbe], address: str | None, port: int | None, chosen: bool = False
) -> list[Finding]:
    """Node 0 could hold the main port, and every other node reached it there. `chosen`:
    orch picked the port as free on node 0 a moment before (none was given): one another
    process took since says nothing of the node, a launch picks its own."""
    main = probes[0].facts if probes else None
    if main is None or main.port is None:
        return []  # node 0 gave no facts: reported already, nothing to test against
    if not main.port_free and chosen:
        return [
            Finding(
                main.node,
                "network",
                f"port {main.port}, free on {main.node} when orch picked it for this check, "
                "was taken by another process meanwhile: whether the other nodes reach node 0 "
                "was not tested",
                "run doctor again, or give the job's port with --main-port",
                "warning",
            )
        ]
    if not main.port_free:
        return [
            Finding(
                main.node,
                "network",
                f"main port {main.port} is already in use on {main.node} "
                f"({main.port_error or 'in use'})",
                f"stop what listens there (on {main.node}: `ss -ltnp 'sport = :{main.port}'`) "
                "or choose another port with --main-port",
            )
        ]
    findings = []
    for f in with_facts(probes[1:]):
        if f.main_reached is False:
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"{f.node} cannot connect to the main node at {address}:{port} "
                    f"({f.main_error or 'no answer'})",
                    f"open TCP port {port} on {main.node} for the other nodes and check routing "
                    f"(on {f.node}: `nc -zv {address} {port}`)",
                )
            )
    return findings


def _iface_rules(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME: '^' excludes, '=' means exact names, else prefixes."""
    exclude = value.startswith("^")
    body = value[1:] if exclude else value
    exact = body.startswith("=")
    body = body[1:] if exact else body
    return exclude, exact, [p for p in body.split(",") if p]


def interfaces_matching(value: str, interfaces: Iterable[str]) -> list[str]:
    exclude, exact, patterns = _iface_rules(value)

    def hit(name: str) -> bool:
        return any(name == p if exact else name.startswith(p) for p in patterns)

    return [name for name in interfaces if hit(name) != exclude]


def shared_interfaces(probes: Sequence[NodeProbe]) -> tuple[str, ...]:
    """Interfaces with an address on every node, loopback and docker excluded."""
    facts = with_facts(probes)
    if not facts:
        return ()
    common: set[str] | None = None
    for f in facts:
        names = {n for n, addrs in f.interfaces.items() if addrs}
        common = names if common is None else common & names
    return tuple(sorted(n for n in common or () if n != "lo" and not n.startswith("docker")))


def check_nccl_env(probes: Sequence[NodeProbe], env: Mapping[str, str]) -> list[Finding]:
    findings = []
    ifname = env.get("NCCL_SOCKET_IFNAME")
    ib_disable = env.get("NCCL_IB_DISABLE")
    nccl_net = env.get("NCCL_NET", "")
    hca = env.get("NCCL_IB_HCA")
    for f in with_facts(probes):
        if ifname:
            usable = [n for n in interfaces_matching(ifname, f.interfaces) if f.interfaces.get(n)]
            if not usable:
                have = ", ".join(n for n, a in f.interfaces.items() if a) or "none"
                findings.append(
                    Finding(
                        f.node,
                        "network",
                        f"NCCL_SOCKET_IFNAME={ifname} matches no interface with an address on "
                        f"{f.node} (it has: {have})",
                        "set NCCL_SOCKET_IFNAME to an interface every node has "
                        "(see the shared interfaces doctor lists)",
                    )
                )
        if not f.ib_devices and nccl_net.upper() == "IB":
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"NCCL_NET=IB but {f.node} has no InfiniBand device (/sys/class/infiniband)",
                    "unset NCCL_NET, or check the node's IB driver (`ibv_devinfo`)",
                )
            )
        elif not f.ib_devices and ib_disable is not None and ib_disable.strip() == "0":
            findings.append(
                Finding(
                    f.node,
                    "network",
                    f"NCCL_IB_DISABLE=0 but {f.node} has no InfiniBand device: "
                    "NCCL will use sockets",
                    "set NCCL_IB_DISABLE=1 on a cluster without InfiniBand, "
                    "or check the IB driver (`ibv_devinfo`)",
                    "warning",
                )
            )
        if hca and f.ib_devices:
            _, _, wanted = _iface_rules(hca)
            names = [w.split(":")[0] for w in wanted]
            if not any(d.startswith(n) for d in f.ib_devices for n in names):
                findings.append(
                    Finding(
                        f.node,
                        "network",
                        f"NCCL_IB_HCA={hca} names no IB device of {f.node} "
                        f"(it has: {', '.join(f.ib_devices)})",
                        "set NCCL_IB_HCA to devices listed in /sys/class/infiniband",
                        "warning",
                    )
                )
    return findings
