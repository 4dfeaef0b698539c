"""Parity: every node's facts other than its Python environment against the majority
(torch's CUDA build, GPUs, driver, the script).
Pure: facts in, findings out."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.checks.model import Finding, NodeProbe, ParityRow, Severity, with_facts
from orchestrator.probe.facts import NodeFacts

if TYPE_CHECKING:
    pass


# ----- parity --------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityFact:
    name: str
    value: Callable[[NodeFacts], str | None]
    severity: Severity
    fix: str  # format with {node}, {value}, {python}, {package}
    needs_interpreter: bool = True


PARITY_FACTS: tuple[ParityFact, ...] = (
    # The interpreter, the platform and every package: checks/environment.py.
    ParityFact("cuda (torch build)", lambda f: f.torch_cuda, "error",
               "install the torch build for CUDA {value} on {node}"),
    ParityFact("gpu count", lambda f: str(f.gpu_count), "error",
               "check {node}'s GPUs with `nvidia-smi` (a GPU missing or fallen off the bus?)",
               needs_interpreter=False),
    ParityFact("gpu model", lambda f: f.gpu_model, "error",
               "use nodes with the same GPU model, or expect the slowest to set the pace",
               needs_interpreter=False),
    ParityFact("driver", lambda f: f.driver, "warning",
               "install NVIDIA driver {value} on {node}", needs_interpreter=False),
    ParityFact("script sha256", lambda f: f.script_sha256, "error",
               "copy the same script to {node} (or use a shared filesystem)",
               needs_interpreter=False),
)  # fmt: skip


def _show(value: str | None) -> str:
    return "missing" if value is None else value


def majority_value(values: Sequence[str | None]) -> str | None:
    """The most common value; a tie goes to the earliest (node 0 first)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def check_parity(probes: Sequence[NodeProbe], python: str) -> tuple[list[ParityRow], list[Finding]]:
    facts = with_facts(probes)
    rows: list[ParityRow] = []
    findings: list[Finding] = []
    if len(facts) < 2:
        return rows, findings
    for fact in PARITY_FACTS:
        # Nodes without the job's interpreter are reported by check_interpreter;
        # what the fallback interpreter has says nothing about the job's.
        usable = [(f, fact.value(f)) for f in facts if f.python_found or not fact.needs_interpreter]
        if len({v for _, v in usable}) <= 1:
            continue
        majority = majority_value([v for _, v in usable])
        differing = tuple((f.node, _show(v)) for f, v in usable if v != majority)
        rows.append(ParityRow(fact.name, _show(majority), differing))
        for node, value in differing:
            fix = fact.fix.format(
                node=node, value=_show(majority), python=shlex.quote(python), package=fact.name
            )
            if majority is None:
                fix = f"remove {fact.name} from {node}, or install it on every node"
            findings.append(
                Finding(
                    node,
                    "parity",
                    f"{fact.name} is {value} on {node}, but {_show(majority)} on most nodes",
                    fix,
                    fact.severity,
                )
            )
    return rows, findings
