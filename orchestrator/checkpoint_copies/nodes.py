"""The checkpoint program's steps run on nodes from the head (remote/checkpoint_node.py): a
scan of every node at once, a copy of one part from its writer to another node, a node's
staging of a whole checkpoint from the nodes that hold its files, a prune.

The bytes of a copy go from node to node over TCP, never through the head: the head starts
the receiving end, hears its port, gives both ends the link's secrets (a Hop: the sender
presents one, the receiver answers the other) and waits for both answers. Every step
answers one JSON document; a node that cannot be reached or answers nonsense is a problem
said with the node's name, never an exception.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.checkpoints.model import NodeScan
from orchestrator.checkpoints.placement import CopyOrder
from orchestrator.checkpoints.staging import Fetch, Restore
from orchestrator.nodes.transport import NodeTransport, StartedCommand
from orchestrator.pernode import NodeResult, failed, for_each_node, succeeded
from orchestrator.plan.agent_command import program_command
from orchestrator.remote.checkpoint_node import CHECKPOINT_PARTS
from orchestrator.remote.envpush_relay import Hop
from orchestrator.specs.checkpoints import CheckpointSettings

SCAN_TIMEOUT_S = 60.0  # a scan lists PATH and orch's copies: no hashing
HASH_TIMEOUT_S = 3600.0  # a scan that reads the job's last checkpoints whole, at its end
CONNECT_TIMEOUT_S = 15.0
READY_TIMEOUT_S = 30.0  # a receiving end's port, or a staging node's list of what it lacks
# A copy's bytes at the bandwidth cap, plus this: a part of 10 GB at 200 MB/s is 50 s.
COPY_SLACK_S = 300.0
FREE_MARGIN_BYTES = 1 << 30  # left free on a node's disk by a copy or a staging
# The nodes that send a staging node the files it lacks: {source: what each sends}.
Senders = Callable[[Sequence[str]], Mapping[str, Sequence[Fetch]]]


@dataclass(frozen=True)
class Copied:
    """One part copied (or not) to one node: the bytes sent and each file's sha256 as the
    sender read it; `problem` when nothing was kept."""

    order: CopyOrder
    bytes: int = 0
    sha256: Mapping[str, str] | None = None
    problem: str | None = None


@dataclass(frozen=True)
class Staged:
    """A node's staging of a restored checkpoint: what it received and what it already had."""

    node: str
    received_bytes: int = 0
    received_files: int = 0
    reused_files: int = 0
    problem: str | None = None
    set_aside: tuple[str, ...] = ()  # newer entries moved out of the framework's sight


class _Scanners:
    """One scanning program left running on each node (the checkpoint program's `scans`
    step) for the scans repeated every few seconds while a job runs: a program started per
    scan would cost each node a shell and a Python start every time, CPU the ranks beside it
    lose. A scanner that fails (gone, late, garbled) is closed and the scan asked once of a
    new one."""

    def __init__(self, transport: NodeTransport, command: str) -> None:
        self.transport, self.command = transport, command
        self._open: dict[str, StartedCommand] = {}
        self._lock = threading.Lock()

    def ask(self, node: str, request: bytes, timeout: float) -> NodeResult[dict[str, Any]]:
        problem = ""
        for _ in range(2):
            with self._lock:
                scanner = self._open.pop(node, None)
            if scanner is None:
                started = self.transport.start(node, self.command, timeout=CONNECT_TIMEOUT_S)
                if started.value is None:
                    problem = started.problem or "the scanner did not start"
                    continue
                scanner = started.value
            try:
                scanner.send(request)
                answer = _answer(scanner.read_line(timeout))
            except OSError as err:
                answer, problem = None, str(err) or type(err).__name__
            if answer is None:
                problem = problem or _why_ended(scanner, timeout)
                scanner.close()
                continue
            with self._lock:
                self._open[node] = scanner
            return succeeded(node, answer)
        return failed(node, problem if node in problem else f"{node}: {problem}")

    def close(self) -> None:
        with self._lock:
            scanners, self._open = list(self._open.values()), {}
        for scanner in scanners:
            with contextlib.suppress(Exception):  # a dead connection: nothing to keep
                scanner.close()


def _why_ended(scanner: StartedCommand, timeout: float) -> str:
    """Why a scanner gave no answer: what it said on stderr as it ended, or that it was
    late."""
    ended = scanner.wait(2.0)
    if ended.value is None:
        return f"no answer within {timeout:.0f} s"
    return str(_last_answer(b"", ended.value.stderr).get("error"))


class CheckpointNodes:
    """The job's checkpoint directory on its nodes, and the way to reach them."""

    def __init__(self, transport: NodeTransport, python: str, job_id: str,
                 settings: CheckpointSettings, node_root: str = "") -> None:  # fmt: skip
        self.transport, self.python, self.job_id = transport, python, job_id
        self.settings, self.node_root = settings, node_root
        self._scanners = _Scanners(transport, checkpoint_command(python, "scans"))

    def close(self) -> None:
        """The scanners closed (after an attempt: its nodes may not all be kept)."""
        self._scanners.close()

    def _request(self, node: str, **fields: Any) -> dict[str, Any]:
        return {"dir": self.settings.dir, "job_id": self.job_id, "node_root": self.node_root,
                "node": node, **fields}  # fmt: skip

    # -- scan ---------------------------------------------------------------------------
    def scan(self, nodes: Sequence[str], **fields: Any) -> dict[str, NodeResult[NodeScan]]:
        """Every node's checkpoint directory and copies, at once: {node: its scan, or why
        there is none}. `fields`: the scan's options (create, write_marker, marker, hash:
        the entries whose files' sha256 it gives)."""
        found = for_each_node(nodes, lambda node: self._scan_one(node, fields))
        return {result.node: result for result in found}

    def _scan_one(self, node: str, fields: Mapping[str, Any]) -> NodeResult[NodeScan]:
        request = self._request(node, **fields)
        timeout = HASH_TIMEOUT_S if fields.get("hash") else SCAN_TIMEOUT_S
        result = self._scanners.ask(node, _line(request), timeout)
        answer = result.value
        if answer is None:
            return failed(node, result.problem or f"{node}: no answer", result.hint, result.kind)
        if not answer.get("ok"):
            return failed(node, str(answer.get("error") or f"{node}: the scan failed"))
        try:
            return succeeded(node, NodeScan.from_dict(answer))
        except ValueError as err:
            return failed(node, str(err))

    # -- copy ---------------------------------------------------------------------------
    def copy(self, order: CopyOrder) -> Copied:
        """`order.writer`'s part copied from its source into orch's copies directory on its
        destination, node to node; the receiving end keeps it only when whole."""
        files = [{"path": f.path, "size": f.size} for f in order.files]
        receiving = self._started(order.destination, "receive", self._request(
            order.destination, entry=order.entry, writer=order.writer, files=files,
            free_margin=FREE_MARGIN_BYTES))  # fmt: skip
        if isinstance(receiving, str):
            return Copied(order, problem=receiving)
        process, port = receiving
        hop = Hop.new()
        try:
            process.send(_line({"hop": hop.to_dict()}))
            sent = self._send(order.source, order.entry, order.writer,
                              [{"path": f.path, "from": "dir"} for f in order.files],
                              order.destination, port, hop, _timeout(order.size, self.settings))
            kept = _final_answer(process, _timeout(order.size, self.settings))
        finally:
            process.close()
        if not sent.get("ok"):
            return Copied(order, problem=str(sent.get("error") or "the send failed"))
        if not kept.get("ok"):
            return Copied(order, problem=str(kept.get("error") or "the copy was not kept"))
        return Copied(order, int(sent.get("bytes") or 0), dict(sent.get("sha256") or {}))

    def _send(self, source: str, entry: str, writer: str, files: list[dict[str, Any]],
              host: str, port: int, hop: Hop, timeout: float) -> dict[str, Any]:  # fmt: skip
        request = self._request(source, entry=entry, writer=writer, files=files, host=host,
                                port=port, hop=hop.to_dict(),
                                bandwidth=self.settings.bandwidth)  # fmt: skip
        [result] = self.transport.run(
            [source], checkpoint_command(self.python, "send"), timeout=timeout,
            connect_timeout=CONNECT_TIMEOUT_S, stdin=_line(request),
        )  # fmt: skip
        if result.value is None:
            return {"ok": False, "error": result.problem or f"{source}: no answer"}
        return _last_answer(result.value.stdout, result.value.stderr)

    def _started(self, node: str, step: str,
                 request: Mapping[str, Any]) -> tuple[StartedCommand, int] | str:  # fmt: skip
        """A receiving step started on `node` and listening: (it, its port), or the problem."""
        started = self.transport.start(node, checkpoint_command(self.python, step),
                                       timeout=CONNECT_TIMEOUT_S)  # fmt: skip
        if started.value is None:
            return started.problem or f"{node}: cannot start the checkpoint program"
        process = started.value
        try:
            process.send(_line(request))
        except OSError as err:
            process.close()
            return f"{node}: {err}"
        said = _answer(process.read_line(READY_TIMEOUT_S))
        if said is None or not said.get("ready"):
            process.close()
            return str((said or {}).get("error") or f"{node}: the {step} step did not start")
        return process, int(said["port"])

    # -- stage --------------------------------------------------------------------------
    def stage(self, node: str, restore: Restore, senders: Senders,
              set_aside: Sequence[str] = ()) -> Staged:  # fmt: skip
        """`restore`'s checkpoint put whole into the checkpoint directory on `node`: the
        files it says it lacks come from the nodes `senders` names for them; the entries
        `set_aside` (newer, not whole) moved out of the way. Returns what was received and
        reused."""
        request = self._request(node, entry=restore.chosen, kind=restore.kind, files=[
            {"path": f.path, "size": f.size, "sha256": f.sha256} for f in restore.files
        ], write=dict(restore.pointers), free_margin=FREE_MARGIN_BYTES,
            set_aside=list(set_aside))  # fmt: skip
        started = self.transport.start(node, checkpoint_command(self.python, "stage"),
                                       timeout=CONNECT_TIMEOUT_S)  # fmt: skip
        if started.value is None:
            return Staged(node, problem=started.problem or f"{node}: cannot start staging")
        process = started.value
        try:
            process.send(_line(request))
            said = _answer(process.read_line(_timeout(restore.size, self.settings)))
            if said is None or "missing" not in said:
                return Staged(node, problem=str((said or {}).get("error") or
                                                f"{node}: staging did not start"))  # fmt: skip
            missing = [str(p) for p in said["missing"]]
            if missing:
                problem = self._fill(node, process, restore, missing, senders(missing))
                if problem is not None:
                    return Staged(node, problem=problem)
            done = _final_answer(process, _timeout(restore.size, self.settings))
        finally:
            process.close()
        if not done.get("ok"):
            return Staged(node, problem=str(done.get("error") or f"{node}: staging failed"))
        return Staged(node, int(done.get("received_bytes") or 0),
                      int(done.get("received") or 0), int(done.get("reused") or 0),
                      set_aside=tuple(str(name) for name in done.get("set_aside") or ()))

    def _fill(self, node: str, process: StartedCommand, restore: Restore,
              missing: Sequence[str],
              fetch_from: Mapping[str, Sequence[Fetch]]) -> str | None:  # fmt: skip
        """Every file `node` lacks sent to it by the nodes that hold them, at once."""
        said = _answer(process.read_line(READY_TIMEOUT_S))
        if said is None or not said.get("ready"):
            return str((said or {}).get("error") or f"{node}: staging did not listen")
        if not fetch_from:
            return f"{node} lacks {len(missing)} files and no node alive holds them"
        hops = {source: Hop.new() for source in fetch_from}
        process.send(_line({"hops": [hop.to_dict() for hop in hops.values()]}))
        answers: dict[str, dict[str, Any]] = {}

        def send(source: str) -> None:
            fetches = fetch_from[source]
            files = [{"path": f.path, "from": f.where, "writer": f.writer} for f in fetches]
            answers[source] = self._send(source, str(restore.chosen), fetches[0].writer, files,
                                         node, int(said["port"]), hops[source],
                                         _timeout(restore.size, self.settings))  # fmt: skip

        threads = [threading.Thread(target=send, args=(s,), daemon=True) for s in fetch_from]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        bad = [f"{s}: {a.get('error')}" for s, a in answers.items() if not a.get("ok")]
        return "; ".join(bad) if bad else None

    # -- prune --------------------------------------------------------------------------
    def prune(self, node: str, keep: Sequence[str] | None, *, drop: bool = False) -> bool:
        """Copies on `node` of every entry not in `keep` removed (`drop`: all the job's);
        whether the node did it."""
        request = self._request(node, keep=list(keep or ()), drop=drop)
        [result] = self.transport.run([node], checkpoint_command(self.python, "prune"),
                                      timeout=SCAN_TIMEOUT_S, connect_timeout=CONNECT_TIMEOUT_S,
                                      stdin=_line(request))  # fmt: skip
        if result.value is None:
            return False
        return bool(_last_answer(result.value.stdout, result.value.stderr).get("ok"))


def checkpoint_command(python: str, step: str) -> str:
    """The remote shell command that runs one step of remote/checkpoint_node.py on a node,
    its request on stdin."""
    return program_command(python, CHECKPOINT_PARTS, "checkpoint_node", (step,))


def _timeout(size: int, settings: CheckpointSettings) -> float:
    """Long enough for `size` bytes at the bandwidth cap (or 50 MB/s with none)."""
    rate = settings.bandwidth or 50_000_000
    return size / rate + COPY_SLACK_S


def _line(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(doc) + "\n").encode()


def _answer(raw: bytes | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw or b"")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _last_answer(stdout: bytes, stderr: bytes) -> dict[str, Any]:
    """A step's answer: its last line of stdout; else what it said on stderr."""
    lines = stdout.decode(errors="replace").strip().splitlines()
    said = _answer(lines[-1].encode()) if lines else None
    if said is not None:
        return said
    tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
    return {"ok": False, "error": " | ".join(tail) or "no answer"}


def _final_answer(process: StartedCommand, timeout: float) -> dict[str, Any]:
    """A started step's answer: its next line; else what it said on stderr as it ended."""
    said = _answer(process.read_line(timeout))
    if said is not None:
        return said
    result = process.wait(10.0)
    if result.value is None:
        return {"ok": False, "error": result.problem or "no answer"}
    return _last_answer(b"", result.value.stderr)
