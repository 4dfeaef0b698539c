"""Where a command writes. `--json`: one JSON document on stdout, named by its schema
(`orch.<what>`) and SCHEMA_VERSION first, so that a program reading it knows what it reads
(docs/reference/json.md). What a person reads beside it goes to stderr."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import typer
from rich.console import Console

from orchestrator.specs.constants import SCHEMA_VERSION


def named(what: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` with its schema's name and version first (a record's own, when it has them)."""
    return {"schema": f"orch.{what}", "schema_version": SCHEMA_VERSION, **document}


def print_document(what: str, document: Mapping[str, Any]) -> None:
    typer.echo(json.dumps(named(what, document), indent=2))


def err_console() -> Console:
    """stderr, for a person: no colouring of numbers and paths, long lines left whole."""
    return Console(stderr=True, highlight=False, soft_wrap=True)
