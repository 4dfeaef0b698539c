"""How a job's hang is looked for (`--hang-timeout`, a recipe's `hang_timeout`): `auto`
(the default: a threshold learned from the job's own pace, outcome/pace.py), `off`, or a
fixed number of seconds (`600`, `10m`). Read from what the user typed, one wording for
what is wrong, before anything runs. Pure.
"""

from __future__ import annotations

from orchestrator.errors import UsageError
from orchestrator.specs.stop import duration_seconds

HANG_AUTO, HANG_OFF = "auto", "off"
HangTimeout = float | str  # seconds, HANG_AUTO or HANG_OFF


def hang_timeout_value(
    given: str | float | None, what: str = "--hang-timeout"
) -> HangTimeout | None:
    """`auto`, `off` or seconds (at least 1) from what was typed; None when nothing was."""
    if given is None:
        return None
    word = str(given).strip().lower()
    if word in (HANG_AUTO, HANG_OFF):
        return word
    try:
        seconds = duration_seconds(word, what)
    except UsageError:
        raise UsageError(f"{what} {given!r} is neither auto, off nor a duration",
                         "e.g. auto (learned from the job's pace), off, 600 or 10m") from None
    if seconds < 1:
        raise UsageError(f"{what} {given!r}: at least 1 second", "e.g. 600 or 10m")
    return seconds
