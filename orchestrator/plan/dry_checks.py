"""What a dry run checks on the head before it shows the plan: the training script is
there, and the runs directory can hold the job's record. Pure: the facts come in
(prepare/dry_run.py looks at the head), findings go out, each with what is wrong, the
fix, and the exit code the real launch would stop with (0: a warning, it would start)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import RecordError
from orchestrator.plan.launch_plan import LaunchPlan

RUNS_DIR_FIX = "use a runs directory of your own: --runs-dir DIR or ORCH_RUNS_DIR=DIR"
# The real launch stops on an unusable runs directory with orch's own error.
RECORD_EXIT = RecordError.exit_code  # as the real launch, which refuses to write there


@dataclass(frozen=True)
class RunsDirFacts:
    """The runs directory as the head sees it: `root` itself, or where it would be made
    (`existing`, the nearest folder above it that exists)."""

    root: str
    existing: str  # `root` when it exists
    writable: bool  # the user can make entries in `existing`
    not_own: str | None = None  # why `root` is no directory of the user's own (owner, mode)
    not_own_fix: str | None = None


@dataclass(frozen=True)
class HeadFacts:
    """What a dry run looked at on the head."""

    script_path: str  # the script as the head sees it (a relative one: in the workdir)
    script_exists: bool
    runs: RunsDirFacts


@dataclass(frozen=True)
class DryFinding:
    """One thing the dry run found: `exit_code` 0 for a warning, else the real launch's."""

    subject: str  # what it is about: "script", "runs directory"
    problem: str
    fix: str
    exit_code: int = 0

    @property
    def is_error(self) -> bool:
        return self.exit_code != 0

    def to_dict(self) -> dict[str, object]:
        level = "error" if self.is_error else "warning"
        return {"level": level, "subject": self.subject, "problem": self.problem,
                "fix": self.fix, "exit_code": self.exit_code}  # fmt: skip


def dry_run_findings(plan: LaunchPlan, facts: HeadFacts) -> tuple[DryFinding, ...]:
    """Every finding, errors first."""
    found = [*_runs_dir_findings(facts.runs), *_script_findings(plan, facts)]
    return tuple(sorted(found, key=lambda f: not f.is_error))


def dry_run_exit_code(findings: tuple[DryFinding, ...]) -> int:
    """0 when the launch would start (warnings alone pass), else the real launch's code."""
    return max((f.exit_code for f in findings), default=0)


def _script_findings(plan: LaunchPlan, facts: HeadFacts) -> list[DryFinding]:
    if facts.script_exists:
        return []
    # A warning only: the nodes may have the script where the head has not (no shared
    # filesystem); the pre-flight looks there before the real launch starts anything.
    script = plan.job.script
    return [DryFinding(
        "script",
        f"training script {script} does not exist on this machine ({facts.script_path})",
        f"check the path (a relative one is taken in the working directory {plan.workdir}, "
        "--workdir or the recipe's workdir); if only the nodes have it, "
        f"`orch doctor --hostfile F --script {script}` looks there",
    )]  # fmt: skip


def _runs_dir_findings(runs: RunsDirFacts) -> list[DryFinding]:
    if runs.not_own is not None:
        return [DryFinding("runs directory", runs.not_own, runs.not_own_fix or RUNS_DIR_FIX,
                           RECORD_EXIT)]  # fmt: skip
    if runs.writable:
        return []
    if runs.existing == runs.root:
        problem = (f"runs directory {runs.root} is not writable by you: the job's record "
                   "cannot be made there")  # fmt: skip
    else:
        problem = (f"runs directory {runs.root} does not exist, and {runs.existing} (where it "
                   "would be made) is not writable by you")  # fmt: skip
    return [DryFinding("runs directory", problem, RUNS_DIR_FIX, RECORD_EXIT)]
