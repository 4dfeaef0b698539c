"""The transfer of `orch env push`: one stream from the head, passed from node to node.

The nodes that need anything form a chain in hostfile order. Each runs remote/envpush.py's
receive step; every node but the first opens a TCP port and says which. The head then
tells each node where its stream comes from (the head's channel for the first, the port
for the others) and where to pass it on, with each link's two secrets (a Hop, on both
nodes' stdin: the sender presents one, the receiver answers the other, so neither takes
another's word for the node the head put at the link's other end), and sends the stream
once: the head's manifest, then every file some node of the chain needs and the head's
bytecode of those files. Each node keeps its own files (checked against the manifest, whose
sha256 came on the head's own channel) and passes every byte on as it arrives. So the head's
bytes do not grow with the number of nodes, and a chain moves at its slowest link.

A node whose upstream did not pass the whole stream on (a node before it lost, or cut off
for stalling) is sent again in a second round, from the head: what goes wrong on one
node stays that node's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from orchestrator.nodes.transport import NodeTransport, StartedCommand
from orchestrator.pernode import NodeResult, failed, for_each_node, succeeded
from orchestrator.remote import owned
from orchestrator.remote.envpush_manifest import STREAM_CACHES, STREAM_MANIFEST, caches_of, pack
from orchestrator.remote.envpush_relay import Hop

Bytes = Callable[[str, int], None]  # (node, bytes just sent)
ROUNDS = 2  # the chain, then once more from the head for nodes it did not reach whole
SEND_TIMEOUT_S = 3600.0  # a node's whole transfer, swap and fingerprint
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Received:
    """A node's answer after the stream: what it kept, and what it passed on."""

    node: str
    upstream: str  # "head" or the node it got the stream from
    answer: Mapping[str, Any]

    @property
    def ok(self) -> bool:
        return bool(self.answer.get("ok"))


@dataclass(frozen=True)
class Stream:
    """What one round sends: the head's manifest and the files of `rels`, from `root`, then
    the head's bytecode of them (listed with their hashes in the manifest sent)."""

    root: str
    manifest: Mapping[str, list[Any]]
    rels: tuple[str, ...]

    @cached_property
    def caches(self) -> dict[str, list[Any]]:
        return caches_of(self.root, self.rels)

    def manifest_bytes(self) -> bytes:
        return pack({**self.manifest, STREAM_CACHES: ["c", 0, self.caches, 0]}).encode()


class NodeGone(Exception):
    """The first node of the chain stopped taking the stream."""


class HeadFileChanged(Exception):
    """A file of the head's environment could not be read as its manifest says."""


def write_stream(stream: Stream, manifest_bytes: bytes, out: Any) -> None:
    """The tar the nodes read: the head's manifest first, then each file and link.
    HeadFileChanged when one is gone from the head meanwhile (the nodes then fail their
    checks and keep what they had); NodeGone from `out`."""
    with tarfile.open(fileobj=out, mode="w|", bufsize=_CHUNK) as tar:  # type: ignore[call-overload]
        info = tarfile.TarInfo(STREAM_MANIFEST)
        info.size = len(manifest_bytes)
        tar.addfile(info, io.BytesIO(manifest_bytes))
        for rel in stream.rels:
            try:
                tar.add(os.path.join(stream.root, rel), arcname=rel, recursive=False)
            except OSError as err:
                raise HeadFileChanged(f"{rel} changed on the head during the push ({err})") from err
        for rel, want in sorted(stream.caches.items()):
            _add_cache(tar, os.path.join(stream.root, rel), rel, want[1])


def _add_cache(tar: tarfile.TarFile, path: str, rel: str, sha256: str) -> None:
    """A bytecode cache, read whole before any of it is written: one gone or rewritten
    since it was listed is left out (the node compiles its file), and never half-written
    into the stream, whose next members would then be misread."""
    try:
        with open(path, "rb") as handle:
            data, mtime = handle.read(), os.fstat(handle.fileno()).st_mtime
    except OSError:
        return
    if hashlib.sha256(data).hexdigest() != sha256:
        return
    info = tarfile.TarInfo(rel)
    info.size, info.mode, info.mtime = len(data), 0o644, int(mtime)
    tar.addfile(info, io.BytesIO(data))


class _Counted:
    """A file-like object tarfile writes to: each chunk to the first node's stdin."""

    def __init__(self, node: str, send: Callable[[bytes], None], on_bytes: Bytes | None) -> None:
        self.node, self._send, self._on_bytes, self.sent = node, send, on_bytes, 0

    def write(self, data: bytes) -> int:
        try:
            self._send(bytes(data))
        except OSError as err:
            raise NodeGone(str(err)) from err
        self.sent += len(data)
        if self._on_bytes is not None:
            self._on_bytes(self.node, len(data))
        return len(data)


@dataclass(frozen=True)
class _Ready:
    node: str
    process: StartedCommand
    port: int | None


def _line(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _answer(raw: bytes | None) -> dict[str, Any] | None:
    try:
        doc = json.loads(raw or b"")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _start(
    node: str, command: str, request: Mapping[str, Any], transport: NodeTransport, timeout: float
) -> NodeResult[_Ready]:
    """The node's receive step, started and ready (its lock taken, its port open)."""
    started = transport.start(node, command, timeout=timeout)
    if started.value is None:
        return failed(node, started.problem or f"{node}: cannot start", started.hint, started.kind)
    process = started.value
    try:
        process.send(_line(request))
    except OSError as err:
        process.close()
        return failed(node, f"{node}: the push could not start: {err}", "check the node")
    said = _answer(process.read_line(timeout))
    if said is None or not said.get("ready"):
        problem = (said or {}).get("error") or _ended(process, timeout)
        process.close()
        return failed(node, f"{node}: {problem}", "push again when that is fixed")
    return succeeded(node, _Ready(node, process, said.get("port")))


def _ended(process: StartedCommand, timeout: float) -> str:
    """What a receive step that said nothing printed on stderr."""
    result = process.wait(min(timeout, 10.0))
    if result.value is None:
        return result.problem or "no answer"
    tail = result.value.stderr.decode(errors="replace").strip().splitlines()[-3:]
    return " | ".join(tail) or f"no answer (exit {result.value.exit_code})"


def _route(chain: Sequence[_Ready]) -> list[bytes]:
    """Each node's second line: where its stream comes from (with its link's secrets), where
    it goes on to (with the next link's). Each link has secrets of its own: what a node
    heard on one link (or whoever took its port once it ended) passes on no other."""
    hops = [Hop.new().to_dict() for _ in chain[1:]]
    lines = []
    for index in range(len(chain)):
        after = chain[index + 1] if index + 1 < len(chain) else None
        forward = None
        if after is not None:
            forward = {"host": after.node, "port": after.port, "hop": hops[index]}
        source = {"source": "stdin"} if index == 0 else {"source": "tcp", "hop": hops[index - 1]}
        lines.append(_line({**source, "forward": forward}))
    return lines


def _collect(ready: _Ready, first: bool) -> dict[str, Any]:
    """The node's answer: the first one's stdin is closed (the stream's end) by waiting;
    the others' stays open until they answer (its end would abandon their push)."""
    if first:
        result = ready.process.wait(SEND_TIMEOUT_S)
        if result.value is None:
            return {"ok": False, "error": result.problem}
        lines = result.value.stdout.decode(errors="replace").strip().splitlines()
        said = _answer(lines[-1].encode()) if lines else None
        tail = result.value.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return said or {"ok": False, "error": " | ".join(tail) or "no answer"}
    said = _answer(ready.process.read_line(SEND_TIMEOUT_S))
    if said is None:
        return {"ok": False, "error": _ended(ready.process, 10.0)}
    ready.process.close()
    return said


def relay_round(
    nodes: Sequence[str],
    stream: Stream,
    command: str,
    *,
    transport: NodeTransport,
    timeout: float,
    on_bytes: Bytes | None,
    force: bool = False,
) -> tuple[list[NodeResult[Received]], list[str], int]:
    """One chain over `nodes`: (each node's result, nodes to send again because their
    upstream did not pass the whole stream on, bytes the head sent). `force`: a node swaps
    even with a job running from the environment."""
    manifest_bytes = stream.manifest_bytes()
    request = {"root": stream.root, "force": force,
               "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
               "node_root": owned.root_setting(os.environ)}  # fmt: skip
    head_sent = 0

    def start(node: str) -> NodeResult[_Ready]:
        listen = node != nodes[0]
        return _start(node, command, {**request, "listen": listen}, transport, timeout)

    started = for_each_node(nodes, start, max_parallel=16)
    head_sent += sum(len(_line({**request, "listen": True})) for _ in nodes)
    chain = [r.value for r in started if r.value is not None]
    results: dict[str, NodeResult[Received]] = {r.node: r for r in started if r.value is None}  # type: ignore[misc]
    if not chain:
        return [results[n] for n in nodes], [], head_sent
    routes = _route(chain)
    for ready, route in reversed(list(zip(chain, routes, strict=True))):  # listeners first
        try:
            ready.process.send(route)
            head_sent += len(route)
        except OSError:
            pass  # its answer says what happened
    sender = _Counted(chain[0].node, chain[0].process.send, on_bytes)
    complete, changed = True, None
    try:
        write_stream(stream, manifest_bytes, sender)
    except NodeGone:
        complete = False  # the first node is gone: the nodes after it are sent again
    except HeadFileChanged as err:
        changed = str(err)  # every node fails its checks and keeps what it had
    head_sent += sender.sent
    by_node = {r.node: r for r in chain}
    answers = for_each_node(
        list(by_node),
        lambda node: succeeded(node, _collect(by_node[node], node == chain[0].node)),
        max_parallel=len(chain),
    )
    said = {r.node: r.value or {} for r in answers}
    again: list[str] = []
    for index, ready in enumerate(chain):
        answer = said[ready.node]
        upstream = "head" if index == 0 else chain[index - 1].node
        whole = complete if index == 0 else _passed_on_whole(said[upstream], sender.sent)
        if changed is not None and not answer.get("ok"):
            answer = {**answer, "error": f"{changed}: push again"}
        elif not answer.get("ok") and not answer.get("refused") and (
            answer.get("upstream_lost") or not whole
        ):
            again.append(ready.node)
        results[ready.node] = succeeded(ready.node, Received(ready.node, upstream, answer))
    return [results[n] for n in nodes], again, head_sent


def _passed_on_whole(upstream_answer: Mapping[str, Any], stream_bytes: int) -> bool:
    """Whether the node before passed on every byte the head sent."""
    return (
        not upstream_answer.get("forward_error")
        and int(upstream_answer.get("relayed_bytes") or 0) >= stream_bytes
    )


def stream_files(needs: Mapping[str, Sequence[str]], nodes: Sequence[str]) -> tuple[str, ...]:
    """What one stream to `nodes` carries: every file some of them needs, each once."""
    return tuple(sorted({rel for node in nodes for rel in needs[node]}))


def relay(
    nodes: Sequence[str],
    needs: Mapping[str, Sequence[str]],
    root: str,
    manifest: Mapping[str, list[Any]],
    command: str,
    *,
    transport: NodeTransport,
    timeout: float,
    on_bytes: Bytes | None = None,
    force: bool = False,
) -> tuple[dict[str, NodeResult[Received]], int]:
    """Every node of `nodes` sent what it `needs` (relative paths), in at most ROUNDS
    chains: ({node: result}, bytes the head sent in all)."""
    results: dict[str, NodeResult[Received]] = {}
    head_sent, pending = 0, list(nodes)
    for _ in range(ROUNDS):
        if not pending:
            break
        rels = stream_files(needs, pending)
        found, again, sent = relay_round(
            pending, Stream(root, manifest, rels), command, transport=transport,
            timeout=timeout, on_bytes=on_bytes, force=force,
        )  # fmt: skip
        head_sent += sent
        results.update({r.node: r for r in found})
        pending = again
    return results, head_sent
