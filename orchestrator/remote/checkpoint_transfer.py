"""One node's part of a checkpoint copied to another node: the send and receive steps of the
checkpoint program (remote/checkpoint_node.py), over remote/checkpoint_stream.py's wire.

- send: files of PATH (or of a copy kept here) to another node's port, at low priority
  (nice, the idle I/O class) and under a bandwidth cap; a file that changed while read is
  named, not passed as whole.
- receive: one node's part of a checkpoint into this node's copies, taken only when every
  listed file arrived whole, then renamed into place with its manifest.

STANDARD LIBRARY ONLY, shipped beside the program (as orch_checkpoint_transfer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

try:  # on a node, loaded beside the program
    import orch_checkpoint_places as places
    import orch_checkpoint_step as steps
    import orch_checkpoint_stream as stream
    import orch_envpush_relay as relay
except ImportError:
    from orchestrator.remote import checkpoint_places as places
    from orchestrator.remote import checkpoint_step as steps
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import envpush_relay as relay


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


def _outgoing(request: steps.Request, item: Mapping[str, Any], copies: str,
              entry: str) -> stream.Outgoing:  # fmt: skip
    path = stream.relative_path(item["path"])
    if item.get("from", "dir") == "dir":
        return stream.Outgoing(path, str(request["dir"]))
    if item["from"] != "copy":
        raise ValueError(f"a file comes from 'dir' or 'copy', not {item['from']!r}")
    writer = places.writer_name(item.get("writer") or request["writer"])
    return stream.Outgoing(path, os.path.join(copies, entry, writer))


@steps.answering
def send(request: steps.Request,
         lower: Callable[[], bool] = lower_priority) -> steps.Answer:  # fmt: skip
    """Files of PATH ("dir") or of a copy kept here ("copy"; each file may name its own
    `writer`) to the receiving node, once it answered the link's secret."""
    io_idle = lower()
    entry = places.entry_name(request["entry"])
    from_copies = any(item.get("from") == "copy" for item in request["files"])
    copies = places.copies_dir(request) if from_copies else ""
    files = [_outgoing(request, item, copies, entry) for item in request["files"]]
    hop = relay.Hop.from_dict(request["hop"])
    host, port = str(request["host"]), int(request["port"])
    try:
        conn = relay.connect_downstream(host, port, hop)
    except OSError as err:
        raise steps.StepError(f"cannot reach the receiving node at {host}:{port} ({err}): its port "
                        "is closed, or blocked between the nodes") from None  # fmt: skip
    try:
        sent = stream.write_stream(conn.sendall, files, int(request.get("bandwidth") or 0))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
    finally:
        conn.close()
    answer: steps.Answer = {"ok": not sent.changed, "bytes": sent.bytes,
                            "sha256": dict(sent.sha256), "changed": list(sent.changed),
                            "io_idle": io_idle}  # fmt: skip
    if sent.changed:
        why = "; ".join(sent.unreadable.values()) or ", ".join(sent.changed[:3])
        answer["error"] = (f"on {steps.node_name(request)}: {len(sent.changed)} file(s) of {entry} "
                           f"changed while sent ({why}): it is sent again once it is quiet")
    return answer


# ----- receive -------------------------------------------------------------------------------
@steps.answering
def receive(request: steps.Request, read_line: steps.ReadLine, write_line: steps.WriteLine,
            head_gone: threading.Event | None = None) -> steps.Answer:  # fmt: skip
    """One writer's part of an entry into the copies here, whole or not at all."""
    entry, writer = places.entry_name(request["entry"]), places.writer_name(request["writer"])
    wanted = {stream.relative_path(item["path"]): stream.Wanted(int(item["size"]))
              for item in request["files"]}  # fmt: skip
    copies = places.copies_dir(request)
    places.check_room(copies, sum(w.size for w in wanted.values()),
                      int(request.get("free_margin") or 0),
                      f"the copy of {entry} from {writer}")  # fmt: skip
    server = relay.open_port()
    try:
        write_line({"ready": True, "port": server.getsockname()[1]})
        hop = relay.Hop.from_dict(steps.read_route(read_line)["hop"])
        deadline = time.monotonic() + relay.STALL_S
        conn = relay.accept_upstream(server, hop, deadline, head_gone or threading.Event())
    finally:
        server.close()
    received = tempfile.mkdtemp(prefix=places.PART_PREFIX, dir=copies)
    try:
        with conn, conn.makefile("rb") as source:
            got = stream.read_stream(source, wanted, received)
        steps.none_missing(wanted, got.files)
        places.place_part(copies, entry, writer, received, got)
    finally:
        places.remove(received)  # gone already once placed
    return {"ok": True, "bytes": got.bytes, "files": len(got.files)}
