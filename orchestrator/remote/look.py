"""The node side of a look at a quiet job: is each rank working, or waiting, or stuck?

STANDARD LIBRARY ONLY. Shipped inline beside remote/stacks.py and run with the job's
interpreter, or any python3 when that is missing. For every rank of the job on this node
it reads, at the start and after SECONDS, the CPU time and the storage I/O of the rank's
whole process tree (its DataLoader workers, a compile worker, a checkpoint writer it
spawned), the state of the rank's own process (`T`: stopped by a signal) and, at both
ends, its Python stack (remote/stacks.py: py-spy, or the rank's own faulthandler). It
prints one JSON document and exits 0 whenever it could look; what it could not read is
null, never a traceback. The head judges (outcome/quiet.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

try:  # shipped inline: loaded beside this program as orch_<name>
    import orch_procs as procs
    import orch_stacks as stacks
except ImportError:
    from orchestrator.remote import procs, stacks

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children_of(proc: str = procs.PROC) -> dict[int, list[int]]:
    """Every process's children, from each one's parent in /proc."""
    tree: dict[int, list[int]] = {}
    for pid in procs.all_pids(proc):
        tree.setdefault(procs.parent_of(pid, proc), []).append(pid)
    return tree


def process_tree(pid: int, tree: dict[int, list[int]]) -> list[int]:
    """`pid` and every descendant of it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree.get(current, ()))
    return found


def cpu_seconds(pid: int, proc: str = procs.PROC) -> float | None:
    """The user and system CPU time a process has used (stat's utime + stime)."""
    fields = procs.stat_fields(pid, proc)
    if len(fields) < 13:
        return None
    try:
        return (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    except ValueError:
        return None


def storage_bytes(pid: int, proc: str = procs.PROC) -> int | None:
    """Bytes a process has read from and written to storage (io's read_bytes and
    write_bytes: a checkpoint being written counts, a socket does not), or None where
    /proc/<pid>/io cannot be read."""
    try:
        with open(f"{proc}/{pid}/io", encoding="ascii") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        return int(fields["read_bytes"]) + int(fields["write_bytes"])
    except (OSError, KeyError, ValueError):
        return None


def state_of(pid: int, proc: str = procs.PROC) -> str | None:
    fields = procs.stat_fields(pid, proc)
    return fields[0] if fields else None


def sample(pid: int, tree: dict[int, list[int]], proc: str = procs.PROC) -> dict:
    """A rank's tree's CPU seconds and storage bytes (summed over what could be read)."""
    members = process_tree(pid, tree)
    cpu = [value for value in (cpu_seconds(p, proc) for p in members) if value is not None]
    io = [value for value in (storage_bytes(p, proc) for p in members) if value is not None]
    return {"cpu": sum(cpu) if cpu else None, "io": sum(io) if io else None,
            "tree": len(members)}  # fmt: skip


def _grown(before: float | int | None, after: float | int | None) -> float | int | None:
    # A child that ended between the samples takes its counts with it: never below zero.
    return None if before is None or after is None else max(0, after - before)


def activity(ranks: list[tuple[int, int]], seconds: float,
             proc: str = procs.PROC) -> list[dict]:  # fmt: skip
    """Each rank's tree's CPU seconds and storage bytes over `seconds`, and its state at
    the end."""
    started = time.monotonic()
    tree = children_of(proc)  # one read of /proc for every rank, at each end
    first = {pid: sample(pid, tree, proc) for _rank, pid in ranks}
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    elapsed = time.monotonic() - started
    tree = children_of(proc)
    results = []
    for rank, pid in ranks:
        last = sample(pid, tree, proc)
        results.append({
            "rank": rank, "pid": pid, "seconds": round(elapsed, 3),
            "cpu": _grown(first[pid]["cpu"], last["cpu"]),
            "io": _grown(first[pid]["io"], last["io"]),
            "state": state_of(pid, proc), "tree": last["tree"],
        })  # fmt: skip
    return results


def launcher_activity(job_id: str, node: str, seconds: float,
                      proc: str = procs.PROC) -> dict:  # fmt: skip
    """With no rank yet (or none left): what the job's other processes here (its launcher
    starting, importing torch on a crowded node) did over `seconds`, summed."""
    pids = set(procs.job_pids(job_id, node, proc))
    roots = [pid for pid in sorted(pids) if procs.parent_of(pid, proc) not in pids]
    if not roots:
        return {"processes": 0, "seconds": 0.0, "cpu": None, "io": None}
    found = activity(list(enumerate(roots)), seconds, proc)
    cpu = [item["cpu"] for item in found if item["cpu"] is not None]
    io = [item["io"] for item in found if item["io"] is not None]
    return {"processes": sum(item["tree"] for item in found),
            "seconds": found[0]["seconds"],
            "cpu": sum(cpu) if cpu else None, "io": sum(io) if io else None}  # fmt: skip


def look(job_id: str, node: str, job_python: str, seconds: float, root: str = "") -> dict:
    """The activity over `seconds` between two dumps of every rank's stack: a rank whose
    stack is read by its own faulthandler writes it to a file, which must not count as
    the rank's I/O."""
    ranks = procs.job_ranks(job_id, node)
    doc: dict = {"node": node, "job_id": job_id, "seconds": seconds}
    if not ranks:
        doc.update(error=f"no rank of job {job_id} runs on this node", kind=stacks.NO_RANKS)
        doc["launcher"] = launcher_activity(job_id, node, seconds)
        return doc
    first = stacks.report(job_id, node, job_python, 0.0, 0, "auto", root, ranks)
    doc["ranks"] = activity(ranks, seconds)
    doc["stacks"] = [first, stacks.report(job_id, node, job_python, 0.0, 0, "auto", root, ranks)]
    return doc


def main(argv: list[str]) -> int:
    """look JOB_ID NODE JOB_PYTHON SECONDS [ROOT] (ROOT: the user's ORCH_NODE_ROOT)."""
    if len(argv) not in (4, 5):
        print("usage: look JOB_ID NODE JOB_PYTHON SECONDS [ROOT]", file=sys.stderr)
        return 2
    root = argv[4] if len(argv) == 5 else ""
    doc = look(argv[0], argv[1], argv[2], float(argv[3]), root)
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
