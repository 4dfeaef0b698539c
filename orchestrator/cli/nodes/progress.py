"""Progress over many nodes on the terminal: how many have answered, while the rest are
awaited. Only on a terminal (stderr), so piped and --json output stay as they are."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@contextmanager
def node_progress(total: int, what: str) -> Iterator[Callable[[str, bool], None]]:
    """A callback `(node, ok)` to call as each of `total` nodes ends (from any thread)."""
    if total < 2 or not sys.stderr.isatty():
        yield lambda _node, _ok: None
        return
    failed = 0
    lock = threading.Lock()
    columns = (
        TextColumn(f"{what}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
    )  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(what, total=total, failed="")

        def done(_node: str, ok: bool) -> None:
            nonlocal failed
            with lock:
                failed += not ok
                said = f"{failed} not answering" if failed else ""
                progress.update(task, advance=1, failed=said)

        yield done
