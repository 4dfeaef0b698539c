"""A stop on this node: every rank of the job gets the stop signal at once, to its own
process only, and has its grace to save and exit. STANDARD LIBRARY ONLY (shipped inline;
plan/agent_command.py's stop_command).

`JOB_ID NODE SIGNAL GRACE`: first the stop file in the job's node directory (STOP_FILE of
remote/rank.py: the grace's end on this node's clock), which every rank's keeper reads
before it passes a launcher's signal on (it then passes nothing on) and before it starts
its rank (it then starts none); then the signal to each rank (remote/procs.py finds them:
the keeper's child, not the keeper, not the rank's own children such as DataLoader workers,
and never the launcher, whose own TERM-then-KILL would end the ranks 30 s later). Prints
one JSON line: the ranks signalled (rank, pid, when) and the node's time.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

try:  # shipped inline: loaded beside this program as orch_<name>
    import orch_agent_spec as agent_spec
    import orch_owned as owned
    import orch_procs as procs
    import orch_rank as rank_program
except ImportError:
    from orchestrator.remote import agent_spec, owned, procs
    from orchestrator.remote import rank as rank_program


def mark_stop(job_id: str, node: str, uid: int, signum: int, until: float) -> str | None:
    """Write the stop file in the job's node directory (its start-up directory made, and
    checked, as the agent makes it: the agent may not have started yet); returns its path,
    or None where the job has no directory on this node (never started, or long gone)."""
    directory = agent_spec.node_dir(job_id, node, uid)
    if not os.path.isdir(directory):
        return None
    below = [agent_spec.RUNS_DIR, job_id, node, rank_program.START_DIR]
    owned.private_directories(owned.user_directory(uid), below, uid)
    path = os.path.join(directory, rank_program.STOP_FILE)
    owned.write_private_file(path, json.dumps({"signal": signum, "until": until}).encode())
    return path


def signal_ranks(job_id: str, node: str, signum: int, proc: str = procs.PROC) -> list[dict]:
    """The stop signal to each rank of the job on this node: (rank, pid, when) of each."""
    sent = []
    for rank, pid in procs.job_ranks(job_id, node, proc):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
            sent.append({"rank": rank, "pid": pid, "at": round(time.time(), 6)})
    return sent


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: rank_stop JOB_ID NODE SIGNAL GRACE", file=sys.stderr)
        return 2
    job_id, node = argv[0], procs.node_name(argv[1])
    signum, grace = int(argv[2]), float(argv[3])
    try:
        mark_stop(job_id, node, os.getuid(), signum, time.time() + grace)
    except (OSError, owned.UnsafeDirectory) as err:
        print(json.dumps({"error": f"the stop file on {node}: {err}"}), flush=True)
        return 1
    sent = signal_ranks(job_id, node, signum)
    print(json.dumps({"signalled": sent, "t": round(time.time(), 6)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
