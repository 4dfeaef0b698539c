"""Work a launch does beside its watch loop (a look at a quiet job, a profile), one piece at
a time, each piece's result handed over once to the loop that reads it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

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
