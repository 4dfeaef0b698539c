"""A main port for a job that was given none: asked of node 0 over SSH, reserved there until
the launcher binds it (remote/ports.py), so jobs started together on the same nodes never
share one."""

from __future__ import annotations

import json
from collections.abc import Callable

from orchestrator.errors import OrchError
from orchestrator.plan.agent_command import port_command
from orchestrator.plan.launch_plan import LaunchPlan
from orchestrator.plan.ports import port_candidates
from orchestrator.remote.ports import DEFAULT_DIR
from orchestrator.specs.constants import CHOSEN_PORT_RANGE
from orchestrator.ssh import run_on_nodes

# On node 0, the user's own directory there (/tmp/orch-<uid>/ports, only the node knows the
# uid); one file per reserved port. Per user: a shared one could be locked, filled or hung.
RESERVATIONS_DIR = DEFAULT_DIR
RESERVATION_TTL_S = 900.0  # longer than any sync + pre-flight before the launcher binds


def choose_main_port(node: str, job_id: str, python: str, *, reserve: bool = True,
                     timeout: float = 15.0) -> int:  # fmt: skip
    """A port free on `node` (node 0) for this job; reserved for it unless `reserve` is
    False (doctor only looks). Raises OrchError naming the node when it cannot be asked."""
    ttl = RESERVATION_TTL_S if reserve else 0.0
    command = port_command(python, job_id, RESERVATIONS_DIR, ttl, port_candidates(job_id))
    [answer] = run_on_nodes([node], command, timeout=timeout, connect_timeout=timeout)
    low, high = CHOSEN_PORT_RANGE
    fix = f"give one with --main-port (orch picks from {low}-{high} when none is given)"
    if not answer.ok or answer.value is None:
        raise OrchError(f"{answer.problem or node}: could not pick a main port on it", fix)
    result = answer.value
    text = result.stdout.decode(errors="replace").strip()
    try:
        doc = json.loads(text.splitlines()[-1]) if text else {}
    except json.JSONDecodeError:
        doc = {}
    if isinstance(doc.get("port"), int):
        return int(doc["port"])
    said = doc.get("error") or result.stderr.decode(errors="replace").strip()[-300:]
    raise OrchError(f"{node}: could not pick a main port: {said or 'no answer'}", fix)


def plan_with_main_port(build: Callable[[int, bool], LaunchPlan], given: int | None,
                        job_id: str, *, dry_run: bool, preflight: bool) -> LaunchPlan:  # fmt: skip
    """The plan, built by `build(port, chosen)` with the given port, else one orch picks.

    The plan is built first with the first port orch would try, so a bad input is refused
    before any node is asked; a dry run stops there. Then node 0 says which port is free
    and reserves it. When node 0 cannot be asked and the pre-flight follows, the first
    candidate stands: the pre-flight names the node and the fix."""
    plan = build(given if given is not None else port_candidates(job_id)[0], given is None)
    if given is not None or dry_run:
        return plan
    try:
        port = choose_main_port(plan.main_host, job_id, plan.python)
    except OrchError:
        if not preflight:
            raise
        return plan
    return plan if port == plan.main_port else build(port, True)


def free_port_on(node: str, python: str) -> int | None:
    """A port a launch could pick on `node` now, reserving nothing (doctor checks it);
    None when the node cannot be asked (doctor's own checks say why)."""
    try:
        return choose_main_port(node, "doctor", python, reserve=False)
    except OrchError:
        return None
