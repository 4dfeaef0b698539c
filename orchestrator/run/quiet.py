"""A look at a quiet job's ranks, taken in the background while the launch loop reads on.

When the job has been quiet beyond its hang timeout, the verdict asks for a look
(outcome/verdict.py `Decision.look`): every node runs remote/look.py at once, through the
job's own transport (ssh or srun), and the answers become one `QuietLooked` event for the
verdict: working (the silence counts again) or hung (the teardown). A node that does not
answer is said in the finding; the look never raises.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from orchestrator.errors import OrchError
from orchestrator.nodes.transport import NodeTransport, plan_transport
from orchestrator.outcome.events import QuietLooked
from orchestrator.outcome.quiet import LauncherSample, QuietFinding, RankSample, judge
from orchestrator.pernode import NodeResult
from orchestrator.plan.agent_command import look_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.run.background import OneAtATime
from orchestrator.ssh import CommandResult
from orchestrator.stacks.model import RankStacks, node_report

_CONNECT_TIMEOUT_S = 10.0


class QuietLook:
    """At most one look at a time; `events()` hands over what a finished one found."""

    def __init__(self, plan: LaunchPlan, seconds: float, timeout: float) -> None:
        self.plan, self.seconds, self.timeout = plan, seconds, timeout
        self._looks: OneAtATime[QuietLooked] = OneAtATime()

    def start(self, asked_at: float) -> None:
        def work() -> QuietLooked:
            finding = look_at_ranks(self.plan, self.seconds, self.timeout)
            return QuietLooked(finding, asked_at, time.monotonic())

        self._looks.start(work)

    def events(self) -> list[QuietLooked]:
        return self._looks.results()


def look_at_ranks(
    plan: LaunchPlan, seconds: float, timeout: float, transport: NodeTransport | None = None
) -> QuietFinding:
    """Every node's ranks over `seconds`, judged; each node's answer bounded by `timeout`
    beyond that."""

    def command(node: str) -> str:
        return look_command(plan.python, plan.job_id, node, seconds, plan.job.node_root)

    try:
        answers = (transport or plan_transport(plan)).run(
            list(plan.hosts), command, timeout=seconds + timeout,
            connect_timeout=min(timeout, _CONNECT_TIMEOUT_S),
        )  # fmt: skip
    except (OrchError, OSError) as err:  # a look is a help: what it meets is said, not raised
        return QuietFinding((), seconds, f"the look failed: {err}")
    return findings_of(answers, plan.python, plan.job_id, seconds)


def findings_of(
    answers: Sequence[NodeResult[CommandResult]], python: str, job_id: str, seconds: float
) -> QuietFinding:
    """Every node's look document as one judgement; what could not be read, said."""
    samples: list[RankSample] = []
    launchers: list[LauncherSample] = []
    problems: list[str] = []
    for answer in answers:
        if not answer.ok or answer.value is None or answer.value.exit_code != 0:
            problems.append(f"{answer.node} did not answer ({answer.problem or 'no answer'})")
            continue
        try:
            doc = json.loads(answer.value.stdout.decode(errors="replace"))
            samples += node_samples(answer.node, doc, python, job_id, seconds)
            launchers += node_launcher(answer.node, doc)
        except (ValueError, KeyError, TypeError) as err:
            problems.append(f"{answer.node}: unreadable look ({err})")
    return judge(samples, "; ".join(problems) or None, launchers)


def node_launcher(node: str, doc: dict) -> list[LauncherSample]:
    """A node with no rank: what its launcher did, when the look read it."""
    found = doc.get("launcher")
    if not isinstance(found, dict) or not found.get("processes"):
        return []
    return [LauncherSample(node, float(found.get("seconds") or 0.0), found.get("cpu"),
                           found.get("io"), int(found["processes"]))]  # fmt: skip


def node_samples(node: str, doc: dict, python: str, job_id: str,
                 seconds: float) -> list[RankSample]:  # fmt: skip
    """One node's look document (remote/look.py) as a sample per rank."""
    dumps = [node_report(node, d, python, job_id) for d in doc.get("stacks", ())]
    stacks: list[dict[int, RankStacks]] = [{r.rank: r for r in d.ranks} for d in dumps]
    first, last, *_ = [*stacks, {}, {}]
    return [
        RankSample(
            rank=int(item["rank"]), node=node, seconds=float(item.get("seconds") or seconds),
            cpu=item.get("cpu"), io=item.get("io"), state=item.get("state"),
            stacks=(first.get(int(item["rank"])), last.get(int(item["rank"]))),
        )
        for item in doc.get("ranks", ())
    ]  # fmt: skip
