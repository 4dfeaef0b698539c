"""The typer app every command group registers on, and how every command parses: besides
its own options, their hidden aliases, and the spellings orch refuses naming the right one
(specs/spellings.py). Imports no command module, so the command modules and the entry
point (cli/main.py) can both import it without a cycle."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from orchestrator import __version__
from orchestrator.specs.spellings import Refusal, aliases_of, own_spellings, refusals_for


@dataclass(frozen=True)
class _Refused:
    """What the parser records for a refused spelling (its `obj`)."""

    spelling: str

    @property
    def dest(self) -> str:
        return f"refused {self.spelling}"


class OrchCommand(TyperCommand):
    """A typer command whose parser also takes the hidden aliases of its options and refuses
    the spellings orch gave another meaning, naming the one that has it."""

    def make_parser(self, ctx: Any) -> Any:
        parser = super().make_parser(ctx)
        params = self.get_params(ctx)
        has = own_spellings(params)
        for param in params:
            if param.param_type_name != "option" or param.is_flag:
                continue
            aliases = [alias for alias in aliases_of(param) if alias not in has]
            if aliases:
                parser.add_option(obj=param, opts=aliases, dest=param.name, nargs=param.nargs,
                                  action="append" if param.multiple else "store")  # fmt: skip
        refusals = refusals_for(has)
        for spelling in refusals:
            marker = _Refused(spelling)
            parser.add_option(obj=marker, opts=[spelling], dest=marker.dest)
        if refusals and not ctx.resilient_parsing:  # (shell completion parses leniently)
            parser.parse_args = _refusing(parser.parse_args, refusals, ctx.command_path, has)
        return parser


def _refusing(parse: Callable[..., Any], refusals: dict[str, Refusal], command: str,
              has: frozenset[str]) -> Callable[..., Any]:  # fmt: skip
    """`parse`, raising the refusal of the first refused spelling given."""

    def parse_args(args: Sequence[str]) -> Any:
        opts, rest, order = parse(args=args)
        for seen in order:
            if isinstance(seen, _Refused):
                refusal = refusals[seen.spelling]
                value = str(opts[seen.dest])
                raise refusal.refuse(seen.spelling, value, command, has)
        return opts, rest, order

    return parse_args


class OrchGroup(TyperGroup):
    """orch's typer group: every command it holds, and every command of its groups, is an
    OrchCommand (so a command added later reads the same spellings, with no word of it)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            _adopt(command)


def reflowed(text: str | None) -> str | None:
    """Help text with each paragraph on one line, for the terminal to wrap: a docstring's
    line breaks are where its source wrapped, not where the reader's terminal does."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _adopt(command: Any) -> None:
    command.help = reflowed(command.help)
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _adopt(sub)
    elif type(command) is TyperCommand:
        command.__class__ = OrchCommand  # the same object, with orch's parser


app = typer.Typer(
    name="orch",
    cls=OrchGroup,  # every command parses as OrchCommand
    help="pdsh-driven orchestrator for multi-node training: doctor, configs, launch, logs.",
    no_args_is_help=True,
    add_completion=True,  # orch --install-completion: commands, options, their choices
    pretty_exceptions_enable=False,
)

_options = {"debug": False}


def debug_requested() -> bool:
    """Whether `--debug` was given: orch's own errors then come with their traceback."""
    return _options["debug"]


# What `orch --version` prints: `orch version`'s report, which its module gives here (this
# module imports no command module).
_version_report: list[Callable[[], str]] = []


def report_versions_with(report: Callable[[], str]) -> None:
    _version_report[:] = [report]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(_version_report[0]() if _version_report else f"orch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for orch's own errors."),
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print the versions a bug report needs (as `orch version`).",
    ),
) -> None:
    _options["debug"] = debug
