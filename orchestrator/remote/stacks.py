"""The node side of `orch stacks`: every rank's Python stack, or a sampling profile of it.

STANDARD LIBRARY ONLY. Shipped inline beside remote/agent.py (whose job_pids and
_rank_of it reuses) and run with the job's interpreter, or any python3 when that is
missing. It prints one JSON document on stdout and exits 0 whenever it could look:
a missing py-spy, a refused ptrace or a rank that is gone are reported in the
document (as a `kind` the head turns into a fix), never as a traceback.

A rank is a process of the job (ORCH_JOB_ID) started on this node (ORCH_NODE) with
RANK in its environment whose parent does not carry the same RANK: a rank's own
children (data loader workers, a forkserver) inherit its RANK and are left out.
py-spy is looked for beside the job's interpreter, beside this interpreter, then on
PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

NODE_VAR = "ORCH_NODE"
# Beyond its own timeout, a py-spy run is killed: the node always answers in time.
DUMP_TIMEOUT_S = 20.0
STARTUP_SLACK_S = 15.0
# Kinds of failure the head knows a fix for (orchestrator/stacks/model.py).
NO_PY_SPY, PTRACE, GONE, NO_RANKS, TIMEOUT, OTHER = (
    "no-py-spy", "ptrace", "gone", "no-ranks", "timeout", "other",
)  # fmt: skip


def _agent():
    if "orch_agent" in sys.modules:  # shipped inline by the bootstrap
        return sys.modules["orch_agent"]
    from orchestrator.remote import agent

    return agent


def _environ_value(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def rank_processes(job_id: str, node: str) -> list[tuple[int, int]]:
    """(rank, pid) of the job's ranks started on this node, by rank."""
    agent = _agent()
    found = []
    for pid in agent.job_pids(job_id):
        # Sandbox nodes may share one /proc: a process started for another node is not ours.
        started_on = _environ_value(pid, NODE_VAR)
        if started_on is not None and started_on != node:
            continue
        rank = agent._rank_of(pid)
        if rank is None or agent._rank_of(agent._parent_of(pid)) == rank:
            continue
        found.append((rank, pid))
    return sorted(found)


def find_py_spy(job_python: str) -> str | None:
    for directory in (os.path.dirname(job_python), os.path.dirname(sys.executable)):
        candidate = os.path.join(directory, "py-spy")
        if directory and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("py-spy")


def _failure(stderr: str, code: int | None) -> dict:
    """What a py-spy run that failed said, as a kind and its first meaningful line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if line.lower().startswith("error")), "")
    message = first or (lines[0] if lines else f"py-spy exited with {code}")
    lowered = stderr.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered:
        kind = PTRACE
    elif any(sign in lowered for sign in ("no such process", "process is running")):
        kind = GONE
    else:
        kind = OTHER
    return {"error": message[:300], "kind": kind}


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, close_fds=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str, int | None]:
    try:
        out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return out, err, None
    return out, err, proc.returncode


def _thread_fields(thread: dict) -> dict:
    """The parts of py-spy's thread object the head uses (locals and the rest stay here)."""
    keep = ("thread_name", "os_thread_id", "thread_id", "active", "owns_gil")
    fields = {key: thread.get(key) for key in keep}
    fields["frames"] = [
        {key: frame.get(key) for key in ("name", "filename", "short_filename", "line")}
        for frame in thread.get("frames", [])
    ]
    return fields


def _dump_result(out: str, err: str, code: int | None) -> dict:
    if code is None:
        return {"error": f"py-spy dump gave no answer within {DUMP_TIMEOUT_S:g}s", "kind": TIMEOUT}
    if code != 0:
        return _failure(err, code)
    try:
        threads = json.loads(out)
    except ValueError:
        return {"error": "py-spy dump printed no JSON", "kind": OTHER}
    return {"threads": [_thread_fields(thread) for thread in threads]}


def dump_ranks(py_spy: str, ranks: list[tuple[int, int]]) -> list[dict]:
    """`py-spy dump --json` of every rank, all at once."""
    started = [
        (rank, pid, _start([py_spy, "dump", "--json", "--pid", str(pid)])) for rank, pid in ranks
    ]
    deadline = time.monotonic() + DUMP_TIMEOUT_S
    return [
        {"rank": rank, "pid": pid, **_dump_result(*_finish(proc, deadline))}
        for rank, pid, proc in started
    ]


def _record_argv(py_spy: str, pid: int, seconds: float, rate: int, output: str) -> list[str]:
    # --idle: a rank blocked in a collective is idle, and that wait is what is measured.
    # --nonblocking: the ranks are not paused, so sampling does not slow the job.
    # --threads: each sample names its thread, so the training thread can be told apart.
    return [
        py_spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))),
        "--rate", str(rate), "--format", "raw", "--idle", "--nonblocking", "--threads",
        "--full-filenames", "--output", output,
    ]  # fmt: skip


def _record_result(path: str, err: str, code: int | None) -> dict:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        text = ""
    if not text.strip():
        if code is None:
            return {"error": "py-spy record did not finish in time", "kind": TIMEOUT}
        return _failure(err, code)
    return {"samples": text.splitlines()}


def record_ranks(
    py_spy: str, ranks: list[tuple[int, int]], seconds: float, rate: int
) -> list[dict]:
    """Sample every rank for `seconds`, all at once; each rank's samples in py-spy's raw form."""
    with tempfile.TemporaryDirectory(prefix="orch-stacks-") as scratch:
        started = []
        for rank, pid in ranks:
            output = os.path.join(scratch, f"rank{rank}-{pid}.txt")
            proc = _start(_record_argv(py_spy, pid, seconds, rate, output))
            started.append((rank, pid, proc, output))
        deadline = time.monotonic() + seconds + STARTUP_SLACK_S
        results = []
        for rank, pid, proc, output in started:
            _out, err, code = _finish(proc, deadline)
            results.append({"rank": rank, "pid": pid, **_record_result(output, err, code)})
        return results


def report(job_id: str, node: str, job_python: str, seconds: float, rate: int) -> dict:
    doc: dict = {"node": node, "job_id": job_id, "mode": "profile" if seconds else "dump"}
    ranks = rank_processes(job_id, node)
    py_spy = find_py_spy(job_python)
    doc["py_spy"] = py_spy
    if not ranks:
        doc.update(error=f"no rank of job {job_id} runs on this node", kind=NO_RANKS)
        return doc
    if py_spy is None:
        doc.update(error=f"py-spy not found beside {job_python} or on PATH", kind=NO_PY_SPY)
        doc["ranks"] = [{"rank": rank, "pid": pid} for rank, pid in ranks]
        return doc
    if seconds:
        doc["seconds"] = seconds
        doc["ranks"] = record_ranks(py_spy, ranks, seconds, rate)
    else:
        doc["ranks"] = dump_ranks(py_spy, ranks)
    return doc


def main(argv: list[str]) -> int:
    """stacks JOB_ID NODE JOB_PYTHON SECONDS RATE (SECONDS 0: one dump of every rank)."""
    if len(argv) != 5:
        print("usage: stacks JOB_ID NODE JOB_PYTHON SECONDS RATE", file=sys.stderr)
        return 2
    job_id, node, job_python = argv[0], argv[1], argv[2]
    doc = report(job_id, node, job_python, float(argv[3]), int(argv[4]))
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
