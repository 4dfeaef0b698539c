"""The report's model from a run directory's files: job.json, the moments and progress
samples kept as the job ran (moments.jsonl, progress.jsonl), the pre-flight's report
(preflight.json), the stacks and profiles kept (stacks/), the tail of each node's log and
the raw logs pulled back (nodes/), the job's checkpoints (checkpoints.json). Reads only; a
part that cannot be read is named in the page rather than failing it (only an unreadable
job.json does)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.checks.model import CHECK_GROUPS
from orchestrator.errors import RecordError
from orchestrator.logs.progress import read_samples
from orchestrator.outcome.rank_ends import Role
from orchestrator.outcome.states import JobState
from orchestrator.records.checkpoints import load_checkpoints
from orchestrator.records.job import (
    LOGS_DIR,
    PREFLIGHT_FILE,
    STACKS_DIR,
    FirstFailure,
    JobRecord,
    RankRecord,
    log_file_name,
)
from orchestrator.records.moments import MomentKind, read_moments
from orchestrator.records.rundir import RunDir
from orchestrator.report.checkpoints import CheckpointsView, checkpoints_view, unreadable
from orchestrator.report.model import (
    TAIL_LINES,
    Cause,
    NodeRow,
    Parity,
    Profile,
    ReportModel,
    StackGroup,
    Stacks,
)
from orchestrator.report.progress import rank_series, slowest_rank
from orchestrator.stacks.fold import rank_ranges
from orchestrator.stacks.model import Frame

TAIL_BYTES = 64 * 1024  # a log's tail is read from its end: logs run to gigabytes
RAW_FILES_SHOWN = 12  # links to a node's pulled-back raw logs, at most


def build_report(run_dir: Path, state: JobState | None = None) -> ReportModel:
    """The job's page from its records; `state`: the ended attempt's, for its page between
    two attempts (the record says "stopping" until the next one starts)."""
    run = RunDir(Path(run_dir))
    record = run.load()  # OrchError when missing or unreadable: no page without it
    if state is not None:
        record = replace(record, state=state)
    ranks = record.ranks
    cause = _cause(record.first_failure, ranks)
    nodes = tuple(_node_row(run, record, node, ranks, cause) for node in _node_names(record))
    start, end = _epoch(record.started_at), _epoch(record.ended_at)
    moments = read_moments(run.path)
    series = rank_series(read_samples(run.path))
    preflight = [m.t for m in moments if m.kind == MomentKind.PREFLIGHT_START]
    kept = [_file_named(run, name) for name in _stack_files(run)]
    first = _first([start, *preflight, *(r.start for r in ranks)], min)
    checkpoints = read_checkpoints(run, first)
    return ReportModel(
        job_id=record.id, state=str(record.state), verdict=verdict(record, ranks),
        command=" ".join(record.command), launcher=record.launcher, fanout=record.fanout,
        shape=shape(len(nodes), ranks), started_at=record.started_at,
        ended_at=record.ended_at, duration=duration(start, end), exit_code=record.exit_code,
        start=first,
        end=_first([end, *(r.end for r in ranks), *(m.t for m in moments),
                    *(checkpoints.times if checkpoints else ()), *_stop_times(record)], max),
        nodes=nodes, cause=cause,
        stacks=read_stacks(run, record.teardown_stacks or _latest(kept, "dump")),
        moments=moments, series=series, slowest=slowest_rank(series),
        profile=read_profile(run, _latest(kept, "profile")),
        parity=read_parity(run.preflight_file), attempts=record.attempts,
        environment=record.environment, hang_watch=record.hang_watch, checkpoints=checkpoints,
        stop=record.stop,
    )  # fmt: skip


def _stop_times(record: JobRecord) -> list[float | None]:
    """The stop's moments the timeline draws (the grace's end only where the job lasted
    that long: a job whose ranks were done sooner keeps its own axis)."""
    stop = record.stop
    if stop is None:
        return []
    return [stop.asked_at, stop.torn_down_at, *(r.ended_at for r in stop.ranks),
            *(r.signalled_at for r in stop.ranks)]


def read_checkpoints(run: RunDir, start: float | None) -> CheckpointsView | None:
    """The job's checkpoints (None: launched without --checkpoint-dir); a record that cannot
    be read is said on the page, which goes on without it."""
    try:
        record = load_checkpoints(run)
    except RecordError as err:
        return unreadable(err.message)
    return checkpoints_view(record, start) if record is not None else None


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
    name = log_file_name(node)
    log = run.logs / name
    raw = record.node_logs.get(node)
    return NodeRow(
        node=node, exit_code=record.node_exit_codes.get(node),
        ranks=tuple(rank for rank in ranks if rank.node == node),
        last_lines=tail_lines(log), log_href=f"{LOGS_DIR}/{name}" if log.is_file() else None,
        is_cause=cause is not None and cause.node == node,
        raw_logs=raw if raw not in (None, "ok") else None, raw_files=raw_files(run, node),
    )  # fmt: skip


def raw_files(run: RunDir, node: str) -> tuple[str, ...]:
    """The node's raw logs pulled back (nodes/<node>/...), as links relative to the page."""
    folder = run.node_logs / node
    try:
        files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return ()
    return tuple(p.relative_to(run.path).as_posix() for p in files[:RAW_FILES_SHOWN])


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


# ----- the pre-flight's report (doctor's --json document, records/moments.py) --------------------
def read_parity(path: Path) -> Parity | None:
    """The pre-flight's table; None when the job ran without one (--no-doctor)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        nodes = tuple(
            (str(n["node"]), tuple(str(n.get("checks", {}).get(g, "-")) for g in CHECK_GROUPS))
            for n in doc.get("nodes", ())
        )
        differing = tuple(
            (str(row["fact"]), str(row["majority"]),
             tuple((str(d["node"]), str(d["value"])) for d in row.get("differing", ())))
            for row in doc.get("parity", ())
        )  # fmt: skip
        findings = tuple(
            f"{f['severity']}: {f['node']}: {f['check']}: {f['problem']}"
            for f in doc.get("findings", ())
        )
        seconds = doc.get("seconds")
        return Parity(CHECK_GROUPS, nodes, differing, findings,
                      None if seconds is None else float(seconds))  # fmt: skip
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return Parity(CHECK_GROUPS, (), (), (f"{PREFLIGHT_FILE}: unreadable ({err})",), None)


# ----- stacks and profiles (the JSON `orch stacks` keeps: stacks/report.py) ---------------
def _stack_files(run: RunDir) -> list[str]:
    folder = run.stacks
    try:
        return sorted(f"{STACKS_DIR}/{p.name}" for p in folder.glob("*.json") if p.is_file())
    except OSError:
        return []


def _file_named(run: RunDir, relative: str) -> tuple[str, Any]:
    """(relative path, its JSON document or the error reading it)."""
    path = (run.path / relative).resolve()
    if not path.is_relative_to(run.path.resolve()):  # a record names files of its own only
        return relative, ValueError(f"{relative} is outside the job's directory")
    try:
        return relative, json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return relative, ValueError(f"{relative}: unreadable ({err})")


def _latest(kept: list[tuple[str, Any]], mode: str) -> str | None:
    """The newest document of this mode ("dump", "profile") in stacks/."""
    found = [name for name, doc in kept if isinstance(doc, dict) and doc.get("mode") == mode]
    return found[-1] if found else None


def read_stacks(run: RunDir, relative: str | None) -> Stacks | None:
    if not relative:
        return None
    name, doc = _file_named(run, relative)
    if isinstance(doc, Exception):
        return Stacks(name, (), (str(doc),))
    try:
        return Stacks(relative, _groups(doc), _stack_problems(doc))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        return Stacks(relative, (), (f"{relative}: unreadable ({err})",))


def read_profile(run: RunDir, relative: str | None) -> Profile | None:
    if not relative:
        return None
    _name, doc = _file_named(run, relative)
    try:
        profile = doc["profile"]
        straggler = profile.get("straggler")
        seconds = doc.get("seconds")
        return Profile(
            path=relative, taken_at=str(doc.get("taken_at", "")),
            seconds=None if seconds is None else float(seconds), verdict=str(profile["verdict"]),
            straggler_at=(int(straggler["rank"]), str(straggler["node"])) if straggler else None,
            taken_by=str(doc.get("taken_by") or "orch stacks --profile"),
            complete=doc.get("ok") is True,
            hottest=straggler.get("hottest_user_frame") if straggler else None,
            ranks=tuple((int(r["rank"]), str(r["node"]), float(r["comm_share"]))
                        for r in profile.get("ranks", ())),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


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
