"""Slurm's SIGTERM to an agent inside a step (a preemption, `scancel`) is the head's to act
on: the agent tells it once and stops its node itself only when no stop begins there."""

from __future__ import annotations

import signal

from orchestrator.remote.sweep import HEAD_DECIDES_S, SlurmTerm

IN_STEP = {"SLURM_STEP_ID": "0"}


def test_the_first_sigterm_in_a_step_is_kept_and_said_once():
    term = SlurmTerm(IN_STEP)
    assert term.take(signal.SIGTERM, now=100.0)
    assert term.to_say() and not term.to_say()
    assert not term.take(signal.SIGTERM, now=101.0)  # a second one: the agent stops at once


def test_other_signals_and_sigterm_outside_a_step_are_the_agents_own():
    assert not SlurmTerm(IN_STEP).take(signal.SIGINT, now=0.0)
    assert not SlurmTerm(IN_STEP).take(signal.SIGHUP, now=0.0)
    outside = SlurmTerm({})  # over ssh: a TERM is the head's teardown or the user's
    assert not outside.take(signal.SIGTERM, now=0.0) and not outside.to_say()


def test_the_agent_stops_its_node_only_when_the_head_begins_no_stop_in_time():
    term = SlurmTerm(IN_STEP)
    assert not term.overdue(stop_begun=False, now=1e6)  # no signal: nothing to do
    term.take(signal.SIGTERM, now=100.0)
    assert not term.overdue(stop_begun=False, now=100.0 + HEAD_DECIDES_S - 1)
    assert term.overdue(stop_begun=False, now=100.0 + HEAD_DECIDES_S + 1)
    # The head's stop reached the node: its grace and teardown follow, not the agent's.
    assert not term.overdue(stop_begun=True, now=100.0 + 10 * HEAD_DECIDES_S)
