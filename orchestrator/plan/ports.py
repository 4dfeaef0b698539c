"""Which ports a job's main port is picked from, in which order. Pure.

Each job starts at its own place in CHOSEN_PORT_RANGE (from its id), so two jobs started
at once try different ports first; node 0 then says which is free (prepare/ports.py).
"""

from __future__ import annotations

import hashlib

from orchestrator.specs.constants import CHOSEN_PORT_RANGE

CANDIDATES = 64  # tried in order on node 0; more than enough unless the range is full


def port_candidates(job_id: str, count: int = CANDIDATES) -> tuple[int, ...]:
    low, high = CHOSEN_PORT_RANGE
    span = high - low + 1
    start = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big") % span
    return tuple(low + (start + step) % span for step in range(min(count, span)))
