"""The doctor's report model: findings, per-node probes and statuses, the report. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.pernode import ShellStartup
from orchestrator.probe.facts import NodeFacts
from orchestrator.specs.jobenv import redact

if TYPE_CHECKING:
    pass



Severity = Literal["error", "warning"]
CHECK_GROUPS = ("ssh", "shell", "python", "files", "parity", "network", "gpu", "disk", "stacks")
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
    shell: ShellStartup | None = None  # a bare command before the probe


@dataclass(frozen=True)
class ParityRow:
    fact: str
    majority: str
    differing: tuple[tuple[str, str], ...]  # (node, its value)


HEAD = "the head"  # the environment's reference, where the head runs the job's interpreter
Kind = Literal["interpreter", "launcher", "script", "other"]
KINDS: tuple[Kind, ...] = ("interpreter", "launcher", "script", "other")
Fold = Callable[[Sequence[str]], str]


@dataclass(frozen=True)
class EnvDifference:
    """One package (or the interpreter, its ABI, the platform) that is not the same
    everywhere: the reference's value, and every other value with the nodes that have it."""

    item: str
    kind: Kind
    reference: str | None  # None: not installed there
    others: tuple[tuple[str | None, tuple[str, ...]], ...]
    every_node_differs: bool = False  # no compared node has the reference's value

    @property
    def severity(self) -> Severity:
        return "warning" if self.kind == "other" else "error"

    def describe(self, reference_name: str, fold: Fold = ", ".join) -> str:
        """`4.46.0 on node2; missing on node3; 4.46.1 elsewhere`, with `fold` writing a
        list of nodes (the CLI folds them as node sets: `node[2-5,9]`)."""
        parts = [f"{show_value(value)} on {fold(nodes)}" for value, nodes in self.others]
        where = f"on {reference_name}" if self.every_node_differs else "elsewhere"
        return "; ".join([*parts, f"{show_value(self.reference)} {where}"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "package": self.item,
            "kind": self.kind,
            "severity": self.severity,
            "reference": self.reference,
            "others": [{"value": v, "nodes": list(n)} for v, n in self.others],
        }


@dataclass(frozen=True)
class EnvironmentParity:
    reference: str  # HEAD, or node 0's name
    fingerprints: tuple[tuple[str, str], ...]  # (HEAD or node, fingerprint), head first
    differences: tuple[EnvDifference, ...]  # most important first
    reference_dists: Mapping[str, str]  # every node's are these, changed by the differences

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "fingerprints": dict(self.fingerprints),
            "differences": [d.to_dict() for d in self.differences],
            "reference_distributions": dict(self.reference_dists),
        }

    def fingerprint_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """(fingerprint, who has it), the reference's first."""
        groups: dict[str, list[str]] = {}
        for who, print_ in self.fingerprints:
            groups.setdefault(print_, []).append(who)
        return [(p, tuple(w)) for p, w in groups.items()]


def show_value(value: str | None) -> str:
    return "missing" if value is None else value


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
    environment: EnvironmentParity | None = None
    # the job's interpreter's environment on the head (None: the head has no such interpreter)
    head_fingerprint: str | None = None

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
            "environment": None if self.environment is None else self.environment.to_dict(),
            "shared_interfaces": list(self.shared_interfaces),
            "deep": [asdict(r) for r in self.deep],
        }


def _facts_dict(facts: NodeFacts | None) -> dict[str, Any] | None:
    if facts is None:
        return None
    doc = asdict(facts)
    doc["packages"] = dict(facts.packages)
    env = facts.environment
    # every node's distributions are the report's reference's, changed by its differences
    doc["environment"] = None if env is None else {
        "fingerprint": env.fingerprint, "python": env.python_version, "abi": env.abi,
        "platform": env.platform, "distributions": len(env.dists),
    }  # fmt: skip
    doc["interfaces"] = {k: list(v) for k, v in facts.interfaces.items()}
    doc["resolved"] = {k: list(v) for k, v in facts.resolved.items()}
    doc["nccl_env"] = redact(facts.nccl_env)  # what is printed or saved never holds secrets
    return doc




def with_facts(probes: Sequence[NodeProbe]) -> list[NodeFacts]:
    return [p.facts for p in probes if p.facts is not None]
