"""The checks of options several commands share."""

from __future__ import annotations

import pytest

from orchestrator.errors import UsageError
from orchestrator.remote.channel import HEARTBEAT_S
from orchestrator.specs.options import AGENT_BEAT_S, MISSED_BEATS, check_heartbeat_timeout

pytestmark = pytest.mark.fast


def test_the_beat_the_check_counts_is_the_one_the_agents_send():
    assert AGENT_BEAT_S == HEARTBEAT_S


@pytest.mark.parametrize("seconds", [AGENT_BEAT_S * MISSED_BEATS, 10.0, 600.0])
def test_a_heartbeat_timeout_of_three_beats_or_more_is_taken(seconds):
    check_heartbeat_timeout(seconds)


def test_a_heartbeat_timeout_one_late_beat_would_trip_is_refused_with_the_least():
    with pytest.raises(UsageError) as refused:
        check_heartbeat_timeout(3.0)
    assert refused.value.message == "--heartbeat-timeout 3 is shorter than 6 s"
    assert "use 6 or more (the default is 10)" in refused.value.hint
