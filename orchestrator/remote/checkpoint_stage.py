"""A whole checkpoint put back into the job's checkpoint directory (PATH) before a restart:
the stage step of the checkpoint program (remote/checkpoint_node.py). Files already in PATH
(same sha256) and in the copies here are used, the rest received from other nodes (each
sender on its own link to one port); all of it assembled beside PATH's entries and swapped
in, so PATH/<entry> is the old one or the whole new one. Then the framework's pointer files,
and the newer entries that cannot be made whole set aside.

STANDARD LIBRARY ONLY, shipped beside the program (as orch_checkpoint_stage).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

try:  # on a node, loaded beside the program
    import orch_checkpoint_places as places
    import orch_checkpoint_step as steps
    import orch_checkpoint_stream as stream
    import orch_envpush_relay as relay
    import orch_filesystem as filesystem
except ImportError:
    from orchestrator.remote import checkpoint_places as places
    from orchestrator.remote import checkpoint_step as steps
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import envpush_relay as relay
    from orchestrator.remote import filesystem

_SHA256_HEX = 64


@dataclass(frozen=True)
class StageFile:
    path: str
    size: int
    sha256: str


def _stage_files(request: steps.Request, entry: str) -> list[StageFile]:
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


def _pointer_files(request: steps.Request) -> dict[str, str]:
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
    for part in places.whole_parts(copies, entry):
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
    need = sum(item.size for item in others)
    places.check_room(top, need, margin, f"the checkpoint {entry}")
    for item in have:
        _link_into(top, item.path, staging)
    kept = _kept_copies(copies, entry)
    local, missing = [], []
    for item in others:
        holders = kept.get((item.path, item.sha256), [])
        found = any(_copy_verified(place, item, staging) for place in holders)
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
        raise steps.StepError(f"a sender's stream failed: {first}: nothing is staged")
    return results


def swap_in(top: str, entry: str, staging: str) -> None:
    """<staging>/<entry> put at PATH/<entry>: exchanged with the old one in one step where
    the filesystem can (else the old one renamed aside first), which is then removed."""
    new, target = os.path.join(staging, entry), os.path.join(top, entry)
    if not os.path.lexists(target):
        os.rename(new, target)
        return
    try:
        filesystem.exchange(new, target)
        old = new
    except OSError:
        old = os.path.join(top, places.OLD_PREFIX + secrets.token_hex(8))
        os.rename(target, old)
        os.rename(new, target)
    places.remove(old)


def write_pointers(top: str, writes: Mapping[str, str]) -> None:
    """Each pointer file at PATH's top, written to a temporary name, then renamed."""
    for name, text in writes.items():
        part = os.path.join(top, places.OWN_PREFIX + "write-" + secrets.token_hex(8))
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(part, os.path.join(top, name))


def _prepared_dir(top: str) -> None:
    if not os.path.isabs(top):
        raise steps.StepError(f"--checkpoint-dir {top!r} is not an absolute path: give one")
    if not os.path.lexists(top):
        os.makedirs(top, exist_ok=True)
    problem = places.checkpoint_dir_problem(top, os.getuid())
    if problem is not None:
        raise steps.StepError(problem)


@steps.answering
def stage(request: steps.Request, read_line: steps.ReadLine, write_line: steps.WriteLine,
          head_gone: threading.Event | None = None) -> steps.Answer:  # fmt: skip
    """The whole checkpoint into PATH/<entry>, each file checked by its sha256, then the
    pointer files; PATH/<entry> is left as it was when anything is missing."""
    top = str(request["dir"])
    entry = places.entry_name(request["entry"])
    files, writes = _stage_files(request, entry), _pointer_files(request)
    _prepared_dir(top)
    copies = places.copies_dir(request)
    staging = tempfile.mkdtemp(prefix=places.STAGE_PREFIX, dir=top)  # PATH's filesystem: renamed in
    try:
        found = _gather(top, copies, entry, files, staging, int(request.get("free_margin") or 0))
        write_line({"missing": [item.path for item in found.missing], "have": len(found.have),
                    "local": len(found.local)})  # fmt: skip
        received = _receive_missing(found.missing, staging, read_line, write_line, head_gone)
        swap_in(top, entry, staging)
    finally:
        places.remove(staging)
    write_pointers(top, writes)
    aside = set_aside(top, [places.entry_name(name) for name in request.get("set_aside") or ()])
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
        aside = os.path.join(top, places.ASIDE_DIR)
        os.makedirs(aside, mode=0o700, exist_ok=True)
        target = os.path.join(aside, name)
        if os.path.lexists(target):
            target = tempfile.mkdtemp(prefix=name + ".", dir=aside)
            target = os.path.join(target, name)
        os.rename(os.path.join(top, name), target)
        moved.append(name)
    return moved


def _receive_missing(missing: tuple[StageFile, ...], staging: str,
                     read_line: steps.ReadLine, write_line: steps.WriteLine,
                     head_gone: threading.Event | None) -> list[stream.Received]:  # fmt: skip
    if not missing:
        return []
    wanted = {item.path: stream.Wanted(item.size, item.sha256) for item in missing}
    server = relay.open_port()
    try:
        write_line({"ready": True, "port": server.getsockname()[1]})
        hops = [relay.Hop.from_dict(hop) for hop in steps.read_route(read_line)["hops"]]
        if not hops:
            raise steps.StepError(f"{len(missing)} file(s) are missing and no node sends them")
        received = _receive_from_all(server, hops, wanted, staging,
                                     head_gone or threading.Event())  # fmt: skip
    finally:
        server.close()
    steps.none_missing(wanted, {path: True for got in received for path in got.files})
    return received
