"""`orch env push`: make every node's environment at the head's path the head's.

(1) remote/envpush.py's `look`, on every node in parallel and run with the base interpreter
the environment points to, says what the node has: its interpreter, platform, free disk, the
manifest of the environment's files there, whether a job runs from it, whether it sees the
head's own directory. (2) The checks here refuse a node whose base interpreter, version, ABI
or platform differ, whose disk is too small, whose environment is a mount point, or where a
job runs from the environment (unless forced; the node looks again just before its swap); a
node that sees the head's directory (a shared filesystem) is left alone, one that has it all
already is done. (3) envpush/relay.py sends the rest once, passed from node to node: each
keeps only what differs on it, builds the new environment beside the old one and swaps it in
with one rename.
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import os
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from orchestrator.envpush.relay import Bytes, Received, relay, stream_files
from orchestrator.errors import UsageError
from orchestrator.nodes.transport import NodeTransport, SshTransport
from orchestrator.pernode import GroupResult, NodeResult, failed, succeeded
from orchestrator.probe.facts import Environment
from orchestrator.remote import boot_blob, boot_code
from orchestrator.remote.envpush_manifest import MARKER_PREFIX, manifest, unpack, with_mtimes
from orchestrator.remote.envpush_manifest import delta as node_delta
from orchestrator.remote.owned import (
    HEAD_WAY,
    UnsafeDirectory,
    user_directories,
    write_private_file,
)
from orchestrator.specs.units import format_bytes

# The node side, with what it imports loaded before it (a part after those it imports).
PUSH_PARTS = ("environment", "owned", "procs", "digest", "filesystem", "envpush_manifest",
              "envpush_staging", "envpush_relay", "env_lock")  # fmt: skip
PUSH_SOURCE = boot_code(boot_blob(PUSH_PARTS, "envpush"))
DISK_MARGIN_BYTES = 256 << 20  # left free on a node after the push
# A node's look hashes every file no earlier push recorded: 6 GB on a slow disk.
LOOK_TIMEOUT_S = 900.0
MANIFEST_KEPT_S = 30 * 86400  # the head's manifest of an environment not pushed since
# Run the node's step with the base interpreter; say so when it is not there.
_LAUNCH = (
    'PY=$1; shift; case $PY in */*) ;; *) PY=$(command -v "$PY" || echo "$PY") ;; esac; '
    'if [ -x "$PY" ]; then exec "$PY" -c "$@"; fi; '
    'echo "orch-no-interpreter $PY" >&2; exit 3'
)


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
    upstream: str | None = None  # "head" or the node the stream came from
    relayed_bytes: int = 0  # passed on to the next node


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
    if config.is_file() or (root / "conda-meta").is_dir():
        _check_made_here(root)
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


def scripts_made_elsewhere(root: Path) -> dict[str, str]:
    """bin/ scripts whose #! line names an interpreter outside `root` (script -> its
    interpreter): the environment was made at another path (moved, copied, or reached
    through a link), and pushed to `root` its scripts would name one the nodes lack."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(root / "bin"), key=lambda e: e.name):
            if not entry.is_file(follow_symlinks=False):
                continue
            with open(entry.path, "rb") as handle:
                first = handle.readline(512)
            words = first[2:].split() if first.startswith(b"#!") else []
            named = words[0].decode(errors="replace") if words else ""
            if "python" in os.path.basename(named) and not named.startswith(f"{root}/bin/"):
                found[entry.name] = named
    return found


def _check_made_here(root: Path) -> None:
    elsewhere = scripts_made_elsewhere(root)
    if not elsewhere:
        return
    named = next(iter(elsewhere.values()))
    made_at = str(Path(named).parent.parent)
    shown = ", ".join(f"bin/{s}" for s in list(elsewhere)[:3])
    raise UsageError(
        f"{root} was made at another path: {len(elsewhere)} of its scripts ({shown}) run "
        f"{named}, which would not exist on the nodes once {root} is pushed there",
        f"push the environment from the path it was made at (--python {made_at}/bin/python), "
        f"or make it again at {root} (python3 -m venv {root}, then install the job's "
        "packages)",
    )


def _command(runner: str, step: str, argument: str = "") -> str:
    words = ["sh", "-c", _LAUNCH, "sh", runner, PUSH_SOURCE, step]
    return " ".join(shlex.quote(w) for w in [*words, *([argument] if argument else [])])


# ----- what a node needs ------------------------------------------------------------------
@dataclass(frozen=True)
class Delta:
    send: Mapping[str, list[Any]]  # relative path -> manifest entry
    remove: tuple[str, ...]
    dirs: Mapping[str, int]  # directories to make, or to give another mode -> the head's mode
    send_bytes: int


def delta(head: Mapping[str, list[Any]], node: Mapping[str, list[Any]]) -> Delta:
    """What makes the node's manifest the head's (the node's own computation, which it
    repeats from the stream's manifest when it builds)."""
    found = node_delta(head, node)
    return Delta(found["send"], tuple(found["remove"]), found["dirs"], found["bytes"])


def refusal(
    node: str,
    source: EnvSource,
    head: Environment,
    seen: Mapping[str, Any],
    need_bytes: int,
    force: bool,
) -> tuple[str, str] | None:
    """(problem, fix) when the node cannot take the environment; None when it can."""
    if seen.get("refused"):  # the node's own words: its root or record is not the user's own
        return f"{node}: {seen['refused']['problem']}", seen["refused"]["fix"]
    interp, plat = seen.get("interpreter") or {}, seen.get("platform") or {}
    if source.kind == "venv" and interp.get("version") != head.python_version:
        return (
            f"{node}: the base interpreter {source.runner} is Python "
            f"{interp.get('version')}, the head's environment needs {head.python_version}",
            f"install Python {head.python_version} at {source.runner} on {node}",
        )
    theirs = (interp.get("abi"), plat.get("libc"), plat.get("machine"))
    ours = (head.abi, head.libc, head.machine)
    if source.kind == "conda":  # the node's python3 ran the look; the env brings its own
        theirs, ours = theirs[1:], ours[1:]
    if theirs != ours:
        return (
            f"{node}: platform {', '.join(map(str, theirs))} is not the head's "
            f"{', '.join(ours)}: binary wheels do not cross it",
            f"push from a head of the same platform, or build the environment on {node}",
        )
    if seen.get("mount_point"):
        return (
            f"{node}: {seen.get('real_root') or source.root} is a mount point: the new "
            "environment cannot be swapped in with one rename",
            f"make the environment a directory inside it (e.g. {source.root}/env, the same "
            "path on the head), and push that",
        )
    if seen.get("running") and not force:
        return _running_refusal(node, source.root, seen["running"])
    free = int(seen.get("free_bytes") or 0)
    if need_bytes + DISK_MARGIN_BYTES > free:
        return (
            f"{node}: {format_bytes(need_bytes)} to receive, {format_bytes(free)} free "
            f"where {source.root} is",
            f"free disk space on {node}",
        )
    return None


def _running_refusal(node: str, root: str, running: Sequence[Any]) -> tuple[str, str]:
    """Processes run from the environment: which orch jobs, else which pids."""
    pairs = [(r, None) if isinstance(r, int) else (r[0], r[1]) for r in running]
    jobs = sorted({job for _, job in pairs if job})
    pids = ", ".join(str(pid) for pid, _ in pairs[:5])
    what = f"orch job {', '.join(jobs)} (pids {pids})" if jobs else f"processes (pids {pids})"
    kill = f"`orch kill {jobs[0]}`" if jobs else "stop them"
    return (
        f"{node}: {what} run from {root}: a push would change the environment under them",
        f"wait for the job to end (or {kill}), or push with --force",
    )


# ----- one node: what it has, what it needs ---------------------------------------------------
class _Refused(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


@dataclass(frozen=True)
class _Planned:
    """A node after its look: left alone (shared), done already, or what it needs."""

    node: str
    shared: bool
    change: Delta | None


def _seen(result: NodeResult[Any], source: EnvSource) -> dict[str, Any]:
    """The node's look, parsed; _Refused with the node's words when there is none."""
    node, said = result.node, result.value.stderr.decode(errors="replace")
    if result.value.exit_code == 3 and "orch-no-interpreter" in said:
        raise _Refused(
            f"{node}: the base interpreter {source.runner} that the environment points to "
            f"is not on {node}",
            f"install the same Python at {source.runner} on {node}: orch installs nothing "
            "outside the environment's directory",
        )
    try:
        return json.loads(result.value.stdout)
    except ValueError:
        tail = " | ".join(said.strip().splitlines()[-3:]) or f"exit {result.value.exit_code}"
        raise _Refused(f"{node}: looking at {source.root} failed: {tail}",
                       "check the node") from None  # fmt: skip


def _plan(result: NodeResult[Any], push: _Push) -> NodeResult[_Planned]:
    if result.value is None:
        return result  # type: ignore[return-value]
    node = result.node
    try:
        seen = _seen(result, push.source)
        if seen.get("shared"):
            return succeeded(node, _Planned(node, True, None))
        change = delta(push.head_files, unpack(seen["manifest"]) if seen.get("manifest") else {})
        refused = refusal(node, push.source, push.head_env, seen, change.send_bytes, push.force)
        if refused is not None:
            raise _Refused(*refused)
    except _Refused as err:
        return failed(node, err.problem, err.fix, "refused")
    return succeeded(node, _Planned(node, False, change))


def _needs_nothing(change: Delta) -> bool:
    return not (change.send or change.remove or change.dirs)


def _received(result: NodeResult[Received], change: Delta) -> NodeResult[NodePush]:
    if result.value is None:
        return result  # type: ignore[return-value]
    node, answer = result.node, result.value.answer
    if answer.get("refused"):  # by the node, just before its swap: a job started meanwhile
        return failed(node, f"{node}: {answer.get('error')}", answer.get("fix"), "refused")
    if not result.value.ok:
        kept = f"{node}: the push failed, the previous environment is kept: {answer.get('error')}"
        return failed(node, kept, answer.get("fix") or "check the node and push again")
    return succeeded(node, NodePush(
        node, sent_files=int(answer.get("received", 0)),
        sent_bytes=int(answer.get("received_bytes", 0)), removed_files=len(change.remove),
        fingerprint=answer.get("fingerprint"), upstream=result.value.upstream,
        relayed_bytes=int(answer.get("relayed_bytes") or 0),
    ))  # fmt: skip


@dataclass(frozen=True)
class _Push:
    """What every node's push shares."""

    source: EnvSource
    head_env: Environment
    head_files: Mapping[str, list[Any]]
    force: bool


@dataclass(frozen=True)
class PushReport:
    source: EnvSource
    fingerprint: str
    payload_bytes: int  # the environment's size
    nodes: GroupResult[NodePush]
    head_sent_bytes: int  # everything the head wrote to the nodes

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
        "from": push.upstream,
        "relayed_bytes": push.relayed_bytes,
    }


def head_manifest(root: str) -> dict[str, list[Any]]:
    """The head's manifest; hashes of files unchanged since the last push (same size and
    mtime) come from the copy kept in the user's own directory, not from reading 6 GB."""
    key = hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]
    try:
        kept = user_directories(os.getuid(), ["env-manifests"], base=tempfile.gettempdir(),
                                way=HEAD_WAY)  # fmt: skip
        cache = Path(kept) / key
    except (UnsafeDirectory, OSError):
        return manifest(root)  # no safe place for it: every file is read
    try:
        previous = json.loads(cache.read_text())
    except (OSError, ValueError):
        previous = {}
    found = manifest(root, previous)
    with contextlib.suppress(OSError):
        write_private_file(str(cache), json.dumps(with_mtimes(root, found)).encode())
        _forget_stale(cache.parent, keep=cache)
    return found


def _forget_stale(directory: Path, keep: Path) -> None:
    """Manifests of environments not pushed for MANIFEST_KEPT_S: each is a few MB, and an
    environment gone or renamed would keep its own forever."""
    cutoff = time.time() - MANIFEST_KEPT_S
    for entry in directory.iterdir():
        with contextlib.suppress(OSError):
            if entry != keep and entry.lstat().st_mtime < cutoff:
                entry.unlink()


def push_environment(
    nodes: Sequence[str],
    source: EnvSource,
    head_env: Environment,
    *,
    transport: NodeTransport | None = None,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = 30.0,
    on_bytes: Bytes | None = None,
    on_node: Callable[[NodeResult[NodePush]], None] | None = None,
    on_send: Callable[[int], None] | None = None,
) -> PushReport:
    """Push the head's environment to every node; one result per node, in order.
    `on_send` hears how many bytes the stream will carry, before it starts."""
    transport = transport or SshTransport()
    head_files = head_manifest(source.root)
    push = _Push(source, head_env, head_files, force)
    marker = f"{MARKER_PREFIX}{secrets.token_hex(8)}"
    marker_path = Path(source.root) / marker
    marker_path.write_text("orch env push: shared filesystem check\n")
    request = json.dumps({"root": source.root, "marker": marker})
    try:
        looked = transport.run(nodes, _command(source.runner, "look", request),
                               timeout=LOOK_TIMEOUT_S, connect_timeout=timeout)  # fmt: skip
    finally:
        marker_path.unlink(missing_ok=True)
    planned = {r.node: _plan(r, push) for r in looked}
    done: dict[str, NodeResult[NodePush]] = {}
    for node, result in planned.items():
        change = result.value.change if result.value is not None else None
        if change is None or dry_run or _needs_nothing(change):
            done[node] = _settled(result, head_env, dry_run)
            if on_node is not None:
                on_node(done[node])
    sending = [n for n in nodes if n not in done]
    head_sent = 0
    if sending:
        needs = {n: tuple(planned[n].value.change.send) for n in sending}  # type: ignore[union-attr]
        if on_send is not None:
            on_send(sum(head_files[rel][1] for rel in stream_files(needs, sending)))
        relayed, head_sent = relay(
            sending, needs, source.root, head_files, _command(source.runner, "receive"),
            transport=transport, timeout=timeout, on_bytes=on_bytes, force=force,
        )  # fmt: skip
        for node in sending:
            done[node] = _received(relayed[node], planned[node].value.change)  # type: ignore[union-attr, arg-type]
            if on_node is not None:
                on_node(done[node])
    payload = sum(e[1] for e in head_files.values())
    results = GroupResult(tuple(done[n] for n in nodes))
    return PushReport(source, head_env.fingerprint, payload, results, head_sent)


def _settled(
    result: NodeResult[_Planned], head_env: Environment, dry_run: bool
) -> NodeResult[NodePush]:
    """A node that is sent nothing: refused, shared, already the head's, or a dry run."""
    if result.value is None:
        return result  # type: ignore[return-value]
    node, change = result.node, result.value.change
    if change is None:
        return succeeded(node, NodePush(node, shared=True, dry_run=dry_run))
    if dry_run:
        return succeeded(node, NodePush(
            node, sent_files=len(change.send), sent_bytes=change.send_bytes,
            removed_files=len(change.remove), dry_run=True,
        ))  # fmt: skip
    return succeeded(node, NodePush(node, fingerprint=head_env.fingerprint))
