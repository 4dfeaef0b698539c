"""`orch status` with no job: which jobs it lists (--state, --name, --last) and each one's
row. Rows are made from the records and a clock, so they are tested on values; the command
prints them. A record that cannot be read is listed with why, whatever the filters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.records.job import JobRecord
from orchestrator.records.rundir import ListedJob
from orchestrator.specs.inventory import nodes_text

COLUMNS = ("job", "name", "script", "state", "hosts", "duration", "started")
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class JobFilter:
    """--state, --name and --last as given (None: any)."""

    state: str | None = None
    name: str | None = None
    last: int | None = None


def job_name(record: JobRecord) -> str:
    """The name the job was given, else its recipe's file name without .yaml; "" for none."""
    if record.name:
        return record.name
    return Path(record.recipe).stem if record.recipe else ""


def job_script(record: JobRecord) -> str:
    """The job's script, relative to its working directory when it is in it; "" for a
    record that keeps none."""
    if not record.script:
        return ""
    script = Path(record.script)
    if script.is_absolute() and record.workdir and script.is_relative_to(record.workdir):
        return str(script.relative_to(record.workdir))
    return record.script


def _wanted(record: JobRecord, wanted: JobFilter, state_of: Callable[[JobRecord], str]) -> bool:
    if wanted.state is not None and state_of(record) != wanted.state:
        return False
    return wanted.name is None or job_name(record) == wanted.name


def selected(entries: Sequence[ListedJob], wanted: JobFilter,
             state_of: Callable[[JobRecord], str]) -> list[ListedJob]:  # fmt: skip
    """The records the filters keep (--last: the most recent N of them), and every record
    that cannot be read (it could be any job: never hidden), oldest first."""
    kept = [e for e in entries if e.record is not None and _wanted(e.record, wanted, state_of)]
    kept = kept[-wanted.last :] if wanted.last else kept
    unreadable = [e for e in entries if e.record is None]
    return sorted([*kept, *unreadable], key=lambda e: e.job_id)


def _moment(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def duration_text(seconds: float) -> str:
    """`45s`, `3m20s`, `2h05m`, `3d04h`."""
    whole = max(0, int(seconds))
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def job_duration(record: JobRecord, now: datetime) -> str:
    """From its start to its end; a job with no end so far: to `now`, marked `+`."""
    started, ended = _moment(record.started_at), _moment(record.ended_at)
    if started is None:
        return ""
    if ended is not None:
        return duration_text((ended - started).total_seconds())
    return duration_text((now - started).total_seconds()) + "+"


def local_time(text: str | None, zone: timezone | None = None) -> str:
    """An ISO time of a record in the local time zone (`zone` for tests), to the minute."""
    moment = _moment(text)
    if moment is None:
        return text or ""
    return moment.astimezone(zone).strftime("%Y-%m-%d %H:%M")


def job_row(listed: ListedJob, state: str, now: datetime,
            zone: timezone | None = None) -> tuple[str, ...]:  # fmt: skip
    """One row of the list, by COLUMNS (an unreadable record's: its id, and its state
    "unreadable"; unreadable_lines say why)."""
    record = listed.record
    if record is None:
        return (listed.job_id, "", "", UNREADABLE, "", "", "")
    return (record.id, job_name(record), job_script(record), state, nodes_text(record.hosts),
            job_duration(record, now), local_time(record.started_at, zone))  # fmt: skip


def unreadable_lines(entries: Sequence[ListedJob]) -> list[str]:
    """`<job>: unreadable: <why>`, for each record listed that could not be read."""
    return [f"{listed.job_id}: {UNREADABLE}: {listed.problem}" for listed in entries
            if listed.record is None]  # fmt: skip
