"""Checkpoints that follow the job, on a node: what the job's checkpoint directory (PATH,
`--checkpoint-dir`) holds, copies of other nodes' checkpoints sent and received, a whole
checkpoint put back into PATH before a restart, and copies no longer needed removed.

Run inline by the head (`python -c <shipped source> STEP`), with owned.py, envpush_relay.py
and checkpoint_stream.py loaded beside it (CHECKPOINT_PARTS): one JSON request line on
stdin, JSON lines on stdout, the last one the answer; a failure is {"ok": false, "error"}
naming the node, the path and what to do.

- scan: PATH's entries (each file or directory directly under it) with their files' sizes
  and mtimes, DeepSpeed's small `latest` pointers' text, the whole copies this node keeps,
  free space on both sides; the shared-filesystem marker written, looked for or removed.
- send: files of PATH (or of a copy kept here) to another node's port, at low priority
  (nice, the idle I/O class) and under a bandwidth cap; a file that changed while read is
  named, not passed as whole.
- receive: one node's part of a checkpoint into this node's copies, taken only when every
  listed file arrived whole, then renamed into place with its manifest.
- stage: a whole checkpoint into PATH/<entry>: files already there (same sha256) and in
  the copies here are used, the rest received from other nodes; assembled beside PATH's
  entries and swapped in, so PATH/<entry> is the old one or the whole new one.
- prune: the copies of entries no longer kept removed, or the job's copies altogether.

Copies live in orch's own directory on the node, never in PATH:
<user directory>/checkpoints/<job>/<entry>/<writer>/<path as under PATH>, and
<entry>/<writer>.json ({"files": [{"path", "size", "sha256"}]}) once that part is whole.
STANDARD LIBRARY ONLY.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

try:  # on a node, loaded beside this program
    import orch_checkpoint_stream as stream
    import orch_envpush_relay as relay
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import envpush_relay as relay
    from orchestrator.remote import owned

# The remote modules shipped before this program, in import order (remote/__init__.py).
CHECKPOINT_PARTS = ("owned", "envpush_relay", "checkpoint_stream")

COPIES_DIR = "checkpoints"  # in the user's directory for orch: one directory per job
OWN_PREFIX = ".orch-"  # orch's names in PATH and in the copies: never listed as checkpoints
STAGE_PREFIX = OWN_PREFIX + "stage-"
PART_PREFIX = OWN_PREFIX + "part-"
OLD_PREFIX = OWN_PREFIX + "old-"
MANIFEST_SUFFIX = ".json"
ASIDE_DIR = OWN_PREFIX + "set-aside"  # in PATH: newer entries a restart could not make whole
MAX_FILES = 200_000  # listed by one scan, at most
POINTER_NAMES = ("latest", "latest_universal")  # DeepSpeed's pointer to its newest tag
POINTER_MAX = 4096  # bytes of a pointer file read as text
_SHA256_HEX = 64
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

Request = Mapping[str, Any]
Answer = dict[str, Any]
ReadLine = Callable[[], str]
WriteLine = Callable[[Answer], None]


class StepError(Exception):
    """What went wrong, as the user reads it (the path, the fix), and files that changed."""

    def __init__(self, message: str, changed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.changed = changed


def node_name(request: Request) -> str:
    return str(request.get("node") or socket.gethostname())


def _answering(step: Callable[..., Answer]) -> Callable[..., Answer]:
    """The step's answer, or {"ok": false, "error"} naming the node when it failed."""

    @functools.wraps(step)
    def run(request: Request, *args: Any, **kwargs: Any) -> Answer:
        try:
            return step(request, *args, **kwargs)
        except StepError as err:
            return _failed(request, str(err), list(err.changed))
        except stream.StreamError as err:
            return _failed(request, f"{err}: nothing of it is kept", list(err.changed))
        except owned.UnsafeDirectory as err:
            return _failed(request, str(err))
        except EOFError:
            return _failed(request, "the head went away: nothing was changed")
        except TimeoutError as err:
            return _failed(request, f"{err}: the sending node did not reach this node's port "
                                    "(a firewall between the nodes?)")  # fmt: skip
        except stream.UnsafePath as err:
            return _failed(request, f"the request names {err}: run a matching orch")
        except OSError as err:
            where = err.filename or "a connection"
            return _failed(request, f"{where}: {err.strerror or err}: fix it there and retry")
        except (KeyError, TypeError, ValueError) as err:
            return _failed(request, f"the request is not one this program reads ({err!r}): "
                                    "run a matching orch")  # fmt: skip

    return run


def _failed(request: Request, message: str, changed: list[str] | None = None) -> Answer:
    answer: Answer = {"ok": False, "error": f"on {node_name(request)}: {message}"}
    if changed is not None:
        answer["changed"] = changed
    return answer


# ----- places ----------------------------------------------------------------------------------
def copies_dir(request: Request) -> str:
    """The job's copies on this node, each level made under umask 077 and checked."""
    job = stream.one_name(request["job_id"], "job id")
    root = str(request.get("node_root") or "")
    return owned.user_directories(os.getuid(), [COPIES_DIR, job], root)


def _existing_copies_dir(request: Request) -> str | None:
    """The job's copies on this node when there are any (None), each level checked."""
    job = stream.one_name(request["job_id"], "job id")
    uid = os.getuid()
    choice = owned.choose_directory(uid, str(request.get("node_root") or ""))
    if choice.refused is not None:
        raise owned.UnsafeDirectory(choice.refused)
    path = choice.path
    for level in (path, os.path.join(path, COPIES_DIR), os.path.join(path, COPIES_DIR, job)):
        try:
            problem = owned.not_own_directory(level, os.lstat(level), uid)
        except FileNotFoundError:
            return None
        if problem is not None:
            raise owned.UnsafeDirectory(problem)
        path = level
    return path


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    return path


def free_bytes(path: str) -> int:
    """Free space for the user on `path`'s filesystem (or its nearest existing parent's)."""
    stats = os.statvfs(_nearest_existing(path))
    return stats.f_bavail * stats.f_frsize


def checkpoint_dir_problem(path: str, uid: int) -> str | None:
    """Why PATH is no checkpoint directory of the user's to use: a link, not a directory, or
    another user's (its owner and mode named, with the fix); None when it is (or is not
    there yet)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    said = f"{path} (owner {owned.owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})"
    if stat.S_ISLNK(st.st_mode):
        return (f"{said} is a symbolic link (to {os.readlink(path)}): give --checkpoint-dir "
                "the directory itself")  # fmt: skip
    if not stat.S_ISDIR(st.st_mode):
        return f"{said} is not a directory: move it away or choose another --checkpoint-dir"
    if st.st_uid != uid:
        return (f"{said} belongs to another user, not to {owned.owner_name(uid)}: choose a "
                "--checkpoint-dir of your own")  # fmt: skip
    return None


def _own_name(name: object, what: str) -> str:
    """A marker's name: one name of orch's own (.orch-*), never one of the job's files."""
    checked = stream.one_name(name, what)
    if not checked.startswith(OWN_PREFIX):
        raise stream.UnsafePath(f"{what} {checked!r}, not a name of orch's own ({OWN_PREFIX}*)")
    return checked


def _entry_name(name: object) -> str:
    entry = stream.one_name(name, "checkpoint entry")
    if entry.startswith(OWN_PREFIX):
        raise stream.UnsafePath(f"checkpoint entry {entry!r}, a name of orch's own")
    return entry


def _writer_name(name: object) -> str:
    writer = stream.one_name(name, "writer node")
    if writer.startswith(".") or writer.endswith(MANIFEST_SUFFIX):
        raise stream.UnsafePath(f"writer node {writer!r}, which the copies cannot name")
    return writer


# ----- scan --------------------------------------------------------------------------------
class _Budget:
    """Files a scan may still list; whether it ran out."""

    def __init__(self, files: int) -> None:
        self.left, self.truncated = files, False

    def take(self) -> bool:
        if self.left <= 0:
            self.truncated = True
            return False
        self.left -= 1
        return True


def _file_doc(path: str, st: os.stat_result) -> dict[str, Any]:
    # ctime after mtime: the file was renamed (or its mode changed) after its last write.
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def _dir_files(top: str, entry: str, budget: _Budget) -> list[dict[str, Any]]:
    """Every regular file below PATH/<entry>, paths relative to PATH; links never followed."""
    found: list[dict[str, Any]] = []
    pending = [entry]
    while pending:
        relative = pending.pop()
        try:
            items = sorted(os.scandir(os.path.join(top, relative)), key=lambda item: item.name)
        except OSError:
            continue  # removed meanwhile, or unreadable: the writer's, seen at the next scan
        for item in items:
            path = f"{relative}/{item.name}"
            try:
                if item.is_dir(follow_symlinks=False):
                    pending.append(path)
                elif item.is_file(follow_symlinks=False) and budget.take():
                    found.append(_file_doc(path, item.stat(follow_symlinks=False)))
            except OSError:
                continue
    return sorted(found, key=lambda doc: doc["path"])


def _pointer_text(top: str, path: str) -> str | None:
    try:
        fd = stream.open_below(top, path)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > POINTER_MAX:
            return None
        return os.read(fd, POINTER_MAX).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


def _entry_doc(top: str, name: str, budget: _Budget) -> dict[str, Any] | None:
    """One entry of PATH as scan lists it; None for a link or anything but a file or a
    directory."""
    try:
        st = os.lstat(os.path.join(top, name))
    except OSError:
        return None
    if stat.S_ISREG(st.st_mode):
        kind, files = "file", ([_file_doc(name, st)] if budget.take() else [])
        pointers = [name] if name in POINTER_NAMES else []
    elif stat.S_ISDIR(st.st_mode):
        kind, files = "dir", _dir_files(top, name, budget)
        pointers = [f"{name}/{pointer}" for pointer in POINTER_NAMES]
    else:
        return None
    text = {path: said for path in pointers if (said := _pointer_text(top, path)) is not None}
    return {"name": name, "kind": kind, "files": files, "text": text}


def _entries(top: str, budget: _Budget) -> list[dict[str, Any]]:
    names = sorted(name for name in os.listdir(top) if not name.startswith(OWN_PREFIX))
    return [doc for name in names if (doc := _entry_doc(top, name, budget)) is not None]


def _read_manifest(path: str) -> list[dict[str, Any]] | None:
    """A part's files as its manifest lists them; None when it is not one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            files = json.load(handle)["files"]
        return [{"path": stream.relative_path(item["path"]), "size": int(item["size"]),
                 "sha256": str(item["sha256"])} for item in files]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Part:
    """One writer's part of an entry, whole, as kept here: its files and where they are."""

    entry: str
    writer: str
    files: tuple[dict[str, Any], ...]
    top: str  # <copies>/<entry>/<writer>: its files' paths are relative to it


def whole_parts(copies: str, entry: str | None = None) -> list[Part]:
    """The parts kept here (of `entry`, or of every entry) that have their manifest."""
    names = [entry] if entry is not None else sorted(os.listdir(copies))
    parts = []
    for name in names:
        entry_dir = os.path.join(copies, name)
        if name.startswith(".") or not os.path.isdir(entry_dir) or os.path.islink(entry_dir):
            continue
        for item in sorted(os.listdir(entry_dir)):
            writer = item.removesuffix(MANIFEST_SUFFIX)
            top = os.path.join(entry_dir, writer)
            if writer == item or item.startswith(".") or not os.path.isdir(top):
                continue
            files = _read_manifest(os.path.join(entry_dir, item))
            if files is not None:
                parts.append(Part(name, writer, tuple(files), top))
    return parts


def _markers(request: Request, top: str, is_dir: bool) -> bool | None:
    """Writes, removes and looks for the shared-filesystem marker as asked; whether the
    marker asked about is seen (None: none asked about)."""
    if request.get("write_marker") and is_dir:
        name = _own_name(request["write_marker"], "marker")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fd = os.open(os.path.join(top, name), flags, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"orch checkpoint directory marker, written on {node_name(request)}\n")
    if request.get("remove_marker"):
        name = _own_name(request["remove_marker"], "marker")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(top, name))
    if not request.get("marker"):
        return None
    return os.path.lexists(os.path.join(top, _own_name(request["marker"], "marker")))


def _writable(path: str, is_dir: bool) -> bool:
    return os.access(path if is_dir else _nearest_existing(path), os.W_OK | os.X_OK)


@_answering
def scan(request: Request, max_files: int = MAX_FILES) -> Answer:
    """What PATH holds, and the whole copies kept here (see the module's docstring)."""
    top = str(request["dir"])
    if not os.path.isabs(top):
        raise StepError(f"--checkpoint-dir {top!r} is not an absolute path: give one")
    if request.get("create") and not os.path.lexists(top):
        os.makedirs(top, exist_ok=True)
    problem = checkpoint_dir_problem(top, os.getuid())
    exists = os.path.lexists(top)
    is_dir = exists and problem is None
    copies = copies_dir(request)
    budget = _Budget(max_files)
    answer: Answer = {
        "ok": True, "node": node_name(request), "dir": top, "exists": exists,
        "is_dir": exists and os.path.isdir(top) and not os.path.islink(top),
        "writable": _writable(top, is_dir), "problem": problem,
        "free_bytes": free_bytes(top), "copies_dir": copies,
        "copies_free_bytes": free_bytes(copies),
        "marker_seen": _markers(request, top, is_dir), "truncated": False,
        "entries": _entries(top, budget) if is_dir else [],
        "copies": [{"entry": part.entry, "writer": part.writer, "files": list(part.files)}
                   for part in whole_parts(copies)],
    }  # fmt: skip
    if budget.truncated:
        answer["truncated"] = True
    return answer


# ----- send ----------------------------------------------------------------------------------
def lower_priority() -> bool:
    """This process at the lowest CPU priority, and in the idle I/O class when `ionice` is
    there (the job's own reads and writes come first); whether the I/O class was set."""
    with contextlib.suppress(OSError):
        os.nice(19)
    ionice = shutil.which("ionice")
    if ionice is None:
        return False
    try:
        done = subprocess.run([ionice, "-c", "3", "-p", str(os.getpid())],
                              capture_output=True, timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _outgoing(request: Request, item: Mapping[str, Any], copies: str,
              entry: str) -> stream.Outgoing:  # fmt: skip
    path = stream.relative_path(item["path"])
    if item.get("from", "dir") == "dir":
        return stream.Outgoing(path, str(request["dir"]))
    if item["from"] != "copy":
        raise ValueError(f"a file comes from 'dir' or 'copy', not {item['from']!r}")
    writer = _writer_name(item.get("writer") or request["writer"])
    return stream.Outgoing(path, os.path.join(copies, entry, writer))


@_answering
def send(request: Request, lower: Callable[[], bool] = lower_priority) -> Answer:
    """Files of PATH ("dir") or of a copy kept here ("copy"; each file may name its own
    `writer`) to the receiving node, once it answered the link's secret."""
    io_idle = lower()
    entry = _entry_name(request["entry"])
    from_copies = any(item.get("from") == "copy" for item in request["files"])
    copies = copies_dir(request) if from_copies else ""
    files = [_outgoing(request, item, copies, entry) for item in request["files"]]
    hop = relay.Hop.from_dict(request["hop"])
    host, port = str(request["host"]), int(request["port"])
    try:
        conn = relay.connect_downstream(host, port, hop)
    except OSError as err:
        raise StepError(f"cannot reach the receiving node at {host}:{port} ({err}): its port "
                        "is closed, or blocked between the nodes") from None  # fmt: skip
    try:
        sent = stream.write_stream(conn.sendall, files, int(request.get("bandwidth") or 0))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
    finally:
        conn.close()
    answer: Answer = {"ok": not sent.changed, "bytes": sent.bytes, "sha256": dict(sent.sha256),
                      "changed": list(sent.changed), "io_idle": io_idle}  # fmt: skip
    if sent.changed:
        why = "; ".join(sent.unreadable.values()) or ", ".join(sent.changed[:3])
        answer["error"] = (f"on {node_name(request)}: {len(sent.changed)} file(s) of {entry} "
                           f"changed while sent ({why}): it is sent again once it is quiet")
    return answer


# ----- receive -------------------------------------------------------------------------------
def _route(read_line: ReadLine) -> dict[str, Any]:
    line = read_line()
    if not line:
        raise StepError("the head went away before it said where the files come from")
    route = json.loads(line)
    if not isinstance(route, dict):
        raise StepError("the head's route line is not one: run a matching orch")
    return route


def _check_room(where: str, need: int, margin: int, what: str) -> None:
    free = free_bytes(where)
    if free < need + margin:
        raise StepError(
            f"{where} has {free} bytes free; {what} needs {need} bytes with {margin} left free: "
            "free space there, or set ORCH_NODE_ROOT (copies) or --checkpoint-dir to a "
            "filesystem with room")  # fmt: skip


def _write_manifest(entry_dir: str, writer: str, got: stream.Received) -> None:
    files = [{"path": path, "size": digest.size, "sha256": digest.sha256}
             for path, digest in sorted(got.files.items())]  # fmt: skip
    part = os.path.join(entry_dir, f".{writer}{MANIFEST_SUFFIX}.new")
    owned.write_private_file(part, json.dumps({"files": files}).encode())
    os.replace(part, os.path.join(entry_dir, writer + MANIFEST_SUFFIX))


def _remove(path: str) -> None:
    """`path` gone, whatever it is; a link is removed, never followed."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def place_part(copies: str, entry: str, writer: str, received: str,
               got: stream.Received) -> None:  # fmt: skip
    """The part received whole (in `received`, a directory in `copies`) put in place of any
    older copy of it, then its manifest: it is listed only once whole, never mixed."""
    entry_dir = os.path.join(copies, entry)
    owned.private_directory(entry_dir, os.getuid())
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(entry_dir, writer + MANIFEST_SUFFIX))
    target = os.path.join(entry_dir, writer)
    aside = None
    if os.path.lexists(target):
        aside = os.path.join(copies, OLD_PREFIX + secrets.token_hex(8))
        os.rename(target, aside)
    os.rename(received, target)
    _write_manifest(entry_dir, writer, got)
    if aside is not None:
        _remove(aside)


def _missing(wanted: Mapping[str, stream.Wanted], got: Mapping[str, Any]) -> None:
    lost = sorted(set(wanted) - set(got))
    if lost:
        raise StepError(f"{len(lost)} file(s) never arrived (e.g. {lost[0]}): the sender "
                        "stopped early; nothing of it is kept")  # fmt: skip


@_answering
def receive(request: Request, read_line: ReadLine, write_line: WriteLine,
            head_gone: threading.Event | None = None) -> Answer:  # fmt: skip
    """One writer's part of an entry into the copies here, whole or not at all."""
    entry, writer = _entry_name(request["entry"]), _writer_name(request["writer"])
    wanted = {stream.relative_path(item["path"]): stream.Wanted(int(item["size"]))
              for item in request["files"]}  # fmt: skip
    copies = copies_dir(request)
    _check_room(copies, sum(w.size for w in wanted.values()),
                int(request.get("free_margin") or 0), f"the copy of {entry} from {writer}")
    server = relay.open_port()
    try:
        write_line({"ready": True, "port": server.getsockname()[1]})
        hop = relay.Hop.from_dict(_route(read_line)["hop"])
        deadline = time.monotonic() + relay.STALL_S
        conn = relay.accept_upstream(server, hop, deadline, head_gone or threading.Event())
    finally:
        server.close()
    received = tempfile.mkdtemp(prefix=PART_PREFIX, dir=copies)
    try:
        with conn, conn.makefile("rb") as source:
            got = stream.read_stream(source, wanted, received)
        _missing(wanted, got.files)
        place_part(copies, entry, writer, received, got)
    finally:
        _remove(received)  # gone already once placed
    return {"ok": True, "bytes": got.bytes, "files": len(got.files)}


# ----- stage ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageFile:
    path: str
    size: int
    sha256: str


def _stage_files(request: Request, entry: str) -> list[StageFile]:
    kind = request["kind"]
    files = [StageFile(stream.relative_path(item["path"]), int(item["size"]),
                       str(item["sha256"]).lower()) for item in request["files"]]  # fmt: skip
    for item in files:
        inside = item.path == entry if kind == "file" else item.path.startswith(entry + "/")
        if kind not in ("file", "dir") or not inside or len(item.sha256) != _SHA256_HEX:
            raise ValueError(f"{item.path} is not a file of the {kind} {entry} with its sha256")
    if kind == "file" and len(files) != 1:
        raise ValueError(f"the file {entry} is listed {len(files)} times")
    return files


def _pointer_files(request: Request) -> dict[str, str]:
    writes = {}
    for name, text in dict(request.get("write") or {}).items():
        checked = stream.one_name(name, "pointer file")
        if checked.startswith("."):
            raise stream.UnsafePath(f"pointer file {checked!r}, a hidden name")
        writes[checked] = str(text)
    return writes


def _is_same(top: str, item: StageFile) -> bool:
    """Whether `top`/<path> is a regular file of the item's size and sha256."""
    try:
        if os.stat(os.path.join(top, item.path), follow_symlinks=False).st_size != item.size:
            return False
        return stream.sha256_of_file(top, item.path) == (item.size, item.sha256)
    except OSError:
        return False


def _link_into(top: str, path: str, staging: str) -> None:
    """PATH's own file (found whole) into the staging directory, as a second name of it."""
    fd, name = stream.parent_below(staging, path, 0o666)
    try:
        os.link(os.path.join(top, path), name, dst_dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)


def _copy_verified(top: str, item: StageFile, staging: str) -> bool:
    """A kept copy's file into the staging directory, hashed as it is copied; False (and
    nothing left of it) when it is not the file asked for."""
    try:
        source = stream.open_below(top, item.path)
    except OSError:
        return False
    target = stream.create_below(staging, item.path, 0o666)
    digest, size = hashlib.sha256(), 0
    try:
        while chunk := os.read(source, stream.CHUNK):
            digest.update(chunk)
            stream.write_all(target, chunk)
            size += len(chunk)
    finally:
        os.close(source)
        os.close(target)
    if (size, digest.hexdigest()) == (item.size, item.sha256):
        return True
    os.unlink(os.path.join(staging, item.path))
    return False


def _kept_copies(copies: str, entry: str) -> dict[tuple[str, str], list[str]]:
    """(path, sha256) -> the part directories here whose manifest lists that file."""
    found: dict[tuple[str, str], list[str]] = {}
    for part in whole_parts(copies, entry):
        for item in part.files:
            found.setdefault((item["path"], item["sha256"]), []).append(part.top)
    return found


@dataclass(frozen=True)
class Sorted:
    have: tuple[StageFile, ...]  # PATH has them, whole
    local: tuple[StageFile, ...]  # the copies here have them, checked
    missing: tuple[StageFile, ...]


def _gather(top: str, copies: str, entry: str, files: list[StageFile], staging: str,
            margin: int) -> Sorted:  # fmt: skip
    """Each file sorted, and what is here put into the staging directory."""
    have = [item for item in files if _is_same(top, item)]
    had = {item.path for item in have}
    others = [item for item in files if item.path not in had]
    _check_room(top, sum(item.size for item in others), margin, f"the checkpoint {entry}")
    for item in have:
        _link_into(top, item.path, staging)
    kept = _kept_copies(copies, entry)
    local, missing = [], []
    for item in others:
        places = kept.get((item.path, item.sha256), [])
        found = any(_copy_verified(place, item, staging) for place in places)
        (local if found else missing).append(item)
    return Sorted(tuple(have), tuple(local), tuple(missing))


def _receive_from_all(server: socket.socket, hops: list[relay.Hop],
                      wanted: Mapping[str, stream.Wanted], staging: str,
                      head_gone: threading.Event) -> list[stream.Received]:  # fmt: skip
    """Every sender's stream into the staging directory, side by side, in any order of
    arrival. Each hop's accept shares the one port: a sender that reached another hop's
    accept is closed there and connects again (connect_downstream retries), so the port is
    never held up by a wrong caller."""
    server.setblocking(False)  # the accept that loses a connection to another must not wait
    claims, results, errors = stream.Claims(), [], []
    deadline = time.monotonic() + relay.STALL_S

    def take(hop: relay.Hop) -> None:
        try:
            conn = relay.accept_upstream(server, hop, deadline, head_gone)
            with conn, conn.makefile("rb") as source:
                results.append(stream.read_stream(source, wanted, staging, claims, 0o666))
        except (OSError, EOFError, stream.StreamError) as err:
            errors.append(err)

    threads = [threading.Thread(target=take, args=(hop,), daemon=True) for hop in hops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        first = errors[0]
        if isinstance(first, stream.StreamError):
            raise first
        raise StepError(f"a sender's stream failed: {first}: nothing is staged")
    return results


def _exchange(new: str, old: str) -> None:
    """`new` and `old` swapped in one step (renameat2 RENAME_EXCHANGE); OSError where the
    filesystem cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        raise OSError(0, "renameat2 is not available") from None
    if renameat2(_AT_FDCWD, new.encode(), _AT_FDCWD, old.encode(), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), old)


def swap_in(top: str, entry: str, staging: str) -> None:
    """<staging>/<entry> put at PATH/<entry>: exchanged with the old one in one step where
    the filesystem can (else the old one renamed aside first), which is then removed."""
    new, target = os.path.join(staging, entry), os.path.join(top, entry)
    if not os.path.lexists(target):
        os.rename(new, target)
        return
    try:
        _exchange(new, target)
        old = new
    except OSError:
        old = os.path.join(top, OLD_PREFIX + secrets.token_hex(8))
        os.rename(target, old)
        os.rename(new, target)
    _remove(old)


def write_pointers(top: str, writes: Mapping[str, str]) -> None:
    """Each pointer file at PATH's top, written to a temporary name, then renamed."""
    for name, text in writes.items():
        part = os.path.join(top, OWN_PREFIX + "write-" + secrets.token_hex(8))
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(part, os.path.join(top, name))


def _prepared_dir(top: str) -> None:
    if not os.path.isabs(top):
        raise StepError(f"--checkpoint-dir {top!r} is not an absolute path: give one")
    if not os.path.lexists(top):
        os.makedirs(top, exist_ok=True)
    problem = checkpoint_dir_problem(top, os.getuid())
    if problem is not None:
        raise StepError(problem)


@_answering
def stage(request: Request, read_line: ReadLine, write_line: WriteLine,
          head_gone: threading.Event | None = None) -> Answer:  # fmt: skip
    """The whole checkpoint into PATH/<entry>, each file checked by its sha256, then the
    pointer files; PATH/<entry> is left as it was when anything is missing."""
    top = str(request["dir"])
    entry = _entry_name(request["entry"])
    files, writes = _stage_files(request, entry), _pointer_files(request)
    _prepared_dir(top)
    copies = copies_dir(request)
    staging = tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=top)  # PATH's filesystem: renamed in
    try:
        found = _gather(top, copies, entry, files, staging, int(request.get("free_margin") or 0))
        write_line({"missing": [item.path for item in found.missing], "have": len(found.have),
                    "local": len(found.local)})  # fmt: skip
        received = _receive_missing(found.missing, staging, read_line, write_line, head_gone)
        swap_in(top, entry, staging)
    finally:
        _remove(staging)
    write_pointers(top, writes)
    aside = set_aside(top, [_entry_name(name) for name in request.get("set_aside") or ()])
    return {"ok": True, "received_bytes": sum(got.bytes for got in received),
            "received": sum(len(got.files) for got in received),
            "reused": len(found.have) + len(found.local), "set_aside": aside}  # fmt: skip


def set_aside(top: str, entries: list[str]) -> list[str]:
    """Entries newer than the staged checkpoint that cannot be made whole, moved out of
    the framework's sight (a script that loads the newest entry would take one of them) into
    PATH/.orch-set-aside/, not deleted: they are the user's. Returns those moved."""
    moved = []
    for name in entries:
        if not os.path.lexists(os.path.join(top, name)):
            continue
        aside = os.path.join(top, ASIDE_DIR)
        os.makedirs(aside, mode=0o700, exist_ok=True)
        target = os.path.join(aside, name)
        if os.path.lexists(target):
            target = tempfile.mkdtemp(prefix=name + ".", dir=aside)
            target = os.path.join(target, name)
        os.rename(os.path.join(top, name), target)
        moved.append(name)
    return moved


def _receive_missing(missing: tuple[StageFile, ...], staging: str, read_line: ReadLine,
                     write_line: WriteLine,
                     head_gone: threading.Event | None) -> list[stream.Received]:  # fmt: skip
    if not missing:
        return []
    wanted = {item.path: stream.Wanted(item.size, item.sha256) for item in missing}
    server = relay.open_port()
    try:
        write_line({"ready": True, "port": server.getsockname()[1]})
        hops = [relay.Hop.from_dict(hop) for hop in _route(read_line)["hops"]]
        if not hops:
            raise StepError(f"{len(missing)} file(s) are missing and no node sends them")
        received = _receive_from_all(server, hops, wanted, staging,
                                     head_gone or threading.Event())  # fmt: skip
    finally:
        server.close()
    _missing(wanted, {path: True for got in received for path in got.files})
    return received


# ----- prune ---------------------------------------------------------------------------------
def _remove_entry_copies(entry_dir: str) -> None:
    """The manifests first (no part is listed as whole meanwhile), then everything."""
    for name in os.listdir(entry_dir):
        if name.endswith(MANIFEST_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(entry_dir, name))
    shutil.rmtree(entry_dir)


@_answering
def prune(request: Request) -> Answer:
    """The copies of every entry not in `keep` (null: none kept) removed, or with `drop` the
    job's whole copies directory."""
    copies = _existing_copies_dir(request)
    if copies is None:
        return {"ok": True, "removed": []}
    entries = sorted(name for name in os.listdir(copies) if not name.startswith("."))
    if request.get("drop"):
        shutil.rmtree(copies)
        return {"ok": True, "removed": entries}
    keep = set(request.get("keep") or ())
    removed = [name for name in entries if name not in keep]
    for name in removed:
        path = os.path.join(copies, name)
        if os.path.islink(path) or not os.path.isdir(path):
            _remove(path)
        else:
            _remove_entry_copies(path)
    return {"ok": True, "removed": removed}


# ----- the program -----------------------------------------------------------------------------
def _say(doc: Answer) -> None:
    with contextlib.suppress(OSError):  # the head may be gone
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


def _route_then_watch(gone: threading.Event) -> ReadLine:
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


def _run(step: str, request: Any) -> Answer:
    if not isinstance(request, dict):
        return {"ok": False, "error": f"on {socket.gethostname()}: no request came on stdin"}
    if step in ("scan", "prune"):
        return scan(request) if step == "scan" else prune(request)
    if step == "send":
        return send(request)
    gone = threading.Event()
    talk = receive if step == "receive" else stage
    return talk(request, _route_then_watch(gone), _say, gone)


def main(argv: list[str]) -> int:
    step = argv[0] if argv else ""
    if step not in ("scan", "send", "receive", "stage", "prune"):
        _say({"ok": False, "error": f"unknown step {step!r}: scan, send, receive, stage or "
              "prune (run a matching orch)"})  # fmt: skip
        return 2
    try:
        request = json.loads(sys.stdin.readline() or "null")
        answer = _run(step, request)
    except Exception as err:  # the head reads one JSON line, never a traceback
        answer = {"ok": False, "error": f"on {socket.gethostname()}: {step} failed: "
                  f"{type(err).__name__}: {err}"}  # fmt: skip
    _say(answer)
    return 0 if answer.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
