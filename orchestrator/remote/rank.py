"""orch-rank: the per-rank start-up, run by the node's launcher in place of the training script.

STANDARD LIBRARY ONLY, shipped inline with the agent, which writes it to the job's node
directory with a small `orch-rank` program on the launcher's PATH. Every launcher starts
it through its own option for this: accelerate and DeepSpeed `--no_python orch-rank`,
torchrun `--no-python orch-rank`. For one rank it

1. reads the rank's exact command (interpreter, script, the user's arguments) from the
   node directory, where the agent wrote it: nothing the user typed passes through a
   launcher's command line or a shell on the node;
2. connects its stdout and stderr to the agent, each on a connection of its own that
   names the rank (RANK, LOCAL_RANK, set by the launcher), so no other rank's bytes can
   land inside its lines;
3. gives the rank its own TORCHELASTIC_ERROR_FILE where the launcher set none;
4. puts the agent's sitecustomize (remote/rank_site.py) first on the rank's PYTHONPATH,
   so its stack can be taken on a signal where py-spy cannot;
5. replaces itself with the rank's command (exec): same pid, so the launcher's signals
   and exit codes are the rank's own.

When the agent cannot be reached, the rank still starts, with the launcher's pipes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import MutableMapping

START_DIR = "bin"  # under the node directory: start-up files, not logs, so never pulled back
COMMAND_FILE = os.path.join(START_DIR, "rank.json")
SITE_DIR = os.path.join(START_DIR, "site")  # sitecustomize.py: stacks without ptrace
SITE_DIR_VAR = "ORCH_RANK_SITE"
NODE_DIR_VAR = "ORCH_NODE_DIR"
CONNECT_TIMEOUT_S = 10.0


def rank_ids(environ: dict[str, str]) -> tuple[int, int] | None:
    """(global rank, local rank) as the launcher set them."""
    try:
        return int(environ["RANK"]), int(environ.get("LOCAL_RANK", "0"))
    except (KeyError, ValueError):
        return None


def rank_command(command: list[str], launcher_args: list[str]) -> list[str]:
    """The rank's argv: the interpreter and script, then what the launcher added (as it
    would have passed it right after the script), then the user's own arguments."""
    return [*command[:2], *launcher_args, *command[2:]]


def _connect(path: str, header: dict[str, object]) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    conn.connect(path)
    conn.sendall(json.dumps(header).encode() + b"\n")
    conn.settimeout(None)
    conn.shutdown(socket.SHUT_RD)  # the agent never writes back
    return conn


def own_streams(path: str, rank: int, local_rank: int) -> bool:
    """Put fd 1 and 2 on connections of their own to the agent; False if it cannot be reached
    (then both stay as they are)."""
    who = {"rank": rank, "local_rank": local_rank, "pid": os.getpid()}
    try:
        conns = [_connect(path, {**who, "stream": stream}) for stream in ("out", "err")]
    except OSError:
        return False
    for fd, conn in zip((1, 2), conns, strict=True):
        os.dup2(conn.fileno(), fd)
        conn.close()
    return True


def use_site(site_dir: str, environ: MutableMapping[str, str]) -> None:
    """Put `site_dir` first on PYTHONPATH (its sitecustomize takes itself back out)."""
    if not os.path.isfile(os.path.join(site_dir, "sitecustomize.py")):
        return
    environ[SITE_DIR_VAR] = site_dir
    rest = environ.get("PYTHONPATH", "")
    environ["PYTHONPATH"] = site_dir + (os.pathsep + rest if rest else "")


def main(argv: list[str]) -> int:
    directory = os.environ.get(NODE_DIR_VAR, "")
    try:
        with open(os.path.join(directory, COMMAND_FILE), encoding="utf-8") as handle:
            spec = json.load(handle)
    except (OSError, ValueError) as err:
        sys.stderr.write(f"orch-rank: cannot read the rank's command in {directory!r}: {err}\n")
        return 127
    command = rank_command([str(word) for word in spec["argv"]], argv)
    ids = rank_ids(dict(os.environ))
    if ids is not None:
        rank, local_rank = ids
        own_streams(str(spec["socket"]), rank, local_rank)
        os.environ.setdefault(
            "TORCHELASTIC_ERROR_FILE", os.path.join(directory, f"rank{rank}.error.json")
        )
        use_site(os.path.join(directory, SITE_DIR), os.environ)
    try:
        os.execvp(command[0], command)
    except OSError as err:
        sys.stderr.write(f"orch-rank: cannot start {command[0]}: {err}\n")
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
