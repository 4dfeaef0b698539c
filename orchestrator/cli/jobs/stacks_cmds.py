"""`orch stacks JOB [--profile SECONDS] [--json]`: every rank's Python stack, folded across
ranks, or a sampling profile that names the straggler."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

import typer

from orchestrator.cli.app import app
from orchestrator.cli.documents import print_document
from orchestrator.cli.options import RUNS_DIR, examples
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.errors import OrchError
from orchestrator.records.job import FINAL_STATES, JobRecord, now_iso, runs_root
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import RunDir, find_job
from orchestrator.remote.owned import root_setting
from orchestrator.run.status import shown_state
from orchestrator.specs.inventory import nodes_text
from orchestrator.stacks.fold import StackBlock, rank_ranges
from orchestrator.stacks.model import RankStacks
from orchestrator.stacks.profile import STRAGGLER_MARGIN
from orchestrator.stacks.report import StacksResult, analyse, result_json

_RUNS_DIR = RUNS_DIR
_RULE = "-" * 60


class StackMethod(str, Enum):
    auto = "auto"
    py_spy = "py-spy"
    faulthandler = "faulthandler"


_METHOD = typer.Option(
    StackMethod.auto,
    "--method",
    help="How stacks are taken: py-spy (needs ptrace); faulthandler (no ptrace: the rank "
    "dumps its own stack on SIGUSR2, from a handler orch-rank registers at its start; "
    "Python frames only); auto: py-spy, and faulthandler where py-spy is missing or refused.",
)


def _echo(line: str = "") -> None:
    typer.echo(line)


def _block_lines(block: StackBlock, majority: bool) -> list[str]:
    count = len(block.ranks)
    title = f"rank{'s' if count > 1 else ''} {rank_ranges(block.rank_numbers)}"
    title += f" ({nodes_text(block.nodes)})" + (f"  [{count} ranks, majority]" if majority else "")
    lines = [_RULE, title, _RULE]
    for thread in block.threads:
        state = "idle" if thread.idle else "active"
        lines.append(f"thread {thread.name or '?'} ({state}{', main' if thread.main else ''}):")
        lines += [f"    {frame.where}" for frame in thread.frames]
    return lines


def _failed_lines(result: StacksResult) -> list[str]:
    lines = []
    for node in result.nodes:
        if node.error:
            lines += [f"  {node.error}", f"    fix: {node.hint}"]
            continue
        for rank in node.ranks:
            if not rank.ok:
                lines += [f"  {_rank_name(rank)}: {rank.error}", f"    fix: {rank.hint}"]
    return ["could not be read:", *lines] if lines else []


def _rank_name(rank: RankStacks) -> str:
    return f"rank {rank.rank} on {rank.node}" + (f" (pid {rank.pid})" if rank.pid else "")


def _print_dump(result: StacksResult) -> None:
    folded = result.folded
    assert folded is not None
    read = sum(len(block.ranks) for block in folded.blocks)
    _echo(f"job {result.job_id}: {read} rank(s) on {len(result.nodes)} node(s), "
          f"{len(folded.blocks)} distinct stack(s)")  # fmt: skip
    if folded.outliers:
        _echo("stand apart from the majority:")
        for outlier in folded.outliers:
            where = outlier.frame.where if outlier.frame else "(no frame)"
            _echo(f"  rank {outlier.rank:<4} {outlier.node:<16} {where}")
    elif folded.majority is None and len(folded.blocks) > 1:
        _echo("no majority: no stack is shared by more ranks than every other")
    for block in folded.blocks:
        for line in _block_lines(block, block is folded.majority and len(folded.blocks) > 1):
            _echo(line)


def _print_profile(result: StacksResult) -> None:
    verdict = result.verdict
    assert verdict is not None
    _echo(f"job {result.job_id}: {result.seconds:g} s profile of {len(result.profiles)} "
          f"rank(s) on {len(result.nodes)} node(s)")  # fmt: skip
    _echo(f"{'rank':>5}  {'node':<16} {'samples':>7}  {'comm':>5}  hottest user frame "
          "outside communication")  # fmt: skip
    for p in result.profiles:
        where = p.hottest.where if p.hottest else "-"
        _echo(f"{p.rank:>5}  {p.node:<16} {p.samples:>7}  {p.comm_share:>5.0%}  {where}")
    straggler = verdict.straggler
    if straggler is None:
        _echo(verdict.reason)
        return
    _echo(f"straggler: rank {straggler.rank} on {straggler.node}")
    _echo(f"  {verdict.reason}")
    if straggler.hottest is not None and straggler.samples:
        share = straggler.hottest_samples / straggler.samples
        _echo(f"  hottest user frame: {straggler.hottest.where} ({share:.0%} of its samples)")


def _check_running(record: JobRecord) -> None:
    state = shown_state(record)
    if state in FINAL_STATES:
        raise OrchError(
            f"job {record.id} has ended ({state}): it has no rank to look at",
            f"see `orch status {record.id}` and `orch logs {record.id}`",
        )


@app.command(
    epilog=examples(
        "orch stacks JOB",
        "# which rank is the straggler",
        "orch stacks JOB --profile 10",
    )
)
def stacks(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    profile: int = typer.Option(
        None,
        "--profile",
        min=1,
        max=3600,
        metavar="SECONDS",
        help="Sample every rank this long instead (all at once); print each rank's share of "
        "samples in communication (collectives, barriers, waits on peers) and name the "
        "straggler: the rank that waits least, named only when its share is at least "
        f"{STRAGGLER_MARGIN * 100:.0f} percentage points below every other rank's (otherwise: "
        "no clear straggler). Each rank's main thread counts.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    timeout: float = typer.Option(
        30.0, "--timeout", min=1.0, help="Seconds each node has to answer (beyond --profile)."
    ),
    method: StackMethod = _METHOD,
    runs_dir: Path = _RUNS_DIR,
) -> None:
    """Every rank's Python stack, folded; the ranks that stand apart first.

    All threads of every rank on every node, taken while the job runs (py-spy, or the
    rank's own faulthandler where ptrace is refused); identical stacks are folded. Kept in
    runs/<job>/stacks/.

    Exit codes: 0 every node answered; 1 a node or a rank could not be read (the others
    still show); 2 a usage error."""
    # SSH and the stacks' gathering: imported by the command that uses them, not by every `orch`.
    from orchestrator.nodes.transport import reaching
    from orchestrator.run.stacks import DEFAULT_RATE, gather_stacks

    root = runs_root(runs_dir_option(runs_dir))
    check_runs_root(root)  # the record names the interpreter run on every host it lists
    run = find_job(root, job)
    check_job(run)
    record = run.load()
    _check_running(record)
    transport = reaching(record.transport, record.slurm_job_id)
    reports = gather_stacks(
        record.hosts, record.id, record.python, timeout,
        profile_seconds=float(profile) if profile else None, rate=DEFAULT_RATE, method=method.value,
        transport=transport, node_root=record.node_root_or(root_setting(os.environ)),
    )  # fmt: skip
    result = analyse(record.id, now_iso(), float(profile) if profile else None, reports)
    document = result_json(result)
    saved = _save(run, document)
    if as_json:
        print_document("stacks", {**document, "saved_as": saved})
    else:
        (_print_profile if profile else _print_dump)(result)
        for line in _failed_lines(result):
            _echo(line)
        if saved:
            typer.echo(f"saved: {saved}", err=True)
    if not result.ok:
        raise typer.Exit(1)


def _save(run: RunDir, document: dict) -> str | None:
    from orchestrator.run.stacks import save_stacks

    try:
        return str(save_stacks(run, document))
    except OSError as err:
        typer.echo(f"warning: could not keep the stacks in {run.path} ({err})", err=True)
        return None
