"""Closed sets of words orch writes (job.json, a plan's summary, messages) and reads back, as
enums whose members are those very words: a member equals its word, prints as it and goes
into JSON as it, so a record reads back as it was written.

The sets that belong to one folder live there (outcome's Role, plan's Destination, run's
StopProblem); the fan-out, which specs/, plan/, records/ and run/ all name, lives here.
"""

from __future__ import annotations

import sys
from enum import Enum

from orchestrator.errors import UsageError

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10 has no enum.StrEnum: the same, as far as orch uses it

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)


class Fanout(StrEnum):
    """What starts a job's node side."""

    PDSH = "pdsh"  # pdsh, over ssh
    SRUN = "srun"  # one Slurm step, inside the allocation


def fanout_named(word: str) -> Fanout:
    """The fan-out `--fanout` names; a word that names none is the user's mistake."""
    try:
        return Fanout(word)
    except ValueError:
        choices = ", ".join(Fanout)
        raise UsageError(f"unknown fan-out {word!r}", f"choose one of: {choices}") from None
