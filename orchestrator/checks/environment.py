"""Environment parity: every node's whole Python environment (every distribution, the
interpreter and its ABI, the platform) against the reference, which is the head's where the
head runs the same interpreter path, else node 0's. Differences are grouped by package, the
most important first: the interpreter and platform, the launchers' packages, what the script
imports, then the rest. Pure: facts in, findings out."""

from __future__ import annotations

import ast
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.checks.model import (
    HEAD,
    KINDS,
    EnvDifference,
    EnvironmentParity,
    Finding,
    Kind,
    Severity,
    show_value,
)
from orchestrator.probe.facts import Environment, NodeFacts

# What the launchers orch starts import on every rank (normalized distribution names).
LAUNCHER_PACKAGES = frozenset({
    "torch", "deepspeed", "accelerate", "transformers", "colossalai", "triton",
    "nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11",
})  # fmt: skip
INTERPRETER_ITEMS = ("python", "abi", "platform")
SHOWN_IN_FINDING = 4  # packages named in a node's finding; the rest are counted
PIP_FIX_LIMIT = 24  # packages in one copy-pasteable pip command


# ----- what the script imports ---------------------------------------------------------------
def script_imports(source: str) -> frozenset[str]:
    """The top-level modules a script imports (absolute imports anywhere in it); empty when
    it is not Python this interpreter can parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return frozenset(found)


def script_distributions(
    modules: Iterable[str], providers: Mapping[str, Sequence[str]]
) -> frozenset[str]:
    """The distributions (normalized names) that provide `modules`, by the head's
    `importlib.metadata.packages_distributions()`; a module no distribution names is taken
    to be its own distribution's name (`import yaml` aside, most are)."""
    found: set[str] = set()
    for module in modules:
        for dist in providers.get(module) or (module,):
            found.add(_normalized(dist))
    return frozenset(found)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # as pip compares names (PEP 503)


# ----- copying the head's environment -------------------------------------------------------
@dataclass(frozen=True)
class PushFix:
    """How the head's environment can reach the nodes, for the fixes of the findings:
    `command` the `orch env push` command line for the job's nodes (None: none to give),
    `option` whether the job can push it itself (`--push-env` of launch and submit)."""

    command: str | None = None
    option: bool = False

    def text(self) -> str:
        """`copy the head's environment: `orch env push ...``, `launch with --push-env`, or
        both; empty when neither is given."""
        ways = [f"copy the head's environment: `{self.command}`"] if self.command else []
        if self.option:
            ways.append("launch again with --push-env")
        return ", or ".join(ways)


def env_push_command(python: str, *, hostfile: str | None = None, slurm: bool = False,
                     include: str | None = None, exclude: str | None = None) -> str:  # fmt: skip
    """The `orch env push` command line that copies the environment of `python` to the nodes
    of this hostfile (or of the Slurm allocation), as copy-pasteable shell words."""
    words = ["orch", "env", "push"]
    if hostfile is not None:
        words += ["--hostfile", hostfile]
    elif slurm:
        words.append("--slurm")
    words += ["--python", python]
    for option, value in (("--include", include), ("--exclude", exclude)):
        if value:
            words += [option, value]
    return shlex.join(words)


def with_push(fix: str, push: PushFix | None) -> str:
    """`fix`, then the ways to copy the head's environment, when there are any."""
    ways = push.text() if push is not None else ""
    return f"{fix}; or {ways}" if ways else fix


# ----- comparing -----------------------------------------------------------------------------
def _items(env: Environment) -> dict[str, str]:
    items = {
        "python": f"{env.implementation} {env.python_version}".strip(),
        "abi": env.abi,
        "platform": env.platform,
    }
    items.update(env.dists)
    return items


def _kind(item: str, script: frozenset[str]) -> Kind:
    if item in INTERPRETER_ITEMS:
        return "interpreter"
    if item in LAUNCHER_PACKAGES:
        return "launcher"
    return "script" if item in script else "other"


def _difference(
    item: str, kind: Kind, reference: str | None, values: Sequence[tuple[str, str | None]]
) -> EnvDifference | None:
    by_value: dict[str | None, list[str]] = {}
    for who, value in values:
        if value != reference:
            by_value.setdefault(value, []).append(who)
    if not by_value:
        return None
    # the most common other value first; a value missing on nodes before a version
    others = sorted(by_value.items(), key=lambda kv: (-len(kv[1]), kv[0] is not None))
    every = sum(len(w) for _, w in others) == len(values)
    return EnvDifference(item, kind, reference, tuple((v, tuple(w)) for v, w in others), every)


def environment_parity(
    facts: Sequence[NodeFacts], head: Environment | None, script: frozenset[str] = frozenset()
) -> EnvironmentParity | None:
    """Every node with the job's interpreter against the reference; None when fewer than two
    environments are known (one node and no head: nothing to compare)."""
    nodes = [(f.node, f.environment) for f in facts if f.python_found and f.environment]
    if not nodes or (head is None and len(nodes) < 2):
        return None
    reference_name, reference = (HEAD, head) if head is not None else nodes[0]
    compared = [(n, e) for n, e in nodes if n != reference_name]
    prints = [(reference_name, reference.fingerprint), *((n, e.fingerprint) for n, e in compared)]
    ref_items = _items(reference)
    node_items = [(n, _items(e)) for n, e in compared]
    names = sorted(set(ref_items).union(*(i for _, i in node_items)))
    differences = []
    for item in names:
        kind = _kind(item, script)
        values = [(n, items.get(item)) for n, items in node_items]
        found = _difference(item, kind, ref_items.get(item), values)
        if found is not None:
            differences.append(found)
    order = {item: i for i, item in enumerate(INTERPRETER_ITEMS)}
    differences.sort(key=lambda d: (KINDS.index(d.kind), order.get(d.item, 0), d.item))
    return EnvironmentParity(reference_name, tuple(prints), tuple(differences), reference.dists)


# ----- findings ------------------------------------------------------------------------------
def _node_value(diff: EnvDifference, node: str) -> tuple[bool, str | None]:
    for value, nodes in diff.others:
        if node in nodes:
            return True, value
    return False, None


def _pip_fix(node: str, python: str, ref: str,
             mine: Sequence[tuple[EnvDifference, str | None]]) -> str:  # fmt: skip
    install = [f"{d.item}=={d.reference}" for d, _ in mine if d.reference is not None]
    remove = [d.item for d, _ in mine if d.reference is None]
    py = shlex.quote(python)
    if len(install) + len(remove) > PIP_FIX_LIMIT:  # too many for one line: the whole list
        return (f"make {node}'s packages {ref}'s: `{py} -m pip freeze > requirements.txt` on "
                f"{ref}, then `{py} -m pip install -r requirements.txt` on {node}"
                + (f" and `{py} -m pip uninstall -y` the {len(remove)} it has more"
                   if remove else ""))  # fmt: skip
    commands = []
    if install:
        commands.append(f"`{py} -m pip install {' '.join(map(shlex.quote, install))}`")
    if remove:
        commands.append(f"`{py} -m pip uninstall -y {' '.join(map(shlex.quote, remove))}`")
    return f"on {node}: " + " and ".join(commands)


def _finding(node: str, parity: EnvironmentParity, python: str, node_print: str,
             push: PushFix | None) -> Finding:  # fmt: skip
    mine = [(d, v) for d in parity.differences for found, v in [_node_value(d, node)] if found]
    ref = parity.reference
    named = ", ".join(
        f"{d.item} {show_value(v)} ({show_value(d.reference)} on {ref})"
        for d, v in mine[:SHOWN_IN_FINDING]
    )
    more = f" and {len(mine) - SHOWN_IN_FINDING} more" if len(mine) > SHOWN_IN_FINDING else ""
    ref_print = parity.fingerprints[0][1]
    problem = (f"{node}'s environment (fingerprint {node_print[:8]}) differs from {ref}'s "
               f"({ref_print[:8]}) in {len(mine)} item(s): {named}{more}")  # fmt: skip
    if any(d.kind == "interpreter" for d, _ in mine):
        first = next(d for d, _ in mine if d.kind == "interpreter")
        fix = (f"on {node}: make {python} the same interpreter as on {ref} ({first.item} "
               f"{show_value(first.reference)}), then install the same packages")  # fmt: skip
    else:
        fix = _pip_fix(node, python, ref, mine)
    if ref == HEAD:  # the head's environment can be copied as it is
        fix = with_push(fix, push)
    severity: Severity = "error" if any(d.severity == "error" for d, _ in mine) else "warning"
    return Finding(node, "parity", problem, fix, severity)


def environment_findings(parity: EnvironmentParity | None, python: str,
                         push: PushFix | None = None) -> list[Finding]:  # fmt: skip
    """One finding per node whose environment differs: an error when the interpreter, a
    launcher's package or one the script imports differs, else a warning. `push`: how the
    head's environment could be copied there, named in the fix (None: only pip's fix)."""
    if parity is None or not parity.differences:
        return []
    return [
        _finding(node, parity, python, print_, push)
        for node, print_ in parity.fingerprints[1:]
        if any(_node_value(d, node)[0] for d in parity.differences)
    ]
