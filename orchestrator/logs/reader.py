"""Reading head-side logs back (`orch logs`): a log file's entries, one rank's entries,
every node's merged by time, or the entries appended since the last look."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from orchestrator.logs.writer import STAMP_LEN


def read_log_lines(path: str | Path) -> Iterator[bytes]:
    """The entries of a head-side log file, each without its newline, streamed."""
    with open(path, "rb") as handle:
        for line in handle:
            yield line.rstrip(b"\n")


def rank_filter(rank: int | None) -> Callable[[Iterable[bytes]], Iterator[bytes]]:
    """Keeps exactly the entries rank `rank` wrote (all entries for None)."""
    if rank is None:
        return iter
    token = b"r%d/" % rank

    def keep(lines: Iterable[bytes]) -> Iterator[bytes]:
        for line in lines:
            if line.startswith(token, STAMP_LEN + 1):
                yield line

    return keep


def merge_by_time(logs: Mapping[str, Iterable[bytes]]) -> Iterator[tuple[str, bytes]]:
    """(node, entry) from every node's log, ordered by timestamp, streamed.

    Entries start with a fixed-width UTC timestamp, so bytes order is time
    order; ties keep each file's own order, then the order of `logs`.
    """
    keyed = [_stamped(index, node, lines) for index, (node, lines) in enumerate(logs.items())]
    for _stamp, _index, node, line in heapq.merge(*keyed, key=lambda item: item[:2]):
        yield node, line


def _stamped(
    index: int, node: str, lines: Iterable[bytes]
) -> Iterator[tuple[bytes, int, str, bytes]]:
    for line in lines:
        yield line[:STAMP_LEN], index, node, line


class LogFollower:
    """Reads the complete entries appended to a log file since the last call."""

    def __init__(self, path: str | Path, *, from_start: bool = True) -> None:
        self.path = Path(path)
        self._offset = 0 if from_start or not self.path.exists() else self.path.stat().st_size
        self._rest = b""

    def read_new(self, max_bytes: int = 1 << 22) -> list[bytes]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read(max_bytes)
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._rest + data
        lines = data.split(b"\n")
        self._rest = lines.pop()
        return lines
