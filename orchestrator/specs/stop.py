"""How a job is asked to stop and save: the stop signal every rank gets (`--stop-signal`,
a recipe's `stop_signal`), the grace the ranks have to exit by themselves (`--stop-grace`,
`stop_grace`), and the job's time limit (`--time-limit`, `time_limit`). Each read from what
the user typed with one wording for what is wrong, before anything runs. Pure.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from orchestrator.errors import UsageError

DEFAULT_STOP_SIGNAL = "SIGTERM"
# Long enough to write a large model's checkpoint to a shared filesystem; the launchers'
# own limit (30 s after their TERM) never starts: orch signals the ranks, not the launcher.
DEFAULT_STOP_GRACE_S = 120.0
# Signals a rank cannot catch, or that already mean something else to a process.
_REFUSED = frozenset({"SIGKILL", "SIGSTOP", "SIGCHLD", "SIGCONT", "SIGTSTP", "SIGTTIN",
                      "SIGTTOU", "SIGWINCH", "SIGURG", "SIGPIPE"})  # fmt: skip
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")


@dataclass(frozen=True)
class StopSettings:
    """What every stop of the job uses: the signal's name and the ranks' grace (seconds)."""

    signal: str = DEFAULT_STOP_SIGNAL
    grace: float = DEFAULT_STOP_GRACE_S

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.signal])


def signal_named(word: str, what: str = "--stop-signal") -> str:
    """The signal's name (`SIGTERM`) from `TERM`, `sigterm`, `SIGTERM` or `15`; a UsageError
    for a signal there is not, or one a rank cannot catch."""
    text = word.strip().upper()
    try:
        name = signal.Signals(int(text)).name if text.isdigit() else (
            signal.Signals[text if text.startswith("SIG") else f"SIG{text}"].name
        )  # fmt: skip
    except (KeyError, ValueError):
        raise UsageError(f"{what} {word!r} is not a signal",
                         "e.g. SIGTERM (the default), SIGUSR1 or SIGINT") from None  # fmt: skip
    if name in _REFUSED:
        raise UsageError(f"{what} {name}: a rank cannot handle it to save and exit",
                         "use SIGTERM (the default), SIGINT, SIGUSR1 or SIGUSR2")  # fmt: skip
    return name


def check_grace(seconds: float, what: str = "--stop-grace") -> float:
    """A grace is a positive number of seconds."""
    if not seconds > 0:
        raise UsageError(f"{what} {seconds:g}: the ranks' time to save must be more than 0 s",
                         "e.g. --stop-grace 120 (the default)")  # fmt: skip
    return float(seconds)


def duration_seconds(text: str | float, what: str = "--time-limit") -> float:
    """Seconds from `3600`, `90m`, `2h`, `1h30m`, `45s`, `1d`; a UsageError for anything
    else, or for no time at all."""
    word = str(text).strip().lower()
    parts = _PART.findall(word)
    if not word or "".join(f"{n}{u}" for n, u in parts) != word or (
        len(parts) > 1 and not all(unit for _number, unit in parts)
    ):
        raise UsageError(f"{what} {text!r} is not a duration",
                         "e.g. 3600 (seconds), 90m, 2h or 1h30m")  # fmt: skip
    seconds = sum(float(number) * _UNITS[unit or "s"] for number, unit in parts)
    if seconds <= 0:
        raise UsageError(f"{what} {text!r}: the job needs some time to run", "e.g. 90m or 2h")
    return seconds

