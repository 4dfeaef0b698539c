"""The typer app every command group registers on, and how every command parses: besides
its own options, their hidden aliases, and the spellings orch refuses naming the right one
(specs/spellings.py); and how their options and arguments show in `--help`. Imports no
command module, so the command modules and the entry
point (cli/main.py) can both import it without a cycle."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from orchestrator import __version__
from orchestrator.specs.spellings import Refusal, aliases_of, own_spellings, refusals_for

# What `--help`, the reference and the man pages show after an option or for an argument:
# nothing after a flag, the words of a fixed set (`<pdsh|srun>`, given by options.one_of),
# else a word in capitals for what the value is (`PATH`, `SECONDS`, `NODESET`), as the
# field's tools (argparse, click, pdsh) spell them; an argument by its name in capitals, in
# the usage line too (`orch launch [OPTIONS] SCRIPT`). typer's own (`<bool>`, `<str>`,
# `{script}`) name Python's types, which a user does not type.

# A value's word when its option gives none, by the option's name: one word for one option
# in every command.
_BY_NAME = {
    "--include": "NODES",
    "--exclude": "NODES",
    "--python": "PATH",
    "--script": "PATH",
    "--workdir": "DIR",
    "--name": "NAME",
    "--partition": "NAME",
    "--prefix": "PREFIX",
    "--main-port": "PORT",
    "--main-address": "ADDRESS",
    "--nproc-per-node": "N",
    "--slots": "N",
    "--gpus-per-node": "N",
    "--max-restarts": "N",
    "--min-nodes": "M",
    "--rank": "R",
    "--attempt": "K",
    "--timeout": "SECONDS",
    "--probe-timeout": "SECONDS",
    "--heartbeat-timeout": "SECONDS",
    "--stop-grace": "SECONDS",
    "--grace": "SECONDS",
    "--stop-signal": "SIGNAL",
    "--time": "TIME",
}
# Else by the type typer reads it as.
_BY_TYPE = {
    "<str>": "TEXT",
    "<int>": "INTEGER",
    "<int range>": "INTEGER",
    "<float>": "NUMBER",
    "<float range>": "NUMBER",
    "<path>": "PATH",
}


class OrchOption(TyperOption):
    """A typer option that shows no type after a flag, and a value's word for the others."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        if self.metavar is not None:
            return self.metavar
        named = next((_BY_NAME[o] for o in self.opts if o in _BY_NAME), None)
        if named is not None:
            return named
        shown = self.display_type(ctx)
        return _BY_TYPE.get(shown, shown) + ("..." if self.nargs != 1 else "")


class OrchArgument(TyperArgument):
    """A typer argument shown by its name in capitals (its metavar, when it has one), as
    `SCRIPT`, `[JOB]` and `[ARGS]...` in the usage line."""

    @property
    def display_name_raw(self) -> str:
        return self.metavar if self.metavar is not None else (self.name or "").upper()

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")


def _adopt_params(params: list[Any]) -> list[Any]:
    """`params`, each typer option and argument now shown as above (the same objects)."""
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = OrchOption
        elif type(param) is TyperArgument:
            param.__class__ = OrchArgument
    return params


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

    def get_params(self, ctx: Any) -> list[Any]:
        return _adopt_params(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        # A command whose script takes the rest of the line (`orch launch SCRIPT [ARGS]...`).
        return [*pieces, "[ARGS]..."] if self.context_settings.get("allow_extra_args") else pieces

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

    def get_params(self, ctx: Any) -> list[Any]:
        return _adopt_params(super().get_params(ctx))


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
        if type(command) is TyperGroup:
            command.__class__ = OrchGroup  # its own options shown as orch shows them
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
