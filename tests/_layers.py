"""The package's layer rules, read from its imports with `ast` (tests/test_layers.py).

Every import counts: module level, inside functions, under `if TYPE_CHECKING:`. The rules
are a function of a package root, so the same code checks orch and small fixture trees.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Layers in the order data flows; a module may import its own layer and earlier ones.
# remote/ is a leaf: anyone may import it, it imports nothing of orch but itself.
LAYERS: tuple[tuple[str, int], ...] = (
    ("errors", 0),
    ("pernode", 0),
    ("specs", 1),
    ("remote", 2),
    ("ssh", 3),
    ("probe", 4),
    ("checks", 5),
    ("stacks", 6),
    ("plan", 7),
    ("outcome", 8),  # pure: job states, the verdict, rank ends, root cause, restart policy
    ("checkpoints", 8),  # pure: what a checkpoint is, when complete, its copies, a restore
    ("nodes", 9),  # how orch reaches nodes: the transport (ssh or srun steps), pdsh, Slurm
    ("records", 10),  # the run directory and every file in it
    ("logs", 11),
    ("report", 12),  # a job's page, from its run directory's records
    ("envpush", 13),
    ("checkpoint_copies", 13),  # checkpoints copied between nodes and staged for restarts
    ("prepare", 14),  # request to hosts, pre-flight, sync, ports
    ("run", 15),
    ("sandbox", 16),
    ("cli", 17),
    ("__main__", 17),
)
PURE = ("errors", "pernode", "specs", "probe", "checks", "stacks", "plan", "outcome", "report",
        "checkpoints")  # fmt: skip
IMPURE_MODULES = ("subprocess", "socket", "paramiko")
JOB_STACK = ("torch", "accelerate", "yaml")  # what a node's job interpreter has anyway
SHIPPED_PREFIX = "orch_"  # remote/<name>.py as a node loads it, beside a program


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, relative to the package: "checks/node"
    line: int
    target: str  # dotted name as imported, resolved: "orchestrator.plan.agent_command"
    in_function: bool
    type_checking: bool


def module_name(root: Path, path: Path) -> str:
    relative = path.relative_to(root).with_suffix("").as_posix()
    return relative.removesuffix("/__init__") if relative != "__init__" else ""


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, root: Path, module: str, is_package: bool) -> None:
        self.root = root
        self.module = module
        self.is_package = is_package
        self.imports: list[Import] = []
        self._function_depth = 0
        self._type_checking_depth = 0

    def _add(self, node: ast.stmt, target: str) -> None:
        in_function = self._function_depth > 0
        type_checking = self._type_checking_depth > 0
        self.imports.append(Import(self.module, node.lineno, target, in_function, type_checking))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function_depth += 1
        self.generic_visit(node)
        self._function_depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_checking_depth += 1
            for child in node.body:
                self.visit(child)
            self._type_checking_depth -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node)
        for alias in node.names:
            # `from pkg import mod` imports the module pkg.mod when there is one.
            candidate = f"{base}.{alias.name}"
            self._add(node, candidate if self._is_module(candidate) else base)

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = self.root.name + ("." + self.module.replace("/", ".") if self.module else "")
        parts = package.split(".")
        if not self.is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join([*parts, node.module] if node.module else parts)

    def _is_module(self, dotted: str) -> bool:
        top, _, rest = dotted.partition(".")
        if top != self.root.name or not rest:
            return False
        path = self.root.joinpath(*rest.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_imports(root: Path) -> list[Import]:
    found: list[Import] = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(root, path)
        collector = _Collector(root, module, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found += collector.imports
    return found


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + "/")


def layer_of(module: str) -> tuple[str, int] | None:
    for prefix, rank in LAYERS:
        if _inside(module, prefix):
            return prefix, rank
    return None


def _own_module(root: Path, target: str) -> str | None:
    """The package-relative module a dotted target names, or None if not the package's."""
    top, _, rest = target.partition(".")
    if top != root.name:
        return None
    return rest.replace(".", "/")


def _top(target: str) -> str:
    return target.partition(".")[0]


def _where(root: Path, item: Import) -> str:
    path = root.name + "/" + (item.module or "__init__")
    is_package = (root / item.module / "__init__.py").is_file() if item.module else True
    return f"{path}/__init__.py" if is_package else f"{path}.py"


def violations(root: Path) -> list[str]:
    """Every broken rule, each naming the file, the line and the offending import."""
    imports = package_imports(root)
    found = [message for item in imports for message in _import_rules(root, item)]
    found += list(dict.fromkeys(_impure_reach(root, imports)))
    return found + [f"import cycle: {' -> '.join(cycle)}" for cycle in import_cycles(root, imports)]


def _import_rules(root: Path, item: Import) -> Iterator[str]:
    where = f"{_where(root, item)}:{item.line} imports {item.target}"
    own = _own_module(root, item.target)
    top = _top(item.target)
    module = item.module
    if top == "paramiko" and not _inside(module, "ssh"):
        yield f"{where} (paramiko only under ssh/)"
    if _inside(module, "remote") and not _shipped_twin(root, top):
        yield from _remote_rule(item, where, own, top)
    elif any(_inside(module, pure) for pure in PURE) and top in IMPURE_MODULES:
        yield f"{where} ({_pure_name(root, module)} is pure)"
    if own is not None and own != "":
        yield from _order_rule(module, own, where)
    if module == "cli/app" and own is not None and _inside(own, "cli"):
        yield f"{where} (cli/app.py imports no command module)"


def _pure_name(root: Path, module: str) -> str:
    prefix = next(p for p in PURE if _inside(module, p))
    return f"{prefix}/" if (root / prefix).is_dir() else f"{prefix}.py"


def _shipped_twin(root: Path, top: str) -> bool:
    """Whether `top` is orch_<name>: remote/<name>.py as plan/agent_command.py's bootstrap
    loads it beside a program on a node (the remote module imports its package's copy when
    that name is not there)."""
    name = top.removeprefix(SHIPPED_PREFIX)
    return name != top and (root / "remote" / f"{name}.py").is_file()


def _remote_rule(item: Import, where: str, own: str | None, top: str) -> Iterator[str]:
    if own is not None:
        if own != "remote" and not _inside(own, "remote"):
            yield f"{where} (remote/ imports nothing of orch outside remote/)"
        return
    if top in sys.stdlib_module_names or top == "__future__":
        return
    if item.in_function and top in JOB_STACK:
        return
    allowed = "the standard library" + ("" if item.in_function else " at module level")
    yield f"{where} (remote/ imports only {allowed})"


def _order_rule(module: str, own: str, where: str) -> Iterator[str]:
    mine, theirs = layer_of(module), layer_of(own)
    if mine is None or theirs is None or _inside(module, "remote"):
        return
    if theirs[1] > mine[1]:
        yield f"{where} ({mine[0]} comes before {theirs[0]} in the data flow)"


def import_cycles(root: Path, imports: list[Import]) -> list[list[str]]:
    """Each cycle among the package's modules once, as a chain that ends where it began."""
    graph: dict[str, set[str]] = {}
    for item in imports:
        own = _own_module(root, item.target)
        if own is not None and own != item.module:
            graph.setdefault(item.module, set()).add(own)
    cycles: list[list[str]] = []
    seen_sets: set[frozenset[str]] = set()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                key = frozenset(cycle)
                if key not in seen_sets:
                    seen_sets.add(key)
                    cycles.append([m or "__init__" for m in cycle])
            elif not state.get(nxt):
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node)
    return cycles


def _impure_reach(root: Path, imports: list[Import]) -> list[str]:
    """A pure module imports no orch module that, at any depth, imports subprocess, socket
    or paramiko: what it imports runs when it does. Imports under TYPE_CHECKING never run."""
    direct: dict[str, str] = {}
    graph: dict[str, set[str]] = {}
    for item in imports:
        if item.type_checking:
            continue
        own = _own_module(root, item.target)
        if own is None and _top(item.target) in IMPURE_MODULES:
            direct.setdefault(item.module, _top(item.target))
        elif own and own != item.module:
            graph.setdefault(item.module, set()).add(own)

    def chain(module: str, seen: frozenset[str]) -> list[str] | None:
        if module in direct:
            return [module, direct[module]]
        for nxt in sorted(graph.get(module, ())):
            if nxt not in seen:
                found = chain(nxt, seen | {nxt})
                if found is not None:
                    return [module, *found]
        return None

    found: list[str] = []
    for item in imports:
        own = _own_module(root, item.target)
        pure = any(_inside(item.module, p) for p in PURE)
        if not pure or item.type_checking or not own or any(_inside(own, p) for p in PURE):
            continue
        reach = chain(own, frozenset({own}))
        if reach is not None:
            where = f"{_where(root, item)}:{item.line} imports {item.target}"
            found.append(f"{where} ({_pure_name(root, item.module)} is pure; "
                         f"that reaches {' -> '.join(reach)})")  # fmt: skip
    return found
