"""Progress per rank, kept as the job runs: runs/<job>/progress.jsonl, for the report.

    {"t": 1795000003.5, "node": "n1", "rank": 3, "n": 45, "total": 100, "rate": 30.1}

A sample comes from a rank's progress bar (a tqdm frame: n/total and its rate) or from a
line it printed (`step 45`). Bounded: at most one sample per rank per `interval` seconds,
and `cap` per job: when the file holds `cap` samples, every other sample of each rank is
dropped and the interval doubles, so the file never holds more than `cap` samples and a
job of any length is drawn from its start to its end, evenly (this happens about log2 of
its length times, each a rewrite of at most `cap` short lines). When the job ends, each
rank's last line or frame gives one more sample, so the chart ends where the rank did.
The furthest step each rank showed in a sample is kept too: how far the attempt got, for
the restart policy (outcome/restart_policy.py).

It also notes when each rank and node was first and last heard from, and each node's last
heartbeat: the timeline's moments (records/moments.py), written when the job ends.

This sits on the log path: every line of the job passes `line`, so it does one dict
lookup and one comparison per line; the text is searched only when a sample is due.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from orchestrator.errors import OrchError
from orchestrator.records.job import PROGRESS_FILE
from orchestrator.records.moments import Moment, MomentKind, json_docs, json_lines
from orchestrator.records.rundir import PRIVATE, RunDir
from orchestrator.remote.logwire import global_rank

SAMPLE_INTERVAL_S = 1.0
SAMPLE_CAP = 50_000  # about 4 MB: 1000 ranks keep at least 25 samples each, however long

_BAR_COUNT = re.compile(rb"(\d+)/(\d+) \[")  # tqdm: "45/100 [00:01<00:02, 30.1it/s]"
_BAR_COUNT_ONLY = re.compile(rb"(?<![\d/])(\d+)(?:it)? \[\d")  # a bar without a total: "45it ["
_PER_SECOND = re.compile(rb"([\d.]+)\s?[A-Za-z]*/s\b")  # "30.1it/s"
_SECONDS_PER = re.compile(rb"([\d.]+)s/[A-Za-z]+")  # "1.20s/it"
_STEP = re.compile(rb"\b(?:step|iter|iteration)[\s:=#]*(\d+)(?:\s*/\s*(\d+))?", re.IGNORECASE)


_Found = tuple[int, int | None, float | None]  # n, total, rate per second


@dataclass(frozen=True)
class Sample:
    t: float
    node: str
    rank: int
    n: int
    total: int | None = None
    rate: float | None = None  # items per second, as the bar said


def bar_sample(data: bytes) -> _Found | None:
    """(n, total, rate per second) of a progress bar's frame; None when it shows none."""
    found = _BAR_COUNT.search(data)
    if found is not None:
        n, total = int(found.group(1)), int(found.group(2))
    else:
        bare = _BAR_COUNT_ONLY.search(data)
        if bare is None:
            return None
        n, total = int(bare.group(1)), None
    return n, total, _rate(data)


def _rate(data: bytes) -> float | None:
    try:
        per = _SECONDS_PER.search(data)
        if per is not None:
            seconds = float(per.group(1))
            return 1.0 / seconds if seconds > 0 else None
        rate = _PER_SECOND.search(data)
        return float(rate.group(1)) if rate is not None else None
    except ValueError:  # "1.2.3it/s"
        return None


def line_sample(data: bytes) -> _Found | None:
    """(step, total, None) of a printed line (`step 45`, `iter 45/100`), or of a bar's last
    frame printed as a line; None without one."""
    found = _STEP.search(data)
    if found is not None:
        return int(found.group(1)), int(found.group(2)) if found.group(2) else None, None
    return bar_sample(data) if b"[" in data else None


class _Source:
    """One rank (or one node's launcher, rank None): when it was heard, its next sample."""

    __slots__ = (
        "first", "frame", "last", "line", "next_at", "node", "node_json", "rank", "sampled",
    )  # fmt: skip

    def __init__(self, node: str, rank: int | None, now: float) -> None:
        self.node = node
        self.node_json = json.dumps(node)
        self.rank = rank
        self.first = now
        self.last = now
        self.next_at = now  # the first line or frame is sampled at once
        self.sampled = -1.0  # when the last sample was taken
        self.line = b""  # the last line and frame seen: the job's end samples them
        self.frame = b""


class ProgressRecorder:
    """Fed every line and frame of the job (a LogView's arguments) with the time of their
    batch in `now`; writes samples to the job's progress.jsonl as they are taken (opened in
    its directory `run`, never through a link)."""

    def __init__(self, run: RunDir, *, interval: float = SAMPLE_INTERVAL_S,
                 cap: int = SAMPLE_CAP, now: float = 0.0) -> None:  # fmt: skip
        self.run = run
        self.now = now  # set by the caller once per batch of output: no clock call per line
        self._interval = interval
        self._cap = max(cap, 2)
        self._sources: dict[str, _Source] = {}  # by rank label, or node for launcher lines
        self._heartbeats: dict[str, float] = {}
        self._file: TextIO | None = None
        self.samples = 0
        self.problem: str | None = None  # why sampling stopped
        self.steps: dict[int, int] = {}  # the furthest step each rank showed in a sample

    def line(self, node: str, rank: str, data: bytes) -> None:
        source = self._sources.get(rank or node) or self._source(node, rank)
        now = source.last = self.now
        source.line = data
        if now >= source.next_at and source.rank is not None:
            self._sample(source, line_sample(data))

    def frame(self, node: str, rank: str, data: bytes) -> None:
        source = self._sources.get(rank or node) or self._source(node, rank)
        now = source.last = self.now
        source.frame = data
        if now >= source.next_at and source.rank is not None:
            self._sample(source, bar_sample(data))

    def heartbeat(self, node: str) -> None:
        self._heartbeats[node] = self.now

    def _source(self, node: str, rank: str) -> _Source:
        source = self._sources[rank or node] = _Source(node, global_rank(rank), self.now)
        return source

    def _sample(self, source: _Source, found: _Found | None) -> None:
        if found is None or self.problem is not None:
            return  # a line without a step: the next one is looked at
        source.next_at = self.now + self._interval
        source.sampled = self.now
        self._write(source, self.now, found)
        if self.samples >= self._cap and self.problem is None:
            self._thin()

    def _thin(self) -> None:
        """Every other sample of each rank dropped, and half as many taken from now on."""
        try:
            self._rewrite_every_other()
        except (OSError, OrchError) as err:
            self._stop(err)
        self._interval *= 2

    def _rewrite_every_other(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        seen: dict[object, int] = {}
        kept = []
        with self.run.open_text(PROGRESS_FILE) as file:
            for doc in json_docs(file):
                index = seen[doc.get("rank")] = seen.get(doc.get("rank"), -1) + 1
                if index % 2 == 0:
                    kept.append(json.dumps(doc, separators=(",", ":")) + "\n")
        self.run.replace_file(PROGRESS_FILE, "".join(kept))
        self.samples = len(kept)

    def _stop(self, err: OSError | OrchError) -> None:
        """Samples are for the job's page: one that cannot be written stops the sampling,
        never the job (this runs on its log path)."""
        self.problem = f"progress samples stopped: {err}"
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def _write(self, source: _Source, t: float, found: _Found) -> None:
        n, total, rate = found
        if source.rank is not None and n > self.steps.get(source.rank, -1):
            self.steps[source.rank] = n
        rate_text = "null" if rate is None else f"{rate:.4g}"
        try:
            if self._file is None:
                self._file = self.run.open_text(PROGRESS_FILE, "a", PRIVATE)
            self._file.write(
                f'{{"t":{t:.3f},"node":{source.node_json},"rank":{source.rank},"n":{n},'
                f'"total":{"null" if total is None else total},"rate":{rate_text}}}\n'
            )
        except (OSError, OrchError) as err:
            self._stop(err)
            return
        self.samples += 1

    def close(self) -> list[Moment]:
        """Stop sampling: each rank's last line or frame, when later than its last sample,
        is its last sample. The first and last output of every rank and node, and each
        node's last heartbeat, are returned as moments."""
        for source in self._sources.values():
            if source.rank is not None and source.last > source.sampled and not self.problem:
                found = line_sample(source.line) or bar_sample(source.frame)
                if found is not None:
                    self._write(source, source.last, found)
        if self._file is not None:
            try:
                self._file.close()
            except OSError as err:
                self._stop(err)
        return list(self._moments())

    def _moments(self) -> Iterator[Moment]:
        nodes: dict[str, tuple[float, float]] = {}
        for source in self._sources.values():
            first, last = nodes.get(source.node, (source.first, source.last))
            nodes[source.node] = (min(first, source.first), max(last, source.last))
            if source.rank is not None:
                yield Moment(source.first, MomentKind.FIRST_OUTPUT, source.node, source.rank)
                yield Moment(source.last, MomentKind.LAST_OUTPUT, source.node, source.rank)
        for node, (first, last) in nodes.items():
            yield Moment(first, MomentKind.FIRST_OUTPUT, node)
            yield Moment(last, MomentKind.LAST_OUTPUT, node)
        for node, t in self._heartbeats.items():
            yield Moment(t, MomentKind.LAST_HEARTBEAT, node)


def read_samples(run_path: Path) -> Iterator[Sample]:
    """The job's progress samples, in the order they were taken; a line that is not one is
    skipped."""
    for doc in json_lines(Path(run_path) / PROGRESS_FILE):
        try:
            total, rate = doc.get("total"), doc.get("rate")
            yield Sample(float(doc["t"]), str(doc["node"]), int(doc["rank"]), int(doc["n"]),
                         None if total is None else int(total),
                         None if rate is None else float(rate))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue
