"""Option definitions several commands share, so each reads and behaves the same everywhere.
Nodes: -w/--nodelist names them (a node set, as pdsh, clush and srun spell it), -N/--nodes
counts them (as srun and sbatch); -i/--include and -e/--exclude pick among them (DeepSpeed's)."""

from __future__ import annotations

import copy
import functools
import re
import shlex
from collections.abc import Iterable
from typing import Any

import typer
from typer.models import OptionInfo

from orchestrator.errors import UsageError
from orchestrator.specs.constants import Transport
from orchestrator.specs.inventory import is_node_count

# The panels `--help` groups options in, in the order a user reaches for them.
NODES_PANEL = "Nodes"
SCRIPT_PANEL = "Script and environment"
LAUNCHER_PANEL = "Launcher"
RECOVERY_PANEL = "Recovery"
CHECKPOINTS_PANEL = "Checkpoints"
STOPS_PANEL = "Stops and hangs"
OUTPUT_PANEL = "Output"


def one_of(words: Iterable[object]) -> dict[str, Any]:
    """An option's settings that list its fixed set of words in `--help` (`[ssh|slurm]`)
    and offer them to shell completion. The word is checked where orch reads it, with one
    wording and its hint for every command (and the other tools' spellings, such as
    `--launcher deepspeed`, taken there)."""
    listed = [str(word) for word in words]

    def complete(incomplete: str) -> list[str]:
        return [word for word in listed if word.startswith(incomplete)]

    return {"metavar": "<" + "|".join(listed) + ">", "autocompletion": complete}


EXAMPLES_TITLE = "Examples:"


def examples(*lines: str) -> str:
    """A command's `--help` epilog: its examples, one command a line; a line that starts
    with `#` says what the next one does."""
    return EXAMPLES_TITLE + "\n\n" + "\n".join(f"  {line}" for line in lines)


def in_panel(option: OptionInfo, panel: str) -> OptionInfo:
    """A shared option, shown in `panel` of this command's `--help`."""
    placed = copy.copy(option)
    placed.rich_help_panel = panel
    return placed


INCLUDE = typer.Option(
    None,
    "--include",
    "-i",
    help="Only these nodes (and slots), DeepSpeed's syntax: 'node1:0,1@node2' or 'gpu[03-04]'.",
)
# An environment variable, as `-e NAME=VALUE` or `-e NAME` gave one before -e was --exclude.
_ENV_LIKE = re.compile(r"[A-Z][A-Z0-9]*_[A-Z0-9_]*|[^=]+=.*", re.ASCII)


def excluded(value: str) -> str:
    """-e/--exclude as given; an environment variable (what -e once was) is refused."""
    if _ENV_LIKE.fullmatch(value):
        raise UsageError(
            f"-e/--exclude {value!r} names no node: -e is --exclude (as DeepSpeed's)",
            f"an environment variable for every rank is --env {shlex.quote(value)}",
        )
    return value


EXCLUDE = typer.Option(
    None,
    "--exclude",
    "-e",
    parser=excluded,
    help="Leave these nodes (or slots) out, DeepSpeed's syntax: 'gpu02'.",
)
SLURM = typer.Option(
    False,
    "--slurm",
    help="Take the nodes and ranks per node from the Slurm allocation this runs in "
    "(SLURM_JOB_ID, SLURM_JOB_NODELIST), not a hostfile. Implied inside one with no --hostfile.",
)
TRANSPORT = typer.Option(
    None,
    "--transport",
    **one_of(Transport),
    help="How orch reaches the nodes for its own commands: ssh, or slurm (srun steps, inside "
    "an allocation whose nodes refuse SSH). Default: ssh, unless the allocation's first node "
    "refuses it.",
)
LAUNCHER_HELP = (
    "pdsh (also spelled deepspeed: accelerate launch with DeepSpeed's pdsh multinode "
    "runner), standard (also spelled accelerate: accelerate launch on every node) or torchrun"
)


def node_set(value: str, *, count_hint: str | None = None) -> str:
    """-w/--nodelist: a node set. A count (all digits) is refused: `count_hint`, where the
    command takes one, says which option."""
    text = value.strip()
    if is_node_count(text):
        raise UsageError(
            f"-w/--nodelist {text}: a node set names the nodes ('gpu[01-04]', 'a,b'); "
            f"{text} is a count",
            count_hint.format(count=text) if count_hint else "name the nodes, e.g. -w 'gpu[01-04]'",
        )
    return text


def node_count(value: str | int, *, most: int | None = None, nodelist: bool = True) -> int:
    """-N/--nodes: a count (at least 1, at most `most`). A node set, or torchrun's elastic
    MIN:MAX, is refused with the options that say it (`nodelist`: the command has -w)."""
    text = str(value).strip()
    if is_node_count(text):
        count = int(text)
        if count < 1:
            raise typer.BadParameter("Input should be greater than or equal to 1")
        if most is not None and count > most:
            raise typer.BadParameter(f"Input should be less than or equal to {most}")
        return count
    low, colon, high = text.partition(":")
    if colon and is_node_count(low) and is_node_count(high) and nodelist:
        raise UsageError(
            f"-N/--nodes {text}: one count, not torchrun's elastic MIN:MAX",
            f"run on {high} nodes and go on with fewer, down to {low}, after a node is "
            f"lost: -N {high} --min-nodes {low} --max-restarts R",
        )
    if nodelist:
        raise UsageError(
            f"-N/--nodes {text!r}: a count of nodes (as srun's -N), not a node set; a node "
            "set is -w/--nodelist (as pdsh's and srun's)",
            f"did you mean -w {shlex.quote(text)}?",
        )
    raise UsageError(f"-N/--nodes {text!r}: a count of nodes, e.g. -N 4")


def nodelist_option(help_text: str, *, count_hint: str | None = None) -> OptionInfo:
    """-w/--nodelist as a command takes it."""
    return typer.Option(
        None, "--nodelist", "-w", metavar="NODESET", help=help_text,
        parser=functools.partial(node_set, count_hint=count_hint),
    )  # fmt: skip


def nodes_option(help_text: str, default: int | None = None, *, most: int | None = None,
                 nodelist: bool = True) -> OptionInfo:  # fmt: skip
    """-N/--nodes as a command takes it."""
    return typer.Option(
        default, "--nodes", "-N", metavar="N", help=help_text,
        parser=functools.partial(node_count, most=most, nodelist=nodelist),
    )  # fmt: skip


RUNS_DIR = typer.Option(
    None,
    "--runs-dir",
    help="Job records (default: $ORCH_RUNS_DIR, else a defaults file's runs_dir, else ./runs).",
)
