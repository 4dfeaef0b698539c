"""On a node, before its agent starts: the job's private settings written into the job's
node directory, or that directory removed again when nothing was started.

Run inline by the head (plan/agent_command.py), with the job's interpreter or any python3.
    write JOB_ID NODE [ROOT]    stdin -> <node directory>/private.json, the user's alone
    remove JOB_ID NODE [ROOT]   the node directory, and the job's when nothing else is left
The node directory is the user's own on this node (/tmp/orch-<uid>/runs/<job>/<node>, the
uid this node's; below ROOT, the user's ORCH_NODE_ROOT, when given): each level is made
under umask 077 and checked (remote/owned.py), so a link or a directory another user made
first is refused, naming its path, owner, mode and the fix, and nothing is written through
it. A failure: one line on stderr, exit 1.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

try:  # on a node, loaded beside this program
    import orch_agent_spec as agent_spec
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import agent_spec, owned


def write(job_id: str, node: str, data: bytes, uid: int, root: str = "") -> str:
    """The settings in the node directory (made and checked first), under their final name
    only once whole; the path written."""
    directory = agent_spec.make_node_dir(job_id, node, uid, root)
    target = os.path.join(directory, agent_spec.PRIVATE_FILE)
    part = target + ".part"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(part)  # a retry's leftover
    owned.write_private_file(part, data)
    os.replace(part, target)
    return target


def _checked(path: str, uid: int) -> bool:
    """Whether `path` is there as a directory of the user's own; raises when something else
    is (nothing is removed through a link or in another user's directory)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    problem = owned.not_own_directory(path, st, uid)
    if problem is not None:
        raise owned.UnsafeDirectory(problem)
    return True


def remove(job_id: str, node: str, uid: int, root: str = "") -> None:
    """The node directory gone; its job's directory too when no other node (sharing this
    machine) still has one there."""
    choice = owned.choose_directory(uid, root)
    if choice.refused is not None:
        raise owned.UnsafeDirectory(choice.refused)
    runs = os.path.join(choice.path, agent_spec.RUNS_DIR)
    job_dir = os.path.join(runs, job_id)
    for level in (choice.path, runs, job_dir):
        if not _checked(level, uid):
            return  # nothing of the job here
    directory = os.path.join(job_dir, node)
    if _checked(directory, uid):
        shutil.rmtree(directory)  # never follows a link below it
    with contextlib.suppress(OSError):
        os.rmdir(job_dir)  # only when nothing else is left in it


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[0] not in ("write", "remove"):
        print("usage: node_files write|remove JOB_ID NODE [ROOT]", file=sys.stderr)
        return 2
    action, job_id, node, root = (*argv, "")[:4]
    try:
        if action == "write":
            write(job_id, node, sys.stdin.buffer.read(), os.getuid(), root)
        else:
            remove(job_id, node, os.getuid(), root)
    except owned.UnsafeDirectory as err:
        print(str(err), file=sys.stderr)
        return 1
    except OSError as err:
        print(f"{err.filename or job_id}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
