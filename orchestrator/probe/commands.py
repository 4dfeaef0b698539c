"""The commands that run orch's programs on a node: the probe (remote/probe.py) and the
collective check (remote/collective.py), each sent inline with `python -c` so that nothing
has to be installed on a node. Pure: builds command strings, never runs anything.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.remote import boot_blob, boot_code, program_source
from orchestrator.specs.constants import SHELL_UP_MARKER

# The probe makes the user's directory as a launch would: with the same parts beside it.
PROBE_PARTS = ("owned", "agent_spec", "ports", "environment", "digest", "filesystem")
PROBE_SOURCE = boot_code(boot_blob(PROBE_PARTS, "probe"))
ENVIRONMENT_SOURCE = boot_code(boot_blob((), "environment"))
COLLECTIVE_SOURCE = program_source("collective")
DEEP_SIZE_BYTES = 16 << 20
DEEP_ITERATIONS = 5

# Run the probe with the job's interpreter; when that is missing, with any
# python3 on the node so the other facts still come back. It says on stderr first that the
# user's shell has started, which times the shell's start-up files. `sh -c` keeps the
# command independent of the user's login shell (fish, csh...).
_LAUNCH = (
    f"echo {SHELL_UP_MARKER} >&2; "  # the login shell has started (ssh.session.ShellClock)
    "PY=$1; FLAGS=$2; SRC=$3; shift 3; "
    'if [ -x "$PY" ]; then exec "$PY" $FLAGS -c "$SRC" "$@"; fi; '
    "for c in python3 python; do if command -v $c >/dev/null 2>&1; then "
    'exec $c $FLAGS -c "$SRC" "$@" --interpreter-missing; fi; done; '
    'echo "no python interpreter on this node" >&2; exit 127'
)


def _sh(python: str, args: Sequence[str], flags: str = "") -> str:
    # flags: "-S" for the stdlib-only uses that need no site-packages scan
    words = ["sh", "-c", _LAUNCH, "sh", python, flags, PROBE_SOURCE, *args]
    return " ".join(shlex.quote(w) for w in words)


def listen_request(port: int, peers: int, window: float) -> dict[str, Any]:
    """Node 0's part of the network pre-flight: hold the port, wait for the peers.

    Node 0 prints a `{"listening": ...}` line first (see `facts.parse_listening`) and
    waits for the peers until `done` arrives on its stdin or `window` passes."""
    return {"role": "listen", "port": port, "peers": peers, "window": window}


def connect_request(address: str, port: int, window: float) -> dict[str, Any]:
    """Every other node's part: connect to the main address and port."""
    return {"role": "connect", "address": address, "port": port, "window": window}


def probe_command(
    python: str,
    *,
    workdir: str | None,
    script: str | None,
    names: Sequence[str],
    main: Mapping[str, Any] | None = None,
    resolve_timeout: float = 3.0,
    node_root: str = "",
) -> str:
    """The remote command that prints one node's facts as JSON (`node_root`: the user's
    ORCH_NODE_ROOT, where the probe makes orch's directory as a launch would)."""
    request = {
        "python": python,
        "workdir": workdir,
        "script": script,
        "names": list(names),
        "main": dict(main) if main else None,
        "resolve_timeout": resolve_timeout,
        **({"node_root": node_root} if node_root else {}),
    }
    return _sh(python, [json.dumps(request)])


def collective_command(
    python: str, address: str, port: int, rank: int, world: int, timeout: float
) -> str:
    args = [address, port, rank, world, timeout, DEEP_SIZE_BYTES, DEEP_ITERATIONS]
    words = [python, "-c", COLLECTIVE_SOURCE, *map(str, args)]
    # NCCL says which transport it picked when asked; gloo ignores it.
    return "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET " + " ".join(map(shlex.quote, words))
