"""Write docs/reference/cli.md from the CLI itself (orchestrator/cli/reference.py)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cli.reference import reference_markdown

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"

if __name__ == "__main__":
    PAGE.write_text(reference_markdown(), encoding="utf-8")
    print(PAGE)
