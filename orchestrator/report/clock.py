"""Moments as the page writes them: seconds after the job's start on the head's clock."""

from __future__ import annotations


def since(start: float | None, t: float | None) -> str:
    """A moment as seconds after the job's start: "+12.3s"; "-" when unknown."""
    if start is None or t is None:
        return "-"
    return f"+{t - start:.1f}s"
