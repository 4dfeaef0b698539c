"""`orch checkpoints JOB [--json]`: the checkpoints a job launched with --checkpoint-dir wrote
(how big, complete or not and how that was decided, which nodes wrote their parts, which
hold copies, which the writer deleted) and what each restart resumed from. The lines and
rows are made from the record, so they are tested on values; the command prints them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.cli.app import app
from orchestrator.cli.documents import print_document
from orchestrator.cli.options import OUTPUT_PANEL, RUNS_DIR, examples, in_panel
from orchestrator.cli.user_defaults import runs_dir_option
from orchestrator.errors import UsageError
from orchestrator.records.checkpoints import (
    CheckpointEntry,
    CheckpointsRecord,
    RestoreRecord,
    files_words,
    load_checkpoints,
)
from orchestrator.records.job import JobRecord, runs_root
from orchestrator.records.ownership import check_job, check_runs_root
from orchestrator.records.rundir import find_job
from orchestrator.remote import owned
from orchestrator.specs.checkpoints import CheckpointSettings
from orchestrator.specs.inventory import nodes_text
from orchestrator.specs.units import format_bytes

COLUMNS = ("checkpoint", "size", "complete", "written by", "copies on", "attempt", "deleted")
_RUNS_DIR = in_panel(RUNS_DIR, OUTPUT_PANEL)
_JSON = typer.Option(False, "--json", help="Print the record of checkpoints as one JSON "
                     "document.", rich_help_panel=OUTPUT_PANEL)  # fmt: skip


def checkpoint_row(entry: CheckpointEntry) -> tuple[str, ...]:
    """One checkpoint as the table shows it, in COLUMNS' order."""
    complete = f"yes ({entry.how})" if entry.complete else "no"
    return (
        entry.name + ("/" if entry.kind == "dir" else ""),
        format_bytes(entry.size),
        complete,
        nodes_text(entry.writers) or "-",
        nodes_text(entry.holders) or "-",
        str(entry.attempt),
        "yes" if entry.gone_at is not None else "",
    )


def restore_lines(restore: RestoreRecord) -> list[str]:
    """What one restart resumed from (the sentence the head printed before it and the job's
    page shows), and what each of its nodes was sent."""
    return [restore.sentence, *(f"  {got.words(node)}" for node, got in restore.nodes.items())]


def record_lines(record: CheckpointsRecord) -> list[str]:
    """The lines above the table: the settings, and whether orch copies."""
    lines = [record.settings_words, record.sharing_words]
    if not record.checkpoints:
        lines.append("no checkpoint seen yet")
    return lines


def restarts_lines(record: CheckpointsRecord) -> list[str]:
    """The lines below the table: what each restart resumed from."""
    if not record.restores:
        return []
    return ["restarts:", *(line for restore in record.restores
                           for line in restore_lines(restore))]  # fmt: skip


def job_checkpoints(job: JobRecord, found: CheckpointsRecord | None) -> CheckpointsRecord:
    """The job's record of checkpoints: the file, else (nothing seen yet) the settings the
    job was launched with; a UsageError for a job launched without --checkpoint-dir."""
    if found is not None:
        return found
    if job.checkpoints is None:
        raise UsageError(
            f"job {job.id} was not launched with --checkpoint-dir: orch kept no checkpoints "
            "of it",
            "launch with --checkpoint-dir PATH (a recipe: checkpoint_dir: PATH), the "
            "directory where the job writes its checkpoints",
        )
    settings = job.checkpoints
    return CheckpointsRecord(dir=settings.dir, copies=settings.copies,
                             bandwidth=settings.bandwidth)  # fmt: skip


def _gather(job: JobRecord, record: CheckpointsRecord, dest: Path, name: str | None) -> None:
    """One checkpoint collected onto the head, said in one line."""
    # SSH: imported by --gather alone, not by every `orch checkpoints`.
    from orchestrator.checkpoint_copies.gather import gather
    from orchestrator.checkpoint_copies.nodes import CheckpointNodes
    from orchestrator.nodes.transport import reaching

    settings = CheckpointSettings(record.dir, record.copies, record.bandwidth)
    nodes = CheckpointNodes(reaching(job.transport, job.slurm_job_id), job.python, job.id,
                            settings, job.node_root_or(owned.root_setting(os.environ)))  # fmt: skip
    hosts = tuple(dict.fromkeys((*job.hosts, *(n for a in job.attempts for n in a.nodes))))
    try:
        done = gather(nodes, record, hosts, dest, name)
    finally:
        nodes.close()
    Console(stderr=True, highlight=False).print(
        f"gathered {done.entry} ({files_words(done.files)}, {format_bytes(done.bytes)}, each "
        f"checked by its sha256) into {done.path} from {nodes_text(done.from_nodes)}", markup=False)


_GATHER = typer.Option(None, "--gather", metavar="DEST", help="Collect one checkpoint onto "
                       "this machine, whole, into DEST/<its name> (the newest complete one "
                       "unless --checkpoint names another).")  # fmt: skip
_CHECKPOINT = typer.Option(None, "--checkpoint", metavar="NAME",
                           help="With --gather: the checkpoint to collect.")  # fmt: skip


@app.command(
    epilog=examples(
        "orch checkpoints JOB",
        "orch checkpoints JOB --json",
        "orch checkpoints JOB --gather ./gathered",
    )
)
def checkpoints(
    job: str = typer.Argument(..., help="The job id (or a unique prefix)."),
    runs_dir: Path = _RUNS_DIR,
    as_json: bool = _JSON,
    gather_to: Path | None = _GATHER,
    name: str | None = _CHECKPOINT,
) -> None:
    """Show a job's checkpoints (--checkpoint-dir) and what each restart resumed from.

    Each checkpoint: its size, whether it is complete and how orch decided it, the nodes
    that wrote its parts, those that hold copies, and whether its writer deleted it. With
    --gather, one of them collected from the nodes onto this machine, whole.

    Exit codes: 0 shown (or gathered whole); 1 orch's own failure; 2 a usage error."""
    if name is not None and gather_to is None:
        raise UsageError("--checkpoint goes with --gather", "add --gather DEST")
    root = runs_root(runs_dir_option(runs_dir))
    check_runs_root(root)  # before any record in it is read
    run = find_job(root, job)
    check_job(run)
    loaded = run.load()
    record = job_checkpoints(loaded, load_checkpoints(run))
    if gather_to is not None:
        _gather(loaded, record, gather_to, name)
        return
    if as_json:
        print_document("checkpoints", record.to_dict())
        return
    # Piped output keeps whole names rather than a terminal's 80 columns.
    out = Console(highlight=False, soft_wrap=True,
                  width=None if sys.stdout.isatty() else 200)  # fmt: skip
    for line in record_lines(record):
        out.print(line, markup=False)
    if record.checkpoints:
        table = Table()
        for column in COLUMNS:
            table.add_column(column, no_wrap=True)
        for entry in record.checkpoints:
            table.add_row(*(escape(cell) for cell in checkpoint_row(entry)))
        out.print(table)
    for line in restarts_lines(record):
        out.print(line, markup=False)
