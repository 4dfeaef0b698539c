"""Progress over many nodes: shown on a terminal, counted from any thread; nothing at all
when stderr is not a terminal (CI logs, --json pipelines)."""

from __future__ import annotations

import io
import re
import threading

import pytest

from orchestrator.cli.nodes.progress import node_progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _shown(monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, results: list[bool]) -> str:
    monkeypatch.setattr("sys.stderr", stream)
    with node_progress(len(results), "checking nodes") as done:
        threads = [
            threading.Thread(target=done, args=(f"n{i}", ok)) for i, ok in enumerate(results)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())


def test_a_terminal_sees_how_many_nodes_answered_and_how_many_did_not(monkeypatch) -> None:
    text = _shown(monkeypatch, _Terminal(), [True, False, True, True])
    assert "checking nodes" in text
    assert "4/4" in text and "1 not answering" in text


def test_nothing_is_written_when_stderr_is_not_a_terminal(monkeypatch) -> None:
    assert _shown(monkeypatch, io.StringIO(), [True, True, False]) == ""
