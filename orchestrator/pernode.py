"""One result per node, for every operation over many nodes (SSH commands, sync, log
collection, teardown): each node succeeded with a value or failed with a one-line problem
that names it and a hint with the fix. One bad node never hides the others. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_PARALLEL = 16


@dataclass(frozen=True)
class NodeResult(Generic[T]):
    node: str
    value: T | None = None  # set when the node succeeded
    problem: str | None = None  # set when it failed: one line that names the node
    hint: str | None = None  # how to fix it
    kind: str | None = None  # what kind of failure (e.g. "unreachable", "timeout")

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def why(self) -> str:
        """The problem and its hint, as one line ("ok" when the node succeeded)."""
        if self.problem is None:
            return "ok"
        return f"{self.problem} ({self.hint})" if self.hint else self.problem


@dataclass(frozen=True)
class ShellStartup:
    """How the user's shell started on a node: it and its start-up files (~/.bashrc...) run
    before every command orch runs there. `seconds` from the command's start to the shell
    running it; `stderr`: the last lines the start-up printed there."""

    seconds: float
    stderr: str


def succeeded(node: str, value: T) -> NodeResult[T]:
    return NodeResult(node, value=value)


def failed(node: str, problem: str, hint: str | None = None, kind: str | None = None):
    return NodeResult(node, problem=problem, hint=hint, kind=kind)


@dataclass(frozen=True)
class GroupResult(Generic[T]):
    """Every node's result, in the order the nodes were given."""

    results: tuple[NodeResult[T], ...]

    def __iter__(self) -> Iterator[NodeResult[T]]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, node: str) -> NodeResult[T]:
        for result in self.results:
            if result.node == node:
                return result
        raise KeyError(node)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(r.node for r in self.results)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def succeeded(self) -> tuple[NodeResult[T], ...]:
        return tuple(r for r in self.results if r.ok)

    @property
    def failed(self) -> tuple[NodeResult[T], ...]:
        return tuple(r for r in self.results if not r.ok)


def for_each_node(
    nodes: Sequence[str],
    work: Callable[[str], NodeResult[T]],
    *,
    max_parallel: int = DEFAULT_PARALLEL,
    on_result: Callable[[NodeResult[T]], None] | None = None,
) -> GroupResult[T]:
    """`work(node)` for every node at once (at most `max_parallel` at a time). `work` must
    turn a node's own problems into a failed NodeResult; anything it raises is orch's bug
    and propagates. `on_result` hears of each node as it ends (from a worker thread): for
    progress on long runs."""
    if not nodes:
        return GroupResult(())

    def reported(node: str) -> NodeResult[T]:
        result = work(node)
        if on_result is not None:
            on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(nodes)))) as pool:
        return GroupResult(tuple(pool.map(reported, nodes)))
