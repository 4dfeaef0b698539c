"""Whether a quiet job hangs, for the verdict (outcome/verdict.py). Pure.

The threshold comes from the job's pace (outcome/pace.py) or is given. Quiet is a hang only
once a look at every rank (outcome/quiet.py) finds none working; the look is asked for a few
seconds before the quiet reaches the threshold (LOOK_LEAD_S, at most a tenth of it), so that
a hang is decided when the threshold is reached, not a look later. A rank's output after
the look was asked for makes the look count for nothing; a look that found a rank working
counts the silence again from its end and raises the learned threshold above the spell.
"""

from __future__ import annotations

from orchestrator.outcome.events import QuietLooked, WatchSettings
from orchestrator.outcome.hang import hang_found
from orchestrator.outcome.pace import HangPace, Threshold
from orchestrator.outcome.states import HANG_EXIT_CODE, Failure, FailureKind

LOOK_LEAD_S = 3.0  # beyond the look's own seconds: ssh, the node's program, two stack dumps
LEAD_SHARE = 0.1  # of the threshold, at most


def look_lead(threshold: float, look_seconds: float) -> float:
    """How long before the threshold the look is asked for."""
    if look_seconds <= 0:
        return 0.0
    return min(look_seconds + LOOK_LEAD_S, LEAD_SHARE * threshold)


class HangWatch:
    """Fed the job's outputs and the looks' findings; `hung(now, ...)` says when it hangs."""

    def __init__(self, settings: WatchSettings) -> None:
        self.settings = settings
        self.pace = HangPace(settings.hang_timeout, settings.pace_seed, *settings.hang_floors)
        self.look_asked_at: float | None = None  # a look at the quiet job is under way
        self.look_wanted = False  # the verdict's next decision asks for it
        self.hung_finding: QuietLooked | None = None  # the look that found no rank working
        self._inconclusive = 0  # looks in a row that could not read the whole job
        self._next_look_at = 0.0  # an inconclusive look is taken again after a pause
        self.quiet_work: list[QuietLooked] = []  # looks that found a quiet job working

    def output(self, at: float, *, stepping: bool) -> None:
        self.pace.output(at, stepping=stepping)
        found = self.hung_finding
        if found is not None and at > found.asked_at:
            self.hung_finding = None  # a rank spoke before the threshold: not hung after all

    def looked(self, event: QuietLooked, last_output_at: float | None,
               quiet_since: float | None) -> None:  # fmt: skip
        """A look's finding; `quiet_since`: when the job last showed life, as the verdict
        counts it."""
        self.look_asked_at = None
        if last_output_at is not None and last_output_at > event.asked_at:
            return  # a rank spoke meanwhile: the quiet it looked at is over
        if not event.finding.working and event.finding.problem and self._inconclusive < 2:
            self._inconclusive += 1  # part of the job unread: a rank there may be working
            self._next_look_at = event.at + self.settings.look_again_after
            return
        self._inconclusive = 0
        if event.finding.working:
            # Busy, not hung: the silence counts again from here, a whole threshold long.
            self.quiet_work.append(event)
            self.pace.worked(event.at - (event.asked_at if quiet_since is None else quiet_since))
        else:
            self.hung_finding = event

    @property
    def threshold(self) -> Threshold | None:
        """How long the job may be quiet with no rank working, and where that came from;
        None when hangs are not looked for."""
        if self.settings.hang_timeout is None and not self.settings.hang_learned:
            return None
        return self.pace.threshold()

    def record(self) -> dict[str, object] | None:
        """For the record: the threshold in force at the end, where it came from, and what
        the looks that found a quiet job working saw (the last few)."""
        threshold = self.threshold
        if threshold is None:
            return None
        work = [looked.finding.summary() for looked in self.quiet_work[-5:]]
        return {**threshold.to_json(), "quiet_work": work}

    def hung(self, now: float, quiet_since: float | None, *, finished: bool) -> Failure | None:
        """The hang, once the job has been quiet beyond the threshold and a look found no
        rank working; meanwhile asks for that look (`look_wanted`). `finished`: every rank
        is done, which is quiet, not hung."""
        threshold = self.threshold
        if threshold is None or quiet_since is None or finished:
            return None
        worked_at = max((looked.at for looked in self.quiet_work), default=quiet_since)
        quiet = now - max(quiet_since, worked_at)
        limit, look_seconds = threshold.seconds, self.settings.look_seconds
        if quiet <= limit - look_lead(limit, look_seconds):
            return None
        beyond = quiet > limit
        said = f"hang: no rank wrote anything for {now - quiet_since:.0f} s{_beyond(threshold)}"
        if look_seconds <= 0:
            return Failure("", said, HANG_EXIT_CODE, kind=FailureKind.HANG) if beyond else None
        if self.hung_finding is not None:
            return hang_found(said, self.hung_finding.finding) if beyond else None
        if self.look_asked_at is None:
            if now >= self._next_look_at:
                self.look_asked_at, self.look_wanted = now, True
        elif now - self.look_asked_at > self.settings.look_timeout:
            waited = now - self.look_asked_at
            reason = f"{said}; a look at the ranks gave no answer in {waited:.0f} s"
            return Failure("", reason, HANG_EXIT_CODE, kind=FailureKind.HANG)
        return None


def _beyond(threshold: Threshold) -> str:
    """Which threshold the silence went beyond, when it was not given."""
    if threshold.source == "given":
        return ""
    return f" (beyond {threshold.seconds:.0f} s: {threshold.source})"
