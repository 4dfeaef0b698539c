"""`orch env push`: make every node's environment at the head's path the head's.

Per node, in parallel, over one SSH connection: (1) remote/envpush.py `look`, run with the
base interpreter the environment points to, says what the node has (its interpreter,
platform, free disk, the manifest of the environment's files there, whether a job runs
from it, whether it sees the head's own directory); (2) the checks here refuse a node whose
base interpreter, version, ABI or platform differ, whose disk is too small, or where a job
runs from the environment (unless forced); (3) `receive` gets only the files that differ,
as one tar stream, builds the new environment beside the old one and swaps it in with one
rename. A shared filesystem (the node sees a marker written here) is left alone.

Not done yet: the head sends every node its own copy (head bytes grow with the number of
nodes; relaying between nodes is the next step).
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import secrets
import shlex
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.errors import UsageError
from orchestrator.pernode import GroupResult, NodeResult, failed, for_each_node, succeeded
from orchestrator.probe.facts import Environment
from orchestrator.remote import boot_blob, boot_code
from orchestrator.remote.envpush import manifest, unpack, with_mtimes
from orchestrator.remote.owned import (
    UnsafeDirectory,
    private_directories,
    user_directory,
    write_private_file,
)
from orchestrator.ssh import NodeSession, SSHError, failure_result, load_ssh_config, open_session

PUSH_SOURCE = boot_code(boot_blob(("environment",), "envpush"))
MARKER_PREFIX = ".orch-push-marker-"
DISK_MARGIN_BYTES = 256 << 20  # left free on a node after the push
SEND_TIMEOUT_S = 3600.0  # a node's whole transfer, swap and fingerprint
_CHUNK = 1 << 20
# Run the node's step with the base interpreter; say so when it is not there.
_LAUNCH = (
    'PY=$1; shift; if [ -x "$PY" ]; then exec "$PY" -c "$@"; fi; '
    'echo "orch-no-interpreter $PY" >&2; exit 3'
)
Bytes = Callable[[str, int], None]  # (node, bytes just sent)


@dataclass(frozen=True)
class EnvSource:
    """The head's environment: its root, kind, and the interpreter that runs the node side
    (a venv's base interpreter, which must be on every node; a conda env's own python)."""

    root: str
    kind: Literal["venv", "conda"]
    python: str
    runner: str  # the node side's interpreter: the venv's base, or python3 for conda


@dataclass(frozen=True)
class NodePush:
    node: str
    shared: bool = False
    sent_files: int = 0
    sent_bytes: int = 0
    removed_files: int = 0
    fingerprint: str | None = None
    dry_run: bool = False


def environment_source(python: str) -> EnvSource:
    """The environment `python` belongs to; UsageError when it is none (a system one)."""
    path = Path(os.path.abspath(python))
    root = path.parent.parent
    if not path.exists():
        raise UsageError(
            f"--python {python} does not exist on the head",
            "give the interpreter of the environment to push, e.g. "
            "--python /opt/envs/train/bin/python",
        )
    config = root / "pyvenv.cfg"
    if config.is_file():
        parser = configparser.ConfigParser()
        parser.read_string("[venv]\n" + config.read_text(errors="replace"))
        home = parser.get("venv", "home", fallback="")
        base = os.path.join(home, os.path.basename(os.path.realpath(path)))
        return EnvSource(str(root), "venv", str(path), base)
    if (root / "conda-meta").is_dir():
        return EnvSource(str(root), "conda", str(path), "python3")
    raise UsageError(
        f"--python {python} is not in a virtual or conda environment (no pyvenv.cfg or "
        f"conda-meta in {root}): a system interpreter is not pushed",
        "make an environment and push it: `python3 -m venv /opt/envs/train`, install the "
        "job's packages, then --python /opt/envs/train/bin/python",
    )


def _command(runner: str, step: str, argument: str = "") -> str:
    words = ["sh", "-c", _LAUNCH, "sh", runner, PUSH_SOURCE, step]
    return " ".join(shlex.quote(w) for w in [*words, *([argument] if argument else [])])


# ----- what a node needs ------------------------------------------------------------------
@dataclass(frozen=True)
class Delta:
    send: Mapping[str, list[Any]]  # relative path -> manifest entry
    remove: tuple[str, ...]
    dirs: Mapping[str, int]  # new directories -> mode
    send_bytes: int


def delta(head: Mapping[str, list[Any]], node: Mapping[str, list[Any]]) -> Delta:
    """What makes the node's manifest the head's: files and links that differ or are
    missing, what the node has that the head has not, directories it lacks."""
    send = {rel: e for rel, e in head.items() if e[0] != "d" and node.get(rel) != e}
    dirs = {
        rel: e[3] for rel, e in head.items() if e[0] == "d" and (node.get(rel) or [""])[0] != "d"
    }
    remove = tuple(sorted(rel for rel in node if rel not in head))
    return Delta(send, remove, dirs, sum(e[1] for e in send.values()))


def refusal(
    node: str,
    source: EnvSource,
    head: Environment,
    seen: Mapping[str, Any],
    need_bytes: int,
    force: bool,
) -> tuple[str, str] | None:
    """(problem, fix) when the node cannot take the environment; None when it can."""
    interp, plat = seen.get("interpreter") or {}, seen.get("platform") or {}
    if source.kind == "venv" and interp.get("version") != head.python_version:
        return (
            f"{node}: the base interpreter {source.runner} is Python "
            f"{interp.get('version')}, the head's environment needs {head.python_version}",
            f"install Python {head.python_version} at {source.runner} on {node}",
        )
    theirs = (interp.get("abi"), plat.get("libc"), plat.get("machine"))
    ours = (head.abi, head.libc, head.machine)
    if theirs != ours:
        return (
            f"{node}: platform {', '.join(map(str, theirs))} is not the head's "
            f"{', '.join(ours)}: binary wheels do not cross it",
            f"push from a head of the same platform, or build the environment on {node}",
        )
    if seen.get("running") and not force:
        pids = ", ".join(map(str, seen["running"][:5]))
        return (
            f"{node}: processes run from {source.root} (pids {pids}): a push would "
            "change the environment under them",
            "wait for the job to end (or `orch kill` it), or push with --force",
        )
    free = int(seen.get("free_bytes") or 0)
    if need_bytes + DISK_MARGIN_BYTES > free:
        return (
            f"{node}: {need_bytes / 2**20:.0f} MiB to receive, {free / 2**20:.0f} MiB free "
            f"where {source.root} is",
            f"free disk space on {node}",
        )
    return None


# ----- one node -------------------------------------------------------------------------------
def _look(session: NodeSession, source: EnvSource, marker: str, timeout: float) -> dict[str, Any]:
    request = json.dumps({"root": source.root, "marker": marker})
    result = session.run(_command(source.runner, "look", request), timeout)
    said = result.stderr.decode(errors="replace")
    if result.exit_code == 3 and "orch-no-interpreter" in said:
        raise _Refused(
            f"{session.node}: the base interpreter {source.runner} that the "
            f"environment points to is not on {session.node}",
            f"install the same Python at {source.runner} on {session.node}: orch "
            "installs nothing outside the environment's directory",
        )
    try:
        return json.loads(result.stdout)
    except ValueError:
        tail = " | ".join(said.strip().splitlines()[-3:]) or f"exit {result.exit_code}"
        raise _Refused(
            f"{session.node}: looking at {source.root} failed: {tail}", "check the node"
        ) from None


class _Refused(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


class _Sender:
    """A file-like object tarfile writes to: each chunk goes to the node's stdin."""

    def __init__(self, node: str, send: Callable[[bytes], None], on_bytes: Bytes | None) -> None:
        self.node, self._send, self._on_bytes, self.sent = node, send, on_bytes, 0

    def write(self, data: bytes) -> int:
        self._send(bytes(data))
        self.sent += len(data)
        if self._on_bytes is not None:
            self._on_bytes(self.node, len(data))
        return len(data)


def _send(
    session: NodeSession, source: EnvSource, change: Delta, timeout: float, on_bytes: Bytes | None
) -> tuple[dict[str, Any], int]:
    process = session.start(_command(source.runner, "receive"), timeout)
    request = {
        "root": source.root,
        "send": change.send,
        "remove": list(change.remove),
        "dirs": change.dirs,
    }
    sender = _Sender(session.node, process.send, on_bytes)
    try:
        sender.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        with tarfile.open(fileobj=sender, mode="w|", bufsize=_CHUNK) as tar:  # type: ignore[call-overload]
            for rel in sorted(change.send):
                tar.add(os.path.join(source.root, rel), arcname=rel, recursive=False)
        result = process.wait(timeout)
    finally:
        process.close()
    try:
        return json.loads(
            result.stdout.decode(errors="replace").strip().splitlines()[-1]
        ), sender.sent
    except (ValueError, IndexError):
        tail = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return {"ok": False, "error": " | ".join(tail) or f"exit {result.exit_code}"}, sender.sent


@dataclass(frozen=True)
class _Push:
    """What every node's push shares."""

    source: EnvSource
    head_env: Environment
    head_files: Mapping[str, list[Any]]
    marker: str
    dry_run: bool
    force: bool
    timeout: float
    config: Any
    on_bytes: Bytes | None


def _push_one(node: str, push: _Push) -> NodeResult[NodePush]:
    try:
        with open_session(node, timeout=push.timeout, config=push.config) as session:
            return succeeded(node, _push_over(session, push))
    except _Refused as err:
        return failed(node, err.problem, err.fix, "refused")
    except SSHError as err:
        return failure_result(err.failure)


def _push_over(session: NodeSession, push: _Push) -> NodePush:
    node, source = session.node, push.source
    seen = _look(session, source, push.marker, push.timeout)
    if seen.get("shared"):
        return NodePush(node, shared=True, dry_run=push.dry_run)
    change = delta(push.head_files, unpack(seen["manifest"]) if seen.get("manifest") else {})
    refused = refusal(node, source, push.head_env, seen, change.send_bytes, push.force)
    if refused is not None:
        raise _Refused(*refused)
    if push.dry_run:
        return NodePush(
            node,
            sent_files=len(change.send),
            sent_bytes=change.send_bytes,
            removed_files=len(change.remove),
            dry_run=True,
        )
    if not (change.send or change.remove or change.dirs):  # already the head's
        return NodePush(node, fingerprint=push.head_env.fingerprint)
    answer, sent = _send(session, source, change, max(push.timeout, SEND_TIMEOUT_S), push.on_bytes)
    if not answer.get("ok"):
        raise _Refused(
            f"{node}: the push failed, the previous environment is kept: {answer.get('error')}",
            "check the node and push again",
        )
    return NodePush(
        node,
        sent_files=int(answer.get("received", 0)),
        sent_bytes=sent,
        removed_files=len(change.remove),
        fingerprint=answer.get("fingerprint"),
    )


@dataclass(frozen=True)
class PushReport:
    source: EnvSource
    fingerprint: str
    payload_bytes: int  # the environment's size
    nodes: GroupResult[NodePush]

    @property
    def head_sent_bytes(self) -> int:
        return sum(
            r.value.sent_bytes for r in self.nodes if r.value is not None and not r.value.dry_run
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": all(r.ok for r in self.nodes),
            "root": self.source.root,
            "kind": self.source.kind,
            "fingerprint": self.fingerprint,
            "payload_bytes": self.payload_bytes,
            "head_sent_bytes": self.head_sent_bytes,
            "nodes": [_node_dict(r) for r in self.nodes],
        }


def _node_dict(result: NodeResult[NodePush]) -> dict[str, Any]:
    if result.value is None:
        return {"node": result.node, "ok": False, "problem": result.problem, "fix": result.hint}
    push = result.value
    return {
        "node": push.node,
        "ok": True,
        "shared": push.shared,
        "dry_run": push.dry_run,
        "sent_files": push.sent_files,
        "sent_bytes": push.sent_bytes,
        "removed_files": push.removed_files,
        "fingerprint": push.fingerprint,
    }


def head_manifest(root: str) -> dict[str, list[Any]]:
    """The head's manifest; hashes of files unchanged since the last push (same size and
    mtime) come from the copy kept in the user's own directory, not from reading 6 GB."""
    key = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
    try:
        top = user_directory(os.getuid(), tempfile.gettempdir())
        cache = Path(private_directories(top, ["env-manifests"], os.getuid())) / key
    except (UnsafeDirectory, OSError):
        return manifest(root)  # no safe place for it: every file is read
    try:
        previous = json.loads(cache.read_text())
    except (OSError, ValueError):
        previous = {}
    found = manifest(root, previous)
    with contextlib.suppress(OSError):
        write_private_file(str(cache), json.dumps(with_mtimes(root, found)).encode())
    return found


def push_environment(
    nodes: Sequence[str],
    source: EnvSource,
    head_env: Environment,
    *,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = 30.0,
    on_bytes: Bytes | None = None,
    on_node: Callable[[NodeResult[NodePush]], None] | None = None,
) -> PushReport:
    """Push the head's environment to every node; one result per node."""
    head_files = head_manifest(source.root)
    payload = sum(e[1] for e in head_files.values())
    marker = f"{MARKER_PREFIX}{secrets.token_hex(8)}"
    marker_path = Path(source.root) / marker
    marker_path.write_text("orch env push: shared filesystem check\n")
    push = _Push(
        source, head_env, head_files, marker, dry_run, force, timeout, load_ssh_config(), on_bytes
    )
    try:
        results = for_each_node(
            nodes, lambda node: _push_one(node, push), max_parallel=16, on_result=on_node
        )
    finally:
        marker_path.unlink(missing_ok=True)
    return PushReport(source, head_env.fingerprint, payload, results)
