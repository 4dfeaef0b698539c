"""What an agent sends to the head, kept in memory: for tests of the agent's parts that take
the head's channel (the ranks' streams, their ends)."""

from __future__ import annotations

from orchestrator.remote import logwire


class RecordingHead:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.line_max: int | None = None  # as a channel under pdsh

    def send(self, line: bytes) -> None:
        self.lines.append(line)

    def control(self, kind: str, **fields: object) -> None:
        self.send(logwire.encode_control(kind, **fields))
