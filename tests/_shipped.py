"""What a node program is shipped with (remote/__init__.py's boot_blob): each part it loads
beside the program must come after the parts it imports, or the node falls back to an orch
it does not have."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from orchestrator.remote import program_source


def shipped_imports(name: str) -> list[str]:
    """The remote modules remote/<name>.py imports as it loads (as orch_<name>); not those a
    function imports, and may do without (it falls back to orch's copy, or fails then)."""
    return [alias.name.removeprefix("orch_")
            for node in _outside_functions(ast.parse(program_source(name)))
            if isinstance(node, ast.Import)
            for alias in node.names if alias.name.startswith("orch_")]  # fmt: skip


def _outside_functions(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child
            yield from _outside_functions(child)


def not_loaded_before(parts: tuple[str, ...], program: str) -> list[str]:
    """`needer: needed` for each import of a part or the program not loaded before it."""
    order = [*parts, program]
    return [f"{name}: {needed}"
            for at, name in enumerate(order)
            for needed in shipped_imports(name) if needed not in order[:at]]  # fmt: skip
