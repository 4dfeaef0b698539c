"""A rank's stack on demand without ptrace: written as `sitecustomize.py` for every rank.

STANDARD LIBRARY ONLY, shipped inline with the agent. orch-rank puts the directory that
holds it first on the rank's PYTHONPATH, so Python's `site` imports it before the
script runs; nothing of the user's script or command changes. It

1. registers faulthandler on SIGUSR2 for every thread, writing into
   `<node dir>/stacks/<pid>.txt`: the node side of `orch stacks` signals the rank and
   reads what was appended. faulthandler dumps from its C signal handler, so a rank
   blocked inside a collective (holding the GIL or not) answers at once, and its
   system calls are restarted, not interrupted;
2. takes its directory back out of PYTHONPATH and sys.path, so the rank's own children
   and imports never see it;
3. enables faulthandler for fatal signals (SIGSEGV, SIGBUS, SIGABRT...), as
   PYTHONFAULTHANDLER would: a rank that dies in native code prints the Python frame it
   stood in, which the head names with the signal;
4. runs the sitecustomize that it shadows, if the environment has one.

Used where py-spy is missing or ptrace is refused (containers without
CAP_SYS_PTRACE, kernel.yama.ptrace_scope=3). A rank started with `python -E`, `-I`
or `-S` skips it: the node then names the rank with that reason.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib.machinery
import importlib.util
import os
import signal
import sys

STACK_SIGNAL = signal.SIGUSR2
SITE_DIR_VAR = "ORCH_RANK_SITE"  # this file's directory, set by orch-rank
NODE_DIR_VAR = "ORCH_NODE_DIR"  # procs.NODE_DIR_VAR: this file runs alone in each rank
STACKS_DIR = "stacks"  # in the node directory: a rank's faulthandler dumps, <pid>.txt

_handle = None  # kept open for faulthandler, for the life of the rank


def stack_file(node_dir: str, pid: int) -> str:
    return os.path.join(node_dir, STACKS_DIR, f"{pid}.txt")


def _forget(site_dir: str) -> None:
    """Take `site_dir` out of PYTHONPATH and sys.path."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != site_dir]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("PYTHONPATH", None)
    sys.path[:] = [p for p in sys.path if p != site_dir]


def _register(node_dir: str) -> None:
    global _handle
    path = stack_file(node_dir, os.getpid())
    # In the node directory (the user's own, 0700): private too, and never through a link.
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    _handle = os.fdopen(os.open(path, flags, 0o600), "ab", buffering=0)
    faulthandler.register(STACK_SIGNAL, file=_handle, all_threads=True, chain=False)


def _run_shadowed() -> None:
    """The environment's own sitecustomize, found on the path without this directory."""
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def install() -> None:
    site_dir = os.environ.pop(SITE_DIR_VAR, "")
    if not site_dir:
        return
    _forget(site_dir)
    node_dir = os.environ.get(NODE_DIR_VAR, "")
    if node_dir and "RANK" in os.environ:
        # Without it the rank runs as ever; the node side names it when asked for its stack.
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            _register(node_dir)
    if not faulthandler.is_enabled():
        with contextlib.suppress(OSError, ValueError, RuntimeError, AttributeError):
            faulthandler.enable(all_threads=True)
    _run_shadowed()


if __name__ == "sitecustomize":
    install()
