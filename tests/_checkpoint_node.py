"""Helpers for the checkpoint program's steps run in process (tests/remote/test_checkpoint_*):
the two nodes of a copy are two threads on loopback, each with its own directories below the
test's tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.remote.checkpoint_transfer import receive, send
from orchestrator.remote.envpush_relay import Hop

HOP = Hop("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210")
OTHER_HOP = Hop("00112233445566778899aabbccddeeff", "ffeeddccbbaa99887766554433221100")
JOB = "job-7"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tree(top: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        (top / path).parent.mkdir(parents=True, exist_ok=True)
        (top / path).write_bytes(data)


def every_file(top: Path) -> dict[str, bytes]:
    return {p.relative_to(top).as_posix(): p.read_bytes()
            for p in sorted(top.rglob("*")) if p.is_file()}  # fmt: skip


def copies_of(node_root: Path) -> Path:
    """The job's copies on a node whose orch directory is `node_root`."""
    return node_root / "checkpoints" / JOB


class Talking:
    """A step that talks in lines (receive, stage), run in a thread as its node would run
    it: the lines it said, the lines told to it, its answer."""

    def __init__(self, step: Callable[..., dict[str, Any]], request: dict[str, Any]) -> None:
        self.said: queue.Queue[dict[str, Any]] = queue.Queue()
        self._told: queue.Queue[str] = queue.Queue()
        self._answer: dict[str, Any] = {}

        def run() -> None:
            self._answer.update(step(request, self._told.get, self.said.put))

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def next_line(self) -> dict[str, Any]:
        return self.said.get(timeout=30)

    def tell(self, doc: dict[str, Any]) -> None:
        self._told.put(json.dumps(doc) + "\n")

    def answer(self) -> dict[str, Any]:
        self._thread.join(60)
        assert not self._thread.is_alive()
        return self._answer


def send_files(top: Path, node_root: Path, port: int, paths: list[str], hop: Hop = HOP,
               bandwidth: int = 0, source: str = "dir", entry: str = "global_step10",
               writer: str = "n1") -> dict[str, Any]:  # fmt: skip
    request = {"dir": str(top), "job_id": JOB, "node_root": str(node_root), "entry": entry,
               "writer": writer, "files": [{"path": path, "from": source} for path in paths],
               "host": "127.0.0.1", "port": port, "hop": hop.to_dict(),
               "bandwidth": bandwidth}  # fmt: skip
    return send(request, lower=lambda: False)  # the test's own priority stays as it is


def receive_part(node_root: Path, files: dict[str, bytes], margin: int = 0) -> Talking:
    listed = [{"path": path, "size": len(data)} for path, data in files.items()]
    request = {"job_id": JOB, "node_root": str(node_root), "entry": "global_step10",
               "writer": "n1", "node": "n2", "free_margin": margin, "files": listed}  # fmt: skip
    return Talking(receive, request)


PART = {"global_step10/mp_rank_00_model_states.pt": os.urandom(1 << 20),
        "global_step10/zero_pp_rank_0_optim_states.pt": b"optim" * 1000}  # fmt: skip

