"""How long a job may be quiet before orch looks for a hang, learned from its own pace. Pure.

With no `--hang-timeout`, the threshold comes from the gaps between the job's outputs
(any rank's line or progress frame): ten times the 95th percentile gap, never under a
floor. Until the job has shown a pace (MIN_GAPS gaps once a rank has shown a step: a
progress bar's count, a `step N` line) it is starting: imports, data preparation, the
rendezvous and a first compiled step may be quiet for long, and launchers print dozens of
lines before any step, so the start-up floor holds. A quiet spell a look found to be work (an
evaluation, a checkpoint) raises the threshold above it, so the next one is not looked at
as often. Either way, quiet is only a hang once a look finds no rank working
(outcome/quiet.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.specs.hang import FLOOR_S, START_FLOOR_S

PACE_FACTOR = 10.0  # times the 95th percentile gap between outputs
WORK_FACTOR = 1.5  # times the longest quiet spell a look found to be work
MIN_GAPS = 20  # gaps between outputs before the pace counts
_KEPT_GAPS = 2000  # the most recent gaps, for the percentile


@dataclass(frozen=True)
class Threshold:
    seconds: float
    source: str  # "given", "learned from N outputs", "start-up floor", "quiet work"

    def to_json(self) -> dict[str, object]:
        return {"seconds": round(self.seconds, 1), "source": self.source}


@dataclass(frozen=True)
class PaceSeed:
    """What an earlier attempt learned, for the next one to start from."""

    gap_p95: float | None = None
    longest_work: float = 0.0


@dataclass
class HangPace:
    """Fed every output's time and every quiet spell found working; says the threshold."""

    given: float | None = None  # --hang-timeout: fixed, nothing learned
    seed: PaceSeed = field(default_factory=PaceSeed)
    floor: float = FLOOR_S  # never less, whatever the pace
    start_floor: float = START_FLOOR_S  # before the job has shown a pace
    gaps: list[float] = field(default_factory=list)
    outputs: int = 0
    last_output_at: float | None = None
    longest_work: float = 0.0
    stepped: bool = False  # a rank has shown a step: the start-up is over
    # The percentile of the gaps as last sorted, and how many outputs it counted: the
    # verdict asks for the threshold at every event, the gaps change only with an output.
    _p95_of: tuple[int, float] = field(default=(-1, 0.0), repr=False)

    def __post_init__(self) -> None:
        self.longest_work = max(self.longest_work, self.seed.longest_work)

    def output(self, at: float, stepping: bool = True) -> None:
        """An output at `at`; `stepping`: a rank has shown a step by then. Gaps count from
        the first output after the first step on."""
        last = self.last_output_at
        if self.stepped and last is not None and at > last:
            self.gaps.append(at - last)
            del self.gaps[:-_KEPT_GAPS]
        self.last_output_at = at if last is None else max(at, last)
        self.stepped = self.stepped or stepping
        self.outputs += 1

    def worked(self, quiet_seconds: float) -> None:
        self.longest_work = max(self.longest_work, quiet_seconds)

    def gap_p95(self) -> float | None:
        if not self.stepped:
            return None
        if len(self.gaps) < MIN_GAPS:
            return self.seed.gap_p95
        if self._p95_of[0] != self.outputs:
            ordered = sorted(self.gaps)
            at = min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)
            self._p95_of = (self.outputs, ordered[at])
        return self._p95_of[1]

    def threshold(self) -> Threshold:
        if self.given is not None:
            return Threshold(self.given, "given")
        p95 = self.gap_p95()
        if p95 is None:
            candidates = [Threshold(self.start_floor, "start-up floor")]
        else:
            own = len(self.gaps) >= MIN_GAPS
            learned = f"learned from {self.outputs} outputs" if own else "an earlier attempt's pace"
            candidates = [Threshold(self.floor, "floor"), Threshold(PACE_FACTOR * p95, learned)]
        if self.longest_work:
            candidates.append(Threshold(WORK_FACTOR * self.longest_work, "quiet work seen"))
        return max(candidates, key=lambda t: t.seconds)

    def seed_for_next(self) -> PaceSeed:
        own = self.gap_p95() if len(self.gaps) >= MIN_GAPS else None
        return PaceSeed(own or self.seed.gap_p95, self.longest_work)
