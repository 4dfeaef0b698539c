"""Which rank failed on this node: the ranks' ends as they happen, and torchrun's own report.
STANDARD LIBRARY ONLY (shipped inline beside the agent).

Each rank's keeper (remote/rank.py) reports its rank's end the moment it happens, with its
exit code or signal: those ends are exact. The /proc scan and pidfds here are the fallback
for a rank whose keeper could not report (killed itself).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import threading
import time

try:  # shipped inline: loaded beside the agent as orch_<name>
    import orch_procs as procs
except ImportError:
    from orchestrator.remote import procs

# (time, rank, exit code or None if unseen, whether its keeper reported it: exact)
Ended = list[tuple[float, int, int | None, bool]]

_TORCHRUN_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", re.MULTILINE)
_TORCHRUN_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


def failure_from_text(text: str) -> tuple[int | None, int | None]:
    """(rank, exit code) of the root-cause failure in torchrun's error report, if any."""
    at = text.rfind("Root Cause")
    if at < 0:
        return None, None
    tail = text[at:]
    rank = _TORCHRUN_RANK.search(tail)
    code = _TORCHRUN_EXIT.search(tail)
    return (
        int(rank.group(1)) if rank else None,
        int(code.group(1)) if code else None,
    )


class RankWatch:
    """Remembers the job's ranks on this node (remote/procs.py) and the order they ended in.

    Ranks are not the agent's children: their ends are seen through pidfds (woken
    at the moment a rank exits) and their exit codes read from /proc while their
    launcher has not reaped them yet. Without pidfds, the periodic scan notices.
    """

    _TIE_S = 0.3  # ranks that ended this close together are told apart by exit code
    # A scan reads the environment of every process on the node. With pidfds it only finds
    # new ranks (their ends wake the pidfd thread), so once a second is enough; without
    # them it is how ends are seen.
    _SCAN_WITH_PIDFDS_S, _SCAN_WITHOUT_S = 1.0, 0.2

    def __init__(self, job_id: str, node: str, proc: str = procs.PROC) -> None:
        self.job_id = job_id
        self.node = node
        self.proc = proc
        self.alive: dict[int, int] = {}  # pid -> rank
        self.ended: Ended = []
        self.reports: dict[int, dict] = {}  # rank -> its keeper's report, local rank added
        self._lock = threading.Lock()
        self._noted: set[int] = set()
        # pid -> a hash of its environment when it was found not to be a rank. Decided again
        # when the environment changes: a keeper's child between its fork and its exec still
        # has the keeper's (not a rank's) and becomes the rank at the exec, under the same pid.
        self._not_ranks: dict[int, int] = {}
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._scanned_at: float | None = None
        # Where the kernel gives pidfds (Linux >= 5.3) for the real /proc, they tell the ends.
        self._pidfds = hasattr(os, "pidfd_open") and proc == procs.PROC
        if self._pidfds:
            threading.Thread(target=self._wait_for_exits, daemon=True).start()

    @property
    def _scan_every(self) -> float:
        return self._SCAN_WITH_PIDFDS_S if self._pidfds else self._SCAN_WITHOUT_S

    def scan_if_due(self, now: float) -> None:
        """Scan when the last one (monotonic clock) is old enough."""
        if self._scanned_at is None or now - self._scanned_at >= self._scan_every:
            self.scan()

    def scan(self) -> None:
        self._scanned_at = time.monotonic()
        current = {}
        found = procs.job_environs(self.job_id, self.node, self.proc)
        # Only the live ones are kept: a job that starts many short processes (a command
        # run every step) must not grow the agent.
        self._not_ranks = {pid: seen for pid, seen in self._not_ranks.items() if pid in found}
        for pid, environ in found.items():
            if self._not_ranks.get(pid) == hash(environ):
                continue
            rank = self.alive.get(pid)
            if rank is None:
                # Decided once per environment: a rank's child stays one when its rank is gone.
                rank = procs.rank_at(pid, self.proc, environ)
                if rank is None:
                    self._not_ranks[pid] = hash(environ)
                    continue
            current[pid] = rank
        with self._lock:
            for pid in current.keys() - self.alive.keys():
                self._watch(pid)
            gone = [(pid, rank) for pid, rank in self.alive.items() if pid not in current]
            self.alive.update(current)
        for pid, rank in gone:
            self._note(pid, rank)

    def _watch(self, pid: int) -> None:
        if not self._pidfds:
            return
        try:
            self._fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass  # it has ended already: the scan sees it gone
        except OSError:
            self._pidfds = False  # a kernel without pidfds (before 5.3): the scan sees ends

    def _note(self, pid: int, rank: int) -> None:
        code = procs.zombie_exit_code(pid, self.proc)
        with self._lock:
            if pid in self._noted:
                return
            self._noted.add(pid)
            if rank not in self.reports:
                self.ended.append((time.time(), rank, code, False))

    def reported(self, rank: int, local_rank: int, report: dict) -> dict | None:
        """Take in a keeper's report of its rank's end; returns it as kept (None if it is
        not one: a rank reports once)."""
        try:
            at, code, pid = float(report["end"]), int(report["code"]), int(report["pid"])
        except (KeyError, TypeError, ValueError):
            return None
        with self._lock:
            if rank in self.reports:
                return None
            kept = {**report, "rank": rank, "local_rank": local_rank}
            self.reports[rank] = kept
            self._noted.add(pid)
            # A scan that saw it first (inexact) gives way to the keeper's exact end.
            self.ended = [e for e in self.ended if e[1] != rank]
            self.ended.append((at, rank, code, True))
            self.ended.sort(key=lambda entry: entry[0])
        return kept

    def unreported(self) -> list[tuple[float, int, int | None]]:
        """Ranks whose end was seen only by the scan: (when, rank, code or None)."""
        with self._lock:
            return [(t, rank, code) for t, rank, code, exact in self.ended if not exact]

    def _wait_for_exits(self) -> None:
        while True:
            with self._lock:
                fds = list(self._fds)
            if not fds:
                time.sleep(0.1)
                continue
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            for fd, _event in poller.poll(200):
                with self._lock:
                    pid = self._fds.pop(fd, None)
                    rank = self.alive.get(pid) if pid is not None else None
                if pid is not None and rank is not None:
                    self._note(pid, rank)
                with contextlib.suppress(OSError):
                    os.close(fd)

    @property
    def gone_at(self) -> float | None:
        with self._lock:
            failed = [t for t, _rank, code, _exact in self.ended if code != 0]
        return failed[0] if failed else None

    def first_failed(self, node_code: int) -> tuple[int | None, int | None]:
        """(rank, its exit code) of the rank that failed first, when the node's command failed."""
        with self._lock:
            ended = list(self.ended)
        return first_failed_rank(ended, node_code, self._TIE_S)


def first_failed_rank(
    ended: Ended, node_code: int, tie_s: float
) -> tuple[int | None, int | None]:
    """Which of the ranks that ended (time, rank, exit code or None if unseen, exact) failed
    first.

    An end its keeper reported is exact: the earliest such failure is the first, unless a
    rank only the scan saw (late by up to a scan) ended before it. Ends the scan saw within
    `tie_s` of the first are told apart by exit code: the node's launcher passes on a
    failing rank's code, so that code names it; a rank whose code was not seen (its
    launcher reaped it first) comes next, whereas a known different code belongs to a peer
    that lost the failing rank (exit 1) or that the launcher stopped (-15).
    """
    # A rank that finished cleanly before the failure is not a suspect.
    failed = sorted((entry for entry in ended if entry[2] != 0), key=lambda e: e[0])
    if not failed:
        return None, None
    if failed[0][3]:
        return failed[0][1], failed[0][2]
    first = failed[0][0]
    batch = [(rank, code) for t, rank, code, exact in failed if t - first <= tie_s and not exact]
    for wanted in (lambda c: c == node_code, lambda c: c is None):
        for rank, code in batch:
            if wanted(code):
                return rank, code
    return batch[0]
