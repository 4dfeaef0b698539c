"""`orch logs JOB`: a job's per-node logs, one node or all, by node or by time, or followed;
`--rank R`: exactly rank R's lines (or its raw output with --raw)."""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import typer

from orchestrator.cli.app import app
from orchestrator.cli.options import RUNS_DIR, examples, node_set
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.errors import OrchError, UsageError
from orchestrator.logs.reader import LogFollower, merge_by_time, rank_filter, read_log_lines
from orchestrator.records.attempts import attempt_run_dir
from orchestrator.records.job import (
    HEAD_NODE,
    RUNNING_STATES,
    JobRecord,
    head_alive,
    log_file_name,
    runs_root,
)
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import RunDir, find_job
from orchestrator.remote.agent_spec import node_dir_shown
from orchestrator.remote.owned import root_setting
from orchestrator.specs.inventory import expand_nodeset

_FOLLOW_POLL_S = 0.5
_NODELIST = typer.Option(
    [], "--nodelist", "-w", metavar="NODESET",
    parser=functools.partial(node_set, count_hint="for the last {count} lines: orch logs JOB | "
                             "tail -n {count}"),
    help="Only these nodes: a node set ('n[1-2]', 'a,b'; repeat).",
)  # fmt: skip
_RUNS_DIR = RUNS_DIR
_RAW_FILES = ("stdout.raw", "stderr.raw")


def _selected_nodes(record: JobRecord, run: RunDir, wanted: list[str]) -> list[str]:
    known = list(record.hosts)
    extra = sorted(
        p.stem for p in run.logs.glob("*.log") if p.stem not in known and p.stem != HEAD_NODE
    )
    known += extra
    if not wanted:
        return known
    names = list(dict.fromkeys(name for item in wanted for name in expand_nodeset(item)))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(
            f"job {record.id} has no node {', '.join(unknown)}",
            f"its nodes are: {', '.join(known) or '(none)'}",
        )
    return names


def _prefixed(node: str, lines: Iterable[bytes], prefix: bool) -> Iterator[bytes]:
    head = node.encode() + b" "
    for line in lines:
        yield (head + line if prefix else line) + b"\n"


def _write_all(out: BinaryIO, chunks: Iterable[bytes]) -> None:
    batch: list[bytes] = []
    for chunk in chunks:
        batch.append(chunk)
        if len(batch) >= 4096:
            out.write(b"".join(batch))
            batch.clear()
    out.write(b"".join(batch))
    out.flush()


def _show(
    run: RunDir, nodes: list[str], by_time: bool, out: BinaryIO, rank: int | None
) -> list[str]:
    paths = {node: run.logs / log_file_name(node) for node in nodes}
    present = {node: path for node, path in paths.items() if path.is_file()}
    prefix = len(nodes) > 1 and rank is None  # one rank lives on one node
    keep = rank_filter(rank)
    if by_time:
        merged = merge_by_time({n: keep(read_log_lines(p)) for n, p in present.items()})
        lines = ((n.encode() + b" " if prefix else b"") + line + b"\n" for n, line in merged)
        _write_all(out, lines)
    else:
        for node, path in present.items():
            _write_all(out, _prefixed(node, keep(read_log_lines(path)), prefix))
    return [node for node in nodes if node not in present]


_RANK_NOTE = re.compile(rb" orch rank .*\brank=(\d+)")


def _check_rank_seen(run: RunDir, record: JobRecord, nodes: list[str], rank: int) -> None:
    """An error naming the ranks the job had when `rank` was never among them: not in the
    record's ranks on these nodes, no line of its own and no start of it in their logs."""
    seen = {end.rank for end in record.ranks if end.node in nodes}
    has_lines = rank_filter(rank)
    for node in nodes:
        path = run.logs / log_file_name(node)
        if path.is_file():
            if next(has_lines(read_log_lines(path)), None) is not None:
                return  # its lines were just printed
            for line in read_log_lines(path):
                match = _RANK_NOTE.search(line)
                if match:
                    seen.add(int(match.group(1)))
    if rank not in seen:
        known = ", ".join(map(str, sorted(seen))) or "none reported"
        raise OrchError(
            f"job {record.id}: rank {rank} never started on {', '.join(nodes)}",
            f"its ranks: {known}",
        )


def _still_running(run: RunDir) -> bool:
    try:
        record = run.load()
    except OrchError:
        return False
    return record.state in RUNNING_STATES and head_alive(record)


def _follow(run: RunDir, nodes: list[str], out: BinaryIO, rank: int | None) -> None:
    prefix = len(nodes) > 1 and rank is None
    keep = rank_filter(rank)
    followers = {node: LogFollower(run.logs / log_file_name(node)) for node in nodes}
    while True:
        running = _still_running(run)  # checked before reading: nothing written is missed
        for node, follower in followers.items():
            while lines := follower.read_new():
                _write_all(out, _prefixed(node, keep(lines), prefix))
        if not running:
            return
        time.sleep(_FOLLOW_POLL_S)


def _show_raw(run: RunDir, nodes: list[str], out: BinaryIO, rank: int | None) -> list[str]:
    missing = []
    names = _RAW_FILES if rank is None else tuple(f"rank{rank}.{name}" for name in _RAW_FILES)
    for node in nodes:
        directory = _raw_dir(run, node)
        files = [directory / name for name in names if (directory / name).is_file()]
        if not files:
            missing.append(node)
            continue
        for path in files:
            out.write(f"==> {node}/{path.name} <==\n".encode())
            with path.open("rb") as handle:
                while block := handle.read(1 << 20):
                    out.write(block)
            out.write(b"\n")
    out.flush()
    return missing


def _raw_dir(run: RunDir, node: str) -> Path:
    return run.node_logs / node


@app.command(
    epilog=examples(
        "orch logs JOB -f",
        "orch logs JOB -w n2 --rank 3",
        "# the first attempt of a restarted job",
        "orch logs JOB --attempt 1",
    )
)
def logs(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    node: list[str] = _NODELIST,
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing new lines until the job ends."
    ),
    raw: bool = typer.Option(
        False, "--raw", help="The raw node-local logs pulled back at the end, byte for byte."
    ),
    by_time: bool = typer.Option(
        False, "--by-time/--by-node", help="Interleave nodes by time, or one node after another."
    ),
    rank: int | None = typer.Option(
        None,
        "--rank",
        "-r",
        min=0,
        help="Only this global rank's lines (its raw output with --raw).",
    ),
    attempt: int | None = typer.Option(
        None,
        "--attempt",
        "-a",
        min=1,
        help="An earlier attempt's logs (1 is the first); default: the latest.",
    ),
    runs_dir: Path = _RUNS_DIR,
) -> None:
    """Print a job's per-node logs.

    Each line: timestamp, \\[r<rank>/<local rank>,] stream, text; prefixed by its node when
    there are several. Lines with no rank are the node's launcher's (out, err), ssh's (sys)
    or orch's (orch).

    Exit codes: 0 printed (--follow: the job ended); 1 the record cannot be read; 2 a usage
    error (a node, rank or attempt the job never had); 130 --follow interrupted."""
    if raw and follow:
        raise UsageError(
            "--raw and --follow cannot be combined",
            "raw logs are pulled back when the job ends; follow the head-side logs instead",
        )
    root = runs_root(runs_dir_option(runs_dir))
    check_runs_root(root)  # before any record in it is read
    run = find_job(root, job)
    check_job(run)
    run, record = attempt_run_dir(run, run.load(), attempt)
    nodes = _selected_nodes(record, run, node)
    out = sys.stdout.buffer
    try:
        if raw:
            missing = _show_raw(run, nodes, out, rank)
            what = "raw logs" if rank is None else f"raw logs of rank {rank}"
            if rank is not None and len(missing) < len(nodes):
                missing = []  # the rank ran on one of them
        elif follow:
            _follow(run, nodes, out, rank)
            missing = []
            what = ""
        else:
            missing = _show(run, nodes, by_time, out, rank)
            what = "head-side log"
            if rank is not None and not missing:
                _check_rank_seen(run, record, nodes, rank)
    except BrokenPipeError:
        # `orch logs JOB | head`: the reader left; not an error.
        sys.stdout = None  # type: ignore[assignment]
        raise typer.Exit(0) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if missing:
        root = record.node_root_or(root_setting(os.environ))
        node_dir = node_dir_shown(record.id, "<node>", root)
        hint = (
            "the node could not be reached when the job ended; its raw logs stay in "
            f"{node_dir}/ on the node "
            "(<uid>: your uid there)"
            if raw
            else "the node printed nothing (or never started); see `orch status " + record.id + "`"
        )
        if len(missing) == len(nodes):
            raise OrchError(f"job {record.id}: no {what} for {', '.join(missing)}", hint)
        typer.echo(f"note: no {what} for {', '.join(missing)} ({hint})", err=True)
