"""The doctor's report model: findings, per-node probes and statuses, the report. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.probe.facts import NodeFacts
from orchestrator.specs.jobenv import redact

if TYPE_CHECKING:
    pass



Severity = Literal["error", "warning"]
CHECK_GROUPS = ("ssh", "python", "files", "parity", "network", "gpu", "disk", "stacks")
CLUSTER = "*"  # the node of a finding about the whole cluster or a file



@dataclass(frozen=True)
class Finding:
    node: str
    check: str
    problem: str
    fix: str
    severity: Severity = "error"


@dataclass(frozen=True)
class NodeError:
    """Why a node gave no facts: an SSH failure kind, or "probe"."""

    kind: str
    message: str
    hint: str


@dataclass(frozen=True)
class NodeProbe:
    node: str
    facts: NodeFacts | None
    error: NodeError | None = None


@dataclass(frozen=True)
class ParityRow:
    fact: str
    majority: str
    differing: tuple[tuple[str, str], ...]  # (node, its value)


@dataclass(frozen=True)
class CollectiveResult:
    node: str
    ok: bool
    backend: str = ""
    seconds: float | None = None
    bus_bandwidth_mbps: float | None = None
    transport: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class NodeCheckStatus:
    node: str
    reachable: bool
    facts: NodeFacts | None
    groups: Mapping[str, str]  # check group -> "ok" | "warning" | "error" | "-"


@dataclass(frozen=True)
class DoctorReport:
    nodes: tuple[NodeCheckStatus, ...]
    findings: tuple[Finding, ...]
    parity: tuple[ParityRow, ...] = ()
    shared_interfaces: tuple[str, ...] = ()
    deep: tuple[CollectiveResult, ...] = ()
    main_port: int | None = None
    main_address: str | None = None
    seconds: float | None = None  # how long gathering the facts took

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "main": {"address": self.main_address, "port": self.main_port},
            "nodes": [
                {
                    "node": n.node,
                    "reachable": n.reachable,
                    "checks": dict(n.groups),
                    "facts": _facts_dict(n.facts),
                }
                for n in self.nodes
            ],
            "findings": [asdict(f) for f in self.findings],
            "parity": [
                {
                    "fact": row.fact,
                    "majority": row.majority,
                    "differing": [{"node": n, "value": v} for n, v in row.differing],
                }
                for row in self.parity
            ],
            "shared_interfaces": list(self.shared_interfaces),
            "deep": [asdict(r) for r in self.deep],
        }


def _facts_dict(facts: NodeFacts | None) -> dict[str, Any] | None:
    if facts is None:
        return None
    doc = asdict(facts)
    doc["packages"] = dict(facts.packages)
    doc["interfaces"] = {k: list(v) for k, v in facts.interfaces.items()}
    doc["resolved"] = {k: list(v) for k, v in facts.resolved.items()}
    doc["nccl_env"] = redact(facts.nccl_env)  # what is printed or saved never holds secrets
    return doc




def with_facts(probes: Sequence[NodeProbe]) -> list[NodeFacts]:
    return [p.facts for p in probes if p.facts is not None]
