"""Write docs/reference/cli.md and the man pages in docs/man/ from the CLI itself
(orchestrator/cli/about/reference.py, orchestrator/cli/about/manpages.py)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cli.about.manpages import man_pages
from orchestrator.cli.about.reference import reference_markdown

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "reference" / "cli.md"
MAN_DIR = DOCS / "man"

if __name__ == "__main__":
    PAGE.write_text(reference_markdown(), encoding="utf-8")
    print(PAGE)
    MAN_DIR.mkdir(exist_ok=True)
    pages = man_pages()
    for stale in set(p.name for p in MAN_DIR.glob("*.1")) - set(pages):
        (MAN_DIR / stale).unlink()  # a command that is gone
    for name, text in pages.items():
        (MAN_DIR / name).write_text(text, encoding="utf-8")
    print(f"{MAN_DIR}/ ({len(pages)} pages)")
