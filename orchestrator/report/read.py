"""The report's model from a run directory's files: job.json, the teardown's stacks, the
tail of each node's log. Reads only; a part that cannot be read is named in the page rather
than failing it (only an unreadable job.json does)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.report.model import (
    TAIL_LINES,
    Cause,
    NodeRow,
    ReportModel,
    StackGroup,
    Stacks,
)
from orchestrator.run.rank_ends import Role
from orchestrator.run.records import FirstFailure, JobRecord, RankRecord, RunDir
from orchestrator.run.verdict import JobState
from orchestrator.stacks.fold import rank_ranges
from orchestrator.stacks.model import Frame

TAIL_BYTES = 64 * 1024  # a log's tail is read from its end: logs run to gigabytes


def build_report(run_dir: Path) -> ReportModel:
    run = RunDir(Path(run_dir))
    record = run.load()  # OrchError when missing or unreadable: no page without it
    ranks = record.ranks
    cause = _cause(record.first_failure, ranks)
    nodes = tuple(_node_row(run, record, node, ranks, cause) for node in _node_names(record))
    start, end = _epoch(record.started_at), _epoch(record.ended_at)
    return ReportModel(
        job_id=record.id, state=str(record.state), verdict=verdict(record, ranks),
        command=" ".join(record.command), launcher=record.launcher, fanout=record.fanout,
        shape=shape(len(nodes), ranks), started_at=record.started_at,
        ended_at=record.ended_at, duration=duration(start, end), exit_code=record.exit_code,
        start=_first([start, *(r.start for r in ranks)], min),
        end=_first([end, *(r.end for r in ranks)], max),
        nodes=nodes, cause=cause, stacks=read_stacks(run, record.teardown_stacks),
        attempts=record.attempts,
    )  # fmt: skip


def _first(values: Sequence[float | None], pick: Any) -> float | None:
    known = [value for value in values if value is not None]
    return pick(known) if known else None


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _node_names(record: JobRecord) -> list[str]:
    """The hosts, then any node a rank or an exit code names that the hosts do not."""
    extra = [rank.node for rank in record.ranks] + list(record.node_exit_codes)
    return list(dict.fromkeys([*record.hosts, *extra]))


def _node_row(
    run: RunDir, record: JobRecord, node: str, ranks: Sequence[RankRecord], cause: Cause | None
) -> NodeRow:
    log = run.logs / f"{node}.log"
    raw = record.node_logs.get(node)
    return NodeRow(
        node=node, exit_code=record.node_exit_codes.get(node),
        ranks=tuple(rank for rank in ranks if rank.node == node),
        last_lines=tail_lines(log), log_href=f"logs/{node}.log" if log.is_file() else None,
        is_cause=cause is not None and cause.node == node,
        raw_logs=raw if raw not in (None, "ok") else None,
    )  # fmt: skip


def tail_lines(path: Path, count: int = TAIL_LINES) -> tuple[str, ...]:
    """The last `count` lines of a file, read from its end; () when it cannot be read."""
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            file.seek(max(0, size - TAIL_BYTES))
            data = file.read()
    except OSError:
        return ()
    lines = data.decode("utf-8", errors="replace").splitlines()
    if len(data) == TAIL_BYTES and lines:
        lines = lines[1:]  # the first is a piece of a line
    return tuple(lines[-count:])


def _cause(failure: FirstFailure | None, ranks: Sequence[RankRecord]) -> Cause | None:
    if failure is None:
        return None
    rank = next((r for r in ranks if r.role == Role.CAUSE), None)
    rank = rank or next((r for r in ranks if r.rank == failure.rank), None)
    return Cause(
        node=failure.node, rank=failure.rank, reason=failure.reason,
        exit_code=failure.exit_code, kind=str(failure.kind), then=failure.then,
        hint=failure.hint, exception=failure.root_cause, traceback=failure.traceback,
        last_lines=failure.last_lines, at=rank.end if rank else None,
    )  # fmt: skip


def verdict(record: JobRecord, ranks: Sequence[RankRecord]) -> str:
    """The job's end in one sentence."""
    failure = record.first_failure
    if record.state == JobState.SUCCEEDED:
        return f"Succeeded: every one of {len(ranks) or 'its'} ranks exited 0."
    if failure is None:
        return f"{str(record.state).capitalize()}, exit code {record.exit_code}."
    rank = f"rank {failure.rank} on " if failure.rank is not None else ""
    words = f"{str(record.state).capitalize()}: {rank}{failure.node}: {failure.reason}"
    if failure.root_cause:
        words += f" ({failure.root_cause})"
    return words + (f"; {failure.then}." if failure.then else ".")


def shape(nodes: int, ranks: Sequence[RankRecord]) -> str:
    """The job's shape: "2 nodes × 4 ranks" when every node ran as many; else the totals."""
    per_node: dict[str, int] = {}
    for rank in ranks:
        per_node[rank.node] = per_node.get(rank.node, 0) + 1
    node_word = "node" if nodes == 1 else "nodes"
    if not ranks:
        return f"{nodes} {node_word}"
    counts = set(per_node.values())
    if len(counts) == 1 and len(per_node) == nodes:
        each = counts.pop()
        return f"{nodes} {node_word} × {each} rank{'s' if each != 1 else ''}"
    return f"{nodes} {node_word}, {len(ranks)} ranks"


def duration(start: float | None, end: float | None) -> str | None:
    if start is None or end is None:
        return None
    seconds = max(0, round(end - start))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {seconds:02d}s"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


# ----- the teardown's stacks (the JSON `orch stacks` keeps: stacks/report.py) ----------------
def read_stacks(run: RunDir, relative: str | None) -> Stacks | None:
    if not relative:
        return None
    path = (run.path / relative).resolve()
    if not path.is_relative_to(run.path.resolve()):  # a record names files of its own only
        return Stacks(relative, (), (f"{relative} is outside the job's directory",))
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return Stacks(relative, _groups(doc), _stack_problems(doc))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return Stacks(relative, (), (f"{relative}: unreadable ({err})",))


def _groups(doc: Mapping[str, Any]) -> tuple[StackGroup, ...]:
    blocks = (doc.get("stacks") or {}).get("blocks") or ()
    return tuple(
        StackGroup(
            ranks=rank_ranges(int(rank) for rank in block["ranks"]),
            count=len(block["ranks"]),
            nodes=tuple(str(node) for node in block.get("nodes", ())),
            majority=bool(block.get("majority")),
            threads=tuple(_thread(thread) for thread in block.get("threads", ())),
        )
        for block in blocks
    )


def _thread(thread: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    frames = tuple(
        Frame(str(frame["function"]), str(frame["file"]), int(frame["line"])).where
        for frame in thread.get("frames", ())
    )
    return str(thread.get("name") or "thread"), frames


def _stack_problems(doc: Mapping[str, Any]) -> tuple[str, ...]:
    problems = []
    for node in doc.get("nodes", ()):
        if node.get("error"):
            problems.append(str(node["error"]))
        problems += [
            f"{node.get('node')}: rank {rank.get('rank')}: {rank.get('error')}"
            for rank in node.get("ranks", ())
            if rank.get("error") and not node.get("error")
        ]
    return tuple(problems)
