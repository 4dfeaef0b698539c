"""How orch writes a number of bytes for people: one format for every size it shows."""

from __future__ import annotations

_STEP = 1024
_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(count: float) -> str:
    """`512 B`, `3.0 KiB`, `949.1 MiB`, `11.0 GiB`: binary units, one decimal, the largest unit
    that keeps the number at 1 or more (and under 1024 once rounded)."""
    if abs(count) < _STEP:
        return f"{count:.0f} B"
    value = float(count)
    for unit in _UNITS:
        value /= _STEP
        if abs(round(value, 1)) < _STEP or unit == _UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable: the last unit always returns")
