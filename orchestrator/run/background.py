"""Work a launch does beside its watch loop: a look at a quiet job, a profile, a question to
Slurm, one piece at a time, each piece's result handed over once to the loop that reads it;
and the reader of the fan-out's output."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import IO, Generic, TypeVar

T = TypeVar("T")


class OneAtATime(Generic[T]):
    """At most one piece of work under way; `results()` hands over what finished ones gave."""

    def __init__(self) -> None:
        self._done: list[T] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, work: Callable[[], T]) -> bool:
        """Start `work` in the background unless a piece is under way; whether it started."""
        if self.busy:
            return False

        def run() -> None:
            result = work()
            with self._lock:
                self._done.append(result)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return True

    def results(self) -> list[T]:
        with self._lock:
            done, self._done = self._done, []
        return done


def read_chunks_into(stream: IO[bytes], chunks: queue.Queue[tuple[float, bytes] | None]) -> None:
    """Each chunk of the fan-out's output with when it arrived: the watcher may be behind."""
    fd = stream.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.put((time.monotonic(), data))
    except OSError:
        pass
    finally:
        chunks.put(None)
