"""How a job's hang is looked for (`--hang-timeout`, a recipe's `hang_timeout`): `auto`
(the default: a threshold learned from the job's own pace, outcome/pace.py), `auto:FLOOR`
or `auto:FLOOR:START` (learned, never under FLOOR, nor under START before the job's first
step), `off`, or a fixed number of seconds (`600`, `10m`). Read from what the user typed,
one wording for what is wrong, before anything runs. Pure.
"""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.specs.stop import duration_seconds

HANG_AUTO, HANG_OFF = "auto", "off"
# auto's floors: the learned threshold is never less (a hang is looked for no sooner)
FLOOR_S = 120.0  # once the job has shown its pace
START_FLOOR_S = 600.0  # before: imports, data preparation, a first compiled step
HangTimeout = float | str  # seconds, HANG_OFF, HANG_AUTO or "auto:<floor>:<start floor>"
_EXAMPLES = "e.g. auto (learned from the job's pace), auto:1m:20m, off, 600 or 10m"


def hang_timeout_value(
    given: str | float | None, what: str = "--hang-timeout"
) -> HangTimeout | None:
    """`auto` (with its floors when given), `off` or seconds (at least 1) from what was
    typed; None when nothing was."""
    if given is None:
        return None
    word = str(given).strip().lower()
    if word == HANG_OFF:
        return word
    if word == HANG_AUTO or word.startswith(HANG_AUTO + ":"):
        return _learned_value(word, given, what)
    try:
        seconds = duration_seconds(word, what)
    except UsageError:
        raise UsageError(f"{what} {given!r} is neither auto, off nor a duration",
                         _EXAMPLES) from None  # fmt: skip
    if seconds < 1:
        raise UsageError(f"{what} {given!r}: at least 1 second", "e.g. 600 or 10m")
    return seconds


def _learned_value(word: str, given: str | float, what: str) -> str:
    """`auto`, or `auto:<floor>:<start floor>` in seconds, from `auto[:FLOOR[:START]]`."""
    parts = word.split(":")[1:]
    if not parts:
        return HANG_AUTO
    if len(parts) > 2 or not all(parts):
        raise UsageError(f"{what} {given!r}: auto takes at most two floors, auto:FLOOR:START",
                         _EXAMPLES)  # fmt: skip
    try:
        floors = [duration_seconds(part, what) for part in parts]
    except UsageError:
        raise UsageError(f"{what} {given!r}: a floor is not a duration", _EXAMPLES) from None
    if min(floors) < 1:
        raise UsageError(f"{what} {given!r}: a floor of at least 1 second", _EXAMPLES)
    floor = floors[0]
    start = floors[1] if len(floors) > 1 else max(floor, START_FLOOR_S)
    return f"{HANG_AUTO}:{floor:.12g}:{start:.12g}"


def learned_floors(value: HangTimeout) -> tuple[float, float] | None:
    """(floor, start-up floor) when `value` is learned from the job's pace; None when it is
    fixed or off."""
    if not isinstance(value, str) or not (value == HANG_AUTO or value.startswith("auto:")):
        return None
    if value == HANG_AUTO:
        return FLOOR_S, START_FLOOR_S
    _, floor, start = value.split(":")
    return float(floor), float(start)
