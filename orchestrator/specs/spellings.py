"""One meaning per option spelling, in every command. Two tables: the spellings of the tools
orch stands in for (torchrun's --nproc_per_node, accelerate's --main_process_port,
DeepSpeed's --num_nodes, ...) and orch's own earlier ones that still name one option, each a
hidden alias of orch's option (where the command has it); and the spellings that meant
something else before or elsewhere (`--nodes 'gpu[01-04]'`, `-n`, config's `-r`), refused
with the option that means it now. Every command of orch's app parses by them (cli/app.py).
Pure: spellings in, messages out."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.specs.inventory import is_node_count

# Hidden alias -> orch's spelling; an alias is accepted where the command has that option.
ALIASES: dict[str, str] = {
    # torchrun's (it takes both the underscore and the dash forms)
    "--nproc_per_node": "--nproc-per-node", "--nnodes": "--nodes",
    "--master_addr": "--main-address", "--master-addr": "--main-address",
    "--master_port": "--main-port", "--master-port": "--main-port",
    # accelerate launch's (its --num_processes is the total: only `orch config` has that)
    "--num_machines": "--nodes", "--main_process_ip": "--main-address",
    "--main_process_port": "--main-port", "--num_processes": "--num-processes",
    # the deepspeed runner's
    "--num_nodes": "--nodes", "--num_gpus": "--nproc-per-node",
    # orch's own earlier spellings that still mean the one option
    "--main-ip": "--main-address", "--out-dir": "--output", "--node": "--nodelist",
}  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """Spellings refused (exit 2) in a command `applies` to, by its own spellings; `refuse`
    says which option means it now, from the value given (and the command)."""

    spellings: tuple[str, ...]
    applies: Callable[[frozenset[str]], bool]
    refuse: Callable[[str, str, str, frozenset[str]], UsageError]  # spelling, value, command


def _quoted(value: str) -> str:
    return shlex.quote(value)


def _old_n(spelling: str, value: str, command: str, has: frozenset[str]) -> UsageError:
    """-n was a node set (hostfile, config), a count (sandbox up) and --node (logs)."""
    said = f"{spelling} is not an option of {command}"
    if is_node_count(value) and "-N" in has:
        return UsageError(f"{said}: a count of nodes is -N/--nodes (as srun's)",
                          f"did you mean -N {value}?")  # fmt: skip
    if is_node_count(value) and "--follow" in has:
        return UsageError(f"{said}: it prints every line of the log",
                          f"for the last {value}: {command} JOB | tail -n {value}")  # fmt: skip
    if "-w" in has:
        return _nodes_as_set(spelling, value, command, has)
    return UsageError(said, f"see `{command} --help`")


def _nodes_as_set(spelling: str, value: str, command: str, has: frozenset[str]) -> UsageError:
    """--nodes is a count (-N); these commands take nodes by name (-w)."""
    if is_node_count(value):
        return UsageError(f"{command} takes the nodes by name, not a count (-N/--nodes, as "
                          "srun's)",
                          "name them with -w/--nodelist, e.g. -w 'gpu[01-04]'")  # fmt: skip
    what = "a count of nodes (-N, as srun's)" if spelling == "--nodes" else "no option here"
    return UsageError(f"{spelling} is {what}; a node set is -w/--nodelist (as pdsh's and "
                      "srun's)", f"did you mean -w {_quoted(value)}?")  # fmt: skip


def _recipe_short(spelling: str, value: str, command: str, has: frozenset[str]) -> UsageError:
    return UsageError(f"{spelling} is --rank (orch logs); the recipe is --recipe",
                      f"did you mean --recipe {_quoted(value)}?")  # fmt: skip


def _main_address(spelling: str, value: str, command: str, has: frozenset[str]) -> UsageError:
    return UsageError(f"{command} has no {spelling}: the main node is node 0, the first of "
                      "the hostfile (or of -w/--nodelist)",
                      "list the main node first; its port is --main-port")  # fmt: skip


def _total_processes(spelling: str, value: str, command: str, has: frozenset[str]) -> UsageError:
    return UsageError(f"{spelling} is accelerate's total over every machine; {command} takes "
                      "the ranks of each node, --nproc-per-node",
                      "give --nproc-per-node N (the total divided by the nodes)")  # fmt: skip


REFUSALS: tuple[Refusal, ...] = (
    Refusal(("-n",), lambda has: bool({"--nodelist", "--nodes"} & has), _old_n),
    Refusal(("--nodes",), lambda has: "--nodelist" in has and "--nodes" not in has,
            _nodes_as_set),
    Refusal(("-r",), lambda has: "--recipe" in has and "-r" not in has, _recipe_short),
    Refusal(("--master_addr", "--master-addr", "--main_process_ip", "--main-ip",
             "--main-address"),
            lambda has: "--main-port" in has and "--main-address" not in has, _main_address),
    Refusal(("--num_processes", "--num-processes"),
            lambda has: "--nproc-per-node" in has and "--num-processes" not in has,
            _total_processes),
)  # fmt: skip


def own_spellings(params: Iterable[Any]) -> frozenset[str]:
    """Every spelling of the command's own options (hidden ones too)."""
    return frozenset(name for param in params if param.param_type_name == "option"
                     for name in (*param.opts, *param.secondary_opts))  # fmt: skip


def aliases_of(param: Any) -> list[str]:
    """The hidden aliases of an option, by its spellings."""
    return [alias for alias, name in ALIASES.items() if name in param.opts]


def refusals_for(has: frozenset[str]) -> dict[str, Refusal]:
    """The spellings a command with these spellings refuses, with the refusal of each."""
    return {spelling: refusal for refusal in REFUSALS if refusal.applies(has)
            for spelling in refusal.spellings if spelling not in has}  # fmt: skip
