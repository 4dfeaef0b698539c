"""The moments of a job, kept as it runs: runs/<job>/moments.jsonl, one JSON object a line.

    {"t": 1795000001.25, "kind": "first-output", "node": "n2", "rank": 5}

Times are seconds since the epoch on the head's clock. The report draws them on its
timeline (report/read.py reads them back); nothing else depends on them, so a moment that
cannot be written is dropped rather than failing the job. The pre-flight ran before the
run directory existed: its start, end and report are written once it does
(`save_preflight`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError
from orchestrator.records.job import MOMENTS_FILE, PREFLIGHT_FILE
from orchestrator.records.rundir import PRIVATE, RunDir
from orchestrator.specs.words import StrEnum


class MomentKind(StrEnum):
    PREFLIGHT_START = "preflight-start"
    PREFLIGHT_END = "preflight-end"
    START = "start"  # the fan-out was started
    FIRST_OUTPUT = "first-output"  # per node and per rank
    LAST_OUTPUT = "last-output"  # per node and per rank
    LAST_HEARTBEAT = "last-heartbeat"  # per node: its agent's last sign of life
    FIRST_FAILURE = "first-failure"  # when the head learnt of it
    HANG = "hang"  # no output for --hang-timeout
    QUIET = "quiet"  # quiet beyond --hang-timeout, and a look found a rank working
    PROFILE = "profile"  # a profile taken while the job ran (detail: who the others wait for)
    INTERRUPT = "interrupt"  # Ctrl-C, SIGTERM or orch kill
    STOP = "stop"  # every rank was sent the stop signal (detail: the stop's cause)
    TEARDOWN_START = "teardown-start"
    TEARDOWN_END = "teardown-end"
    ATTEMPT = "attempt"  # a restart's attempt began (detail: its number and why)
    END = "end"


@dataclass(frozen=True)
class Moment:
    t: float
    kind: str
    node: str | None = None
    rank: int | None = None
    detail: str | None = None

    def to_json(self) -> str:
        doc: dict[str, Any] = {"t": round(self.t, 3), "kind": str(self.kind)}
        for name in ("node", "rank", "detail"):
            if getattr(self, name) is not None:
                doc[name] = getattr(self, name)
        return json.dumps(doc, separators=(",", ":"))


def append_moments(run: RunDir, moments: list[Moment]) -> None:
    """Append moments to the job's file, private like the rest of its directory (never
    through a link). Best effort: a moment is for the page; the job never fails for one."""
    if not moments:
        return
    text = "".join(moment.to_json() + "\n" for moment in moments)
    try:
        with run.open_text(MOMENTS_FILE, "a", PRIVATE) as file:
            file.write(text)
    except (OSError, OrchError):
        pass


def note_attempt(run: RunDir, t: float, number: int, why: str) -> None:
    """The hook for a restart loop: attempt `number` began at `t` because of `why`; the
    report marks it on every node's row."""
    append_moments(run, [Moment(t, MomentKind.ATTEMPT, detail=f"attempt {number}: {why}")])


def read_moments(run_path: Path) -> tuple[Moment, ...]:
    """The job's moments in time order; () without the file. A line that is not a moment
    (a write cut short by a crash) is skipped."""
    return tuple(sorted(_moments(run_path / MOMENTS_FILE), key=lambda m: m.t))


def _moments(path: Path) -> Iterator[Moment]:
    for doc in json_lines(path):
        try:
            rank = doc.get("rank")
            yield Moment(float(doc["t"]), str(doc["kind"]), _text(doc.get("node")),
                         None if rank is None else int(rank), _text(doc.get("detail")))  # fmt: skip
        except (KeyError, TypeError, ValueError):
            continue


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def json_lines(path: Path) -> Iterator[Mapping[str, Any]]:
    """The JSON objects of a JSON-lines file; nothing when it cannot be read."""
    try:
        with path.open(encoding="utf-8", errors="replace") as file:
            yield from json_docs(file)
    except OSError:
        return


def json_docs(lines: Iterable[str]) -> Iterator[Mapping[str, Any]]:
    """The JSON objects among lines; a line that is none is skipped."""
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            yield doc


def save_preflight(run: RunDir, started: float, ended: float, report: Mapping) -> None:
    """The pre-flight's span on the timeline, and its report (doctor's --json document: the
    parity table among it), kept in the job's directory once it exists."""
    append_moments(run, [Moment(started, MomentKind.PREFLIGHT_START),
                         Moment(ended, MomentKind.PREFLIGHT_END)])  # fmt: skip
    try:
        with run.open_text(PREFLIGHT_FILE, "w", PRIVATE) as file:
            json.dump(report, file, indent=1)
    except (OSError, OrchError):
        pass
