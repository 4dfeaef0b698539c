"""A main port for a job that was given none: asked of node 0 over SSH, reserved there until
the launcher binds it (remote/ports.py), so jobs started together on the same nodes never
share one."""

from __future__ import annotations

import json
from collections.abc import Callable

from orchestrator.errors import (
    NodesUnavailable,
    OrchError,
)
from orchestrator.nodes.transport import NodeTransport, SshTransport, plan_transport
from orchestrator.plan.agent_command import port_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.plan.ports import port_candidates
from orchestrator.remote.ports import own_dir_argument
from orchestrator.specs.constants import CHOSEN_PORT_RANGE

# On node 0, the reservations live in the user's own directory there (/tmp/orch-<uid>/ports,
# only the node knows the uid; or below the user's ORCH_NODE_ROOT): one file per reserved
# port. Per user: a shared one could be locked, filled or hung.
RESERVATION_TTL_S = 900.0  # longer than any sync + pre-flight before the launcher binds


def _ask(
    node: str,
    python: str,
    job_id: str,
    ttl: float,
    candidates: tuple[int, ...],
    timeout: float,
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> tuple[dict | None, str]:
    """Node 0's answer of the port program ({"port": N} or {"error": ...}); None and why when
    it could not be asked."""
    command = port_command(python, job_id, own_dir_argument(node_root), ttl, candidates)
    transport = transport or SshTransport()
    [answer] = transport.run([node], command, timeout=timeout, connect_timeout=timeout)
    if not answer.ok or answer.value is None:
        return None, answer.problem or f"{node}: no answer"
    result = answer.value
    text = result.stdout.decode(errors="replace").strip()
    try:
        doc = json.loads(text.splitlines()[-1]) if text else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or not (isinstance(doc.get("port"), int) or doc.get("error")):
        # The program itself did not run (no such interpreter, say): not an answer.
        said = result.stderr.decode(errors="replace").strip()[-300:] or "no answer"
        return None, f"{node}: {said}"
    return doc, ""


def choose_main_port(
    node: str,
    job_id: str,
    python: str,
    *,
    reserve: bool = True,
    timeout: float = 15.0,
    transport: NodeTransport | None = None,
    node_root: str = "",
) -> int:
    """A port free on `node` (node 0) for this job; reserved for it unless `reserve` is
    False (doctor only looks), in the user's own directory there (`node_root`: the user's
    ORCH_NODE_ROOT). Raises OrchError naming the node when it cannot be asked."""
    ttl = RESERVATION_TTL_S if reserve else 0.0
    doc, problem = _ask(node, python, job_id, ttl, port_candidates(job_id), timeout, transport,
                        node_root)  # fmt: skip
    low, high = CHOSEN_PORT_RANGE
    fix = f"give one with --main-port (orch picks from {low}-{high} when none is given)"
    if doc is None:
        raise NodesUnavailable(f"{problem} (could not pick a main port there)", fix)
    if isinstance(doc.get("port"), int):
        return int(doc["port"])
    raise NodesUnavailable(f"{node}: could not pick a main port: {doc['error']}", fix)


def plan_with_main_port(build: Callable[[int, bool], LaunchPlan], given: int | None,
                        job_id: str, *, dry_run: bool, preflight: bool) -> LaunchPlan:  # fmt: skip
    """The plan, built by `build(port, chosen)` with the given port, else one orch picks.

    The plan is built first with the first port orch would try, so a bad input is refused
    before any node is asked; a dry run stops there. Then node 0 says which port is free
    and reserves it. When node 0 cannot be asked and the pre-flight follows, the first
    candidate stands: the pre-flight names the node and the fix."""
    plan = build(given if given is not None else port_candidates(job_id)[0], given is None)
    if dry_run:
        return plan
    if given is not None:
        check_given_port(plan.main_host, given, plan.python, preflight=preflight,
                         transport=plan_transport(plan))  # fmt: skip
        return plan
    try:
        port = choose_main_port(plan.main_host, job_id, plan.python, node_root=plan.job.node_root,
                                transport=plan_transport(plan))  # fmt: skip
    except OrchError:
        if not preflight:
            raise
        return plan
    return plan if port == plan.main_port else build(port, True)


def check_given_port(node: str, port: int, python: str, *, preflight: bool,
                     transport: NodeTransport | None = None) -> None:  # fmt: skip
    """A main port the user gave is free on node 0 before anything starts; taken, the error
    names who holds it. When node 0 cannot be asked, the pre-flight (if it follows) says why."""
    doc, problem = _ask(node, python, "given", 0.0, (port,), 15.0, transport)
    if doc is None:
        if preflight:
            return
        raise NodesUnavailable(f"{problem} (could not check main port {port} there)",
                        "check that the node answers: orch doctor")  # fmt: skip
    if doc.get("port") != port:
        raise OrchError(
            f"{node}: main port {port} cannot be this job's: {doc.get('error')}",
            "give another with --main-port, or none and orch picks a free one",
        )


def free_port_on(node: str, python: str, transport: NodeTransport | None = None) -> int | None:
    """A port a launch could pick on `node` now, reserving nothing (doctor checks it);
    None when the node cannot be asked (doctor's own checks say why)."""
    try:
        return choose_main_port(node, "doctor", python, reserve=False, transport=transport)
    except OrchError:
        return None
