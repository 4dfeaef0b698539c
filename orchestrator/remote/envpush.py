"""`orch env push` on a node: STANDARD LIBRARY ONLY, shipped inline (`python -c`), with
environment.py, owned.py, procs.py, digest.py, env_lock.py and its own parts loaded beside
it (as orch_<name>): envpush_manifest.py (what a node has, what it lacks), envpush_staging.py (the
new environment built beside the old and swapped in, under the push's lock) and
envpush_relay.py (the port the stream comes in on, and its passing on). Run with the base
interpreter the head's environment was made from, so what it reports is what the
environment will run on.

- look: {"root", "marker"} as its argument, one JSON line printed: is the head's directory
  seen here (the marker the head wrote in it: a shared filesystem, left alone), this
  interpreter's version, ABI and platform, the free disk where the root is (or would be),
  whether the root is a mount point, the processes (and orch jobs) running from it, and the
  manifest of what the root holds now (zlib + base64 JSON: relative path -> [kind, size,
  sha256 or link target, mode]). Hashes of files whose size, mtime and inode match the
  manifest of the last push are taken from it rather than read again; a root or record
  that is not the user's own is refused instead ("refused": {"problem", "fix"}).
- receive: lines on stdin, lines on stdout. (1) {"root", "manifest_sha256", "listen",
  "force"}: takes the push's lock for the root (one push at a time per user and root),
  removes what an interrupted push left, opens a TCP port when asked, and says
  {"ready", "port"}. (2) {"source": "stdin" | "tcp", "hop", "forward": {"host", "port",
  "hop"} | null}: where the stream comes from (the head's stdin, or the previous node on
  the port, which must present its link's secret and is answered with the other: `hop`),
  and the next node to pass it on to, byte for byte, as it arrives (once that node has
  answered its link's secret: forward's `hop`). The stream is a tar: first the head's
  whole manifest (checked against the sha256 the head sent over its own channel), then
  every file some node of the push needs. This node computes its own delta from that
  manifest, keeps only its files (each checked against the manifest: a file's sha256, a
  link's target), builds the new environment in a sibling directory (hard links for what
  did not change) and swaps it in with one rename (renameat2 RENAME_EXCHANGE): a process
  starting meanwhile sees the old environment or the new one, never half of each. Just
  before the swap it takes the environment's lock (remote/env_lock.py) exclusively and
  looks again for processes running from the root: a job started since the look (whose
  agent holds that lock shared while it starts and runs) refuses the swap, unless forced
  ({"ok": false, "refused": true, "error", "fix", "running"}). It passes the stream on
  even when its own build fails, so one bad node does not cut the chain. Anything wrong
  (a hash, a stream that ends early, the head going away) removes the sibling and leaves
  the root as it was; the head going away (stdin's end, a signal) only stops the build,
  and the main thread removes it or, past the last check, swaps it in. (3) The answer,
  one JSON line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NoReturn

try:  # on a node, loaded beside this program
    import orch_env_lock as env_lock
    import orch_environment as environment
    import orch_envpush_manifest as envpush_manifest
    import orch_envpush_relay as envpush_relay
    import orch_envpush_staging as envpush_staging
    import orch_filesystem as filesystem
    import orch_procs as procs
except ImportError:
    from orchestrator.remote import (
        env_lock,
        environment,
        envpush_manifest,
        envpush_relay,
        envpush_staging,
        filesystem,
        procs,
    )


# ----- look: what the node has ------------------------------------------------------------
def _running_from(root: str) -> list[list[Any]]:
    """[pid, orch job id or None] of processes running from the root: their executable is
    there, or the interpreter they were started as (a venv's bin/python is a link to its
    base interpreter)."""
    places = (os.path.realpath(root) + "/", root.rstrip("/") + "/")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            exe = os.readlink(f"/proc/{name}/exe")
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                first = handle.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if any(p.startswith(places) for p in (exe, first)):
            env = procs.environ_of(int(name)) or {}
            found.append([int(name), env.get(procs.JOB_ID_VAR)])
    return found


def look(request: dict[str, Any]) -> dict[str, Any]:
    root = os.path.realpath(request["root"])  # a link to the environment: its target
    exists = os.path.isdir(root)
    shared = exists and os.path.exists(os.path.join(root, request["marker"]))
    answer = {
        "shared": shared,
        "exists": exists,
        "real_root": root,
        "mount_point": exists and os.path.ismount(root),
        "interpreter": environment.interpreter(),
        "platform": environment.platform_facts(),
        "executable": sys.executable,
        "free_bytes": filesystem.free_bytes(root),
        "running": _running_from(root) if exists else [],
        "manifest": None,
    }
    refused = envpush_manifest.root_problem(root) if exists and not shared else None
    if refused is not None:
        answer["refused"] = {"problem": refused.message, "fix": refused.fix}
    elif exists and not shared:
        found = envpush_manifest.manifest(root, envpush_manifest.recorded(root),
                                          owner=os.getuid())  # fmt: skip
        answer["manifest"] = envpush_manifest.pack(found)
    return answer


# ----- receive: the stream, from the head or the previous node, on to the next -------------
class SwapGuard:
    """Around the swap, under the push's lock: the environment's lock held exclusively and
    no process running from the root, or the swap refused (`refused` says why and the fix;
    forced, only a lock file that is not the user's refuses it)."""

    def __init__(self, root: str, force: bool) -> None:
        self.root, self.force = root, force
        self.refused: dict[str, Any] | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        lock = self._take()
        try:
            yield
        finally:
            if lock is not None:
                os.close(lock)

    def _take(self) -> int | None:
        path = env_lock.lock_path(self.root)
        try:
            lock = env_lock.take_exclusive(self.root)
        except env_lock.NotALock as err:
            self._refuse(str(err), f"remove {path} (it is not orch's) and push again")
        running = [] if self.force else _running_from(self.root)
        if (lock is None or running) and not self.force:
            if lock is not None:
                os.close(lock)
            self._refuse(*_started_since(self.root, path, running), running)
        return lock

    def _refuse(self, problem: str, fix: str, running: list[list[Any]] | None = None) -> NoReturn:
        self.refused = {"refused": True, "error": problem, "fix": fix, "running": running or []}
        raise ValueError(problem)


def _started_since(root: str, lock: str, running: list[list[Any]]) -> tuple[str, str]:
    """(problem, fix) for jobs started from the root since the push looked: its processes
    running from it, or only its hold on the lock (an agent starting it)."""
    jobs = sorted({str(job) for _, job in running if job})
    pids = ", ".join(str(pid) for pid, _ in running[:5])
    what = f"orch job {', '.join(jobs)} (pids {pids})" if jobs else f"processes (pids {pids})"
    if not running:
        what = f"an orch job (holding {lock})"
    kill = f"`orch kill {jobs[0]}`" if jobs else "stop it"
    return (
        f"{what} started from {root} since the push looked: the swap would change the "
        "environment under it, the previous environment is kept",
        f"wait for the job to end (or {kill}) and push again, or push with --force",
    )


def _say(doc: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the head may be gone
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


def _watch_stdin(
    stdin: io.BufferedReader,
    gone: threading.Event,
    finished: threading.Event,
    staging: envpush_staging.Staging,
) -> None:
    """With the stream on a port, stdin only says the head is there: its end before the
    answer (the head's channel closed) abandons the push. It only says so: the main thread
    stops its build and removes it (or has swapped it in already)."""
    stdin.read()
    gone.set()
    if not finished.is_set():
        staging.stop(1)


def relay_main(stdin: io.BufferedReader) -> int:
    request = json.loads(stdin.readline() or "null")
    if not request:
        return 1  # the head went away before it asked anything
    root = os.path.realpath(request["root"])
    lock = envpush_staging.take_lock(root, str(request.get("node_root") or ""))
    if lock is None:
        _say({"ok": False, "error": f"another orch env push of {root} is running on this "
              "node: wait for it to end"})  # fmt: skip
        return 1
    envpush_staging.remove_stale(root)
    server = envpush_relay.open_port() if request.get("listen") else None
    _say({"ready": True, "port": server.getsockname()[1] if server else None})
    route = json.loads(stdin.readline() or "null")
    if not route:
        return 1  # the head went away before the stream
    staging = envpush_staging.Staging(root)
    staging.on_signals()
    gone, finished = staging.stopped, threading.Event()  # a signal, too, ends the wait
    upstream = None
    try:
        if route["source"] == "tcp":
            watch = (stdin, gone, finished, staging)
            threading.Thread(target=_watch_stdin, args=watch, daemon=True).start()
            deadline = time.monotonic() + envpush_relay.STALL_S
            hop = envpush_relay.Hop.from_dict(route["hop"])
            upstream = envpush_relay.accept_upstream(server, hop, deadline, gone)
            read = staging.guard(upstream.recv)
        else:
            read = staging.guard(stdin.read1)
    except (OSError, EOFError, ValueError, KeyError) as err:
        os.close(lock)
        _say({"ok": False, "upstream_lost": True, "error": str(err)})
        return 1
    if server is not None:
        server.close()
    downstream, forward_error = _connect_forward(route.get("forward"))
    stream = envpush_relay.Relay(read, downstream)
    guard = SwapGuard(root, bool(request.get("force")))
    answer = envpush_staging.receive(root, request["manifest_sha256"], stream, staging, guard)
    answer.update(guard.refused or {})
    cut = stream.read_error  # a stream that only ended early is told by the head
    with contextlib.suppress(envpush_staging.Abandoned), staging.interruptible():
        stream.drain()
    stream.drop()
    if upstream is not None:
        upstream.close()
    if not answer["ok"] and cut:
        answer["upstream_lost"] = True
        answer["error"] = f"{answer['error']} ({cut})"
    answer["relayed_bytes"] = stream.total if downstream is not None else 0
    answer["forward_error"] = forward_error or stream.forward_error
    finished.set()
    os.close(lock)  # before the answer: the head may start the next round at once
    _say(answer)
    if staging.stopped.is_set():
        return staging.code
    return 0 if answer["ok"] else 1


def _connect_forward(forward: dict[str, Any] | None) -> tuple[socket.socket | None, str | None]:
    """(the next node's connection, or why there is none)."""
    if not forward:
        return None, None
    try:
        hop = envpush_relay.Hop.from_dict(forward["hop"])
        return envpush_relay.connect_downstream(forward["host"], forward["port"], hop), None
    except (OSError, ValueError, KeyError) as err:
        return None, f"cannot reach {forward.get('host')}: {err}"


def main(argv: list[str]) -> int:
    if argv[0] == "look":
        _say(look(json.loads(argv[1])))
        return 0
    return relay_main(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
