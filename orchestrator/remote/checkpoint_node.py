"""Checkpoints that follow the job, on a node: the checkpoint program. What the job's
checkpoint directory (PATH, `--checkpoint-dir`) holds, copies of other nodes' checkpoints
sent and received, a whole checkpoint put back into PATH before a restart, and copies no
longer needed removed.

Run inline by the head (`python -c <shipped source> STEP`), with its parts loaded beside it
(CHECKPOINT_PARTS): one JSON request line on stdin, JSON lines on stdout, the last one the
answer; a failure is {"ok": false, "error"} naming the node, the path and what to do
(checkpoint_step.py). The steps, one part each:

- scan, prune: what the node holds for the job (checkpoint_scan.py); `scans` answers one
  scan per request line until stdin ends, for the scans repeated every few seconds while
  a job runs (no shell and no Python started per scan);
- send, receive: a part copied from node to node (checkpoint_transfer.py, over the wire of
  checkpoint_stream.py);
- stage: a whole checkpoint into PATH before a restart (checkpoint_stage.py);

all of them keeping their copies where checkpoint_places.py says, in orch's own directory on
the node, never in PATH. STANDARD LIBRARY ONLY.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from typing import Any

try:  # on a node, loaded beside this program
    import orch_checkpoint_scan as scanning
    import orch_checkpoint_stage as staging
    import orch_checkpoint_step as steps
    import orch_checkpoint_transfer as transfer
except ImportError:
    from orchestrator.remote import checkpoint_scan as scanning
    from orchestrator.remote import checkpoint_stage as staging
    from orchestrator.remote import checkpoint_step as steps
    from orchestrator.remote import checkpoint_transfer as transfer

# The remote modules shipped before this program, in import order (remote/__init__.py).
CHECKPOINT_PARTS = ("owned", "filesystem", "envpush_relay", "checkpoint_stream",
                    "checkpoint_step", "checkpoint_places", "checkpoint_scan",
                    "checkpoint_transfer", "checkpoint_stage")  # fmt: skip


def _say(doc: steps.Answer) -> None:
    with contextlib.suppress(OSError):  # the head may be gone
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


def _route_then_watch(gone: threading.Event) -> steps.ReadLine:
    """What reads the route line from stdin; after it, stdin's end only says the head went
    away (`gone`)."""

    def watch() -> None:
        sys.stdin.read()
        gone.set()

    def read_line() -> str:
        line = sys.stdin.readline()
        threading.Thread(target=watch, daemon=True).start()
        return line

    return read_line


def _run(step: str, request: Any) -> steps.Answer:
    if not isinstance(request, dict):
        return {"ok": False, "error": f"on {socket.gethostname()}: no request came on stdin"}
    if step in ("scan", "prune"):
        return scanning.scan(request) if step == "scan" else scanning.prune(request)
    if step == "send":
        return transfer.send(request)
    gone = threading.Event()
    talk = transfer.receive if step == "receive" else staging.stage
    return talk(request, _route_then_watch(gone), _say, gone)


def _answer(step: str, line: str) -> steps.Answer:
    try:
        return _run(step, json.loads(line or "null"))
    except Exception as err:  # the head reads one JSON line, never a traceback
        return {"ok": False, "error": f"on {socket.gethostname()}: {step} failed: "
                f"{type(err).__name__}: {err}"}  # fmt: skip


def main(argv: list[str]) -> int:
    step = argv[0] if argv else ""
    if step == "scans":
        for line in iter(sys.stdin.readline, ""):  # a line at a time, until the head closes it
            _say(_answer("scan", line))
        return 0
    if step not in ("scan", "send", "receive", "stage", "prune"):
        _say({"ok": False, "error": f"unknown step {step!r}: scan, scans, send, receive, "
              "stage or prune (run a matching orch)"})  # fmt: skip
        return 2
    answer = _answer(step, sys.stdin.readline())
    _say(answer)
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
