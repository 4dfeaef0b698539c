"""The node side of `orch stacks`: every rank's Python stack, or a sampling profile of it.

STANDARD LIBRARY ONLY. Shipped inline beside remote/procs.py and run with the job's
interpreter, or any python3 when that is missing. It prints one JSON document on stdout
and exits 0 whenever it could look: a missing py-spy, a refused ptrace or a rank that is
gone are reported in the document (as a `kind` the head turns into a fix), never as a
traceback.

The ranks are the job's ranks started on this node, found by remote/procs.py (RANK in
their environment, not inherited from a parent rank; another node's ranks on a shared
kernel left out).
py-spy is looked for beside the job's interpreter, beside this interpreter, then on
PATH. Where it is missing, or ptrace is refused, a rank's stack is taken without
ptrace: the rank's sitecustomize (remote/rank_site.py) registered faulthandler on
SIGUSR2, so the rank is signalled and what faulthandler appends to its stack file is
read back (a profile signals it at the sampling rate). A rank is signalled only when
/proc says it catches SIGUSR2: an uncaught SIGUSR2 would end it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

try:  # shipped inline: loaded beside this program as orch_<name>
    import orch_agent_spec as agent_spec
    import orch_procs as procs
    import orch_rank_site as rank_site
except ImportError:
    from orchestrator.remote import agent_spec, procs, rank_site

# Beyond its own timeout, a py-spy run is killed: the node always answers in time.
DUMP_TIMEOUT_S = 20.0
STARTUP_SLACK_S = 15.0
# Kinds of failure the head knows a fix for (orchestrator/stacks/model.py).
NO_PY_SPY, PTRACE, GONE, NO_RANKS, TIMEOUT, OTHER, NO_HANDLER = (
    "no-py-spy", "ptrace", "gone", "no-ranks", "timeout", "other", "no-handler",
)  # fmt: skip
METHODS = ("auto", "py-spy", "faulthandler")
SIGNAL_WAIT_S = 5.0  # a rank's faulthandler answers from its signal handler, at once
SIGNAL_MAX_RATE = 20  # samples per second and rank when sampling by signal
POLL_S, SETTLE_POLLS = 0.015, 2  # a dump is whole once its file stood still this long
_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<name>.*)$')


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


# ----- without ptrace: faulthandler in the rank, on a signal ---------------------------------
Ranks = list[tuple[int, int]]  # (rank, pid)


def catches(pid: int, signum: int) -> bool | None:
    """Whether the process has a handler for `signum` (SigCgt in /proc); None: it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return None
    return False


def parse_faulthandler(text: str, pid: int) -> list[dict]:
    """faulthandler's dump of every thread, as py-spy dump's thread objects (innermost frame
    first). Its thread ids are not the OS's: the main thread (the one running the script's
    top level, else the one that took the signal) gets the pid, as py-spy reports it."""
    threads: list[dict] = []
    for line in text.splitlines():
        head = _FH_THREAD.match(line)
        if head:
            current = line.startswith("Current")
            threads.append({"thread_id": head[1], "current": current, "frames": []})
            continue
        frame = _FH_FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].append(
                {"name": frame["name"], "filename": frame["file"], "line": int(frame["line"])}
            )
    main = next((t for t in threads if t["frames"] and t["frames"][-1]["name"] == "<module>"),
                next((t for t in threads if t["current"]), None))  # fmt: skip
    return [
        {
            "thread_name": "MainThread" if thread is main else f"Thread {thread['thread_id']}",
            "os_thread_id": pid if thread is main else None,
            "thread_id": thread["thread_id"],
            "active": True,
            "frames": thread["frames"],
        }
        for thread in threads
    ]


class _Signalled:
    """One rank asked for its stack: where its answer will be appended."""

    def __init__(self, rank: int, pid: int, path: str) -> None:
        self.rank, self.pid, self.path = rank, pid, path
        self.start = _size(path)

    def answer(self) -> str:
        with open(self.path, "rb") as handle:
            handle.seek(self.start)
            return handle.read().decode("utf-8", "replace")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _refusal(rank: int, pid: int, path: str, signum: int) -> dict | None:
    """Why this rank cannot be signalled for its stack (its answer going to `path`), or
    None when it can."""
    handled = catches(pid, signum)
    if handled is None:
        return {"rank": rank, "pid": pid, "error": "the rank has exited", "kind": GONE}
    if not os.path.exists(path):
        return {"rank": rank, "pid": pid, "kind": NO_HANDLER, "error": (
            "the rank did not load orch's stack handler (started with python -E, -I or -S, "
            "or not a Python program)")}  # fmt: skip
    if not handled:
        return {"rank": rank, "pid": pid, "kind": NO_HANDLER,
                "error": "the rank no longer handles SIGUSR2 (it reset its signals)"}  # fmt: skip
    return None


def _signal_all(ranks: Ranks, node_dir: str) -> tuple[list[_Signalled], list[dict]]:
    signum = int(rank_site.STACK_SIGNAL)
    asked, refused = [], []
    for rank, pid in ranks:
        path = rank_site.stack_file(node_dir, pid)
        refusal = _refusal(rank, pid, path, signum)
        if refusal is not None:
            refused.append(refusal)
            continue
        target = _Signalled(rank, pid, path)
        try:
            os.kill(pid, signum)
        except OSError as err:
            refused.append({"rank": rank, "pid": pid, "error": str(err), "kind": GONE})
            continue
        asked.append(target)
    return asked, refused


def _wait_answers(asked: list[_Signalled], deadline: float) -> dict[int, str]:
    """Each rank's appended dump, once its file has stopped growing for SETTLE_POLLS polls
    (faulthandler writes a dump as a burst of small writes, which a busy machine may
    pause between)."""
    answers: dict[int, str] = {}
    sizes = {target.pid: target.start for target in asked}
    still = dict.fromkeys(sizes, 0)
    while len(answers) < len(asked) and time.monotonic() < deadline:
        time.sleep(POLL_S)
        for target in asked:
            if target.pid in answers:
                continue
            size = _size(target.path)
            grown = size > target.start
            still[target.pid] = still[target.pid] + 1 if grown and size == sizes[target.pid] else 0
            if still[target.pid] >= SETTLE_POLLS:
                answers[target.pid] = target.answer()
            sizes[target.pid] = size
    return answers


def signal_dump(ranks: Ranks, node_dir: str) -> list[dict]:
    """Every rank's stack from its own faulthandler, all signalled at once."""
    asked, results = _signal_all(ranks, node_dir)
    answers = _wait_answers(asked, time.monotonic() + SIGNAL_WAIT_S)
    for target in asked:
        text = answers.get(target.pid)
        if text is None:
            results.append({"rank": target.rank, "pid": target.pid, "kind": TIMEOUT,
                            "error": f"no stack within {SIGNAL_WAIT_S:g}s of SIGUSR2"})  # fmt: skip
        else:
            results.append({"rank": target.rank, "pid": target.pid,
                            "threads": parse_faulthandler(text, target.pid)})  # fmt: skip
    return sorted(results, key=lambda item: item["rank"])


def raw_sample(thread: dict) -> str:
    """One thread's stack in py-spy's raw form: `thread (TID): NAME;outer (file:line);...`."""
    tid = thread["os_thread_id"]
    if tid is None:
        tid = int(thread["thread_id"], 16)
    frames = [f"{f['name']} ({f['filename']}:{f['line']})" for f in reversed(thread["frames"])]
    return ";".join([f"thread ({tid}): {thread['thread_name']}", *frames])


def signal_profile(ranks: Ranks, node_dir: str, seconds: float, rate: int) -> list[dict]:
    """Sample every rank `rate` times a second for `seconds` by signalling it; each rank's
    samples counted in py-spy's raw form."""
    rate = max(1, min(rate, SIGNAL_MAX_RATE))
    counts: dict[int, dict[str, int]] = {pid: {} for _rank, pid in ranks}
    refused: dict[int, dict] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        live = [(rank, pid) for rank, pid in ranks if pid not in refused]
        asked, now_refused = _signal_all(live, node_dir)
        refused.update({item["pid"]: item for item in now_refused})
        answers = _wait_answers(asked, tick + SIGNAL_WAIT_S)
        for pid, text in answers.items():
            for thread in parse_faulthandler(text, pid):
                line = raw_sample(thread)
                counts[pid][line] = counts[pid].get(line, 0) + 1
        time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - tick)))
    results = []
    for rank, pid in ranks:
        if counts[pid]:
            samples = [f"{line} {count}" for line, count in counts[pid].items()]
            results.append({"rank": rank, "pid": pid, "samples": samples})
        else:
            results.append(refused.get(pid) or {"rank": rank, "pid": pid, "kind": TIMEOUT,
                                                "error": "no sample answered SIGUSR2"})  # fmt: skip
    return results


def _with_py_spy(py_spy: str, ranks: Ranks, seconds: float, rate: int) -> list[dict]:
    return record_ranks(py_spy, ranks, seconds, rate) if seconds else dump_ranks(py_spy, ranks)


def _with_signal(ranks: Ranks, node_dir: str, seconds: float, rate: int) -> list[dict]:
    if seconds:
        return signal_profile(ranks, node_dir, seconds, rate)
    return signal_dump(ranks, node_dir)


def _auto(py_spy: str | None, ranks: Ranks, node_dir: str, seconds: float, rate: int) -> list[dict]:
    """py-spy where it can; faulthandler for the ranks it cannot trace, or everywhere when
    the node has no py-spy."""
    if py_spy is None:
        signalled = _with_signal(ranks, node_dir, seconds, rate)
        return [{**item, "method": "faulthandler"} for item in signalled]
    results = [{**item, "method": "py-spy"} for item in _with_py_spy(py_spy, ranks, seconds, rate)]
    refused = [(item["rank"], item["pid"]) for item in results if item.get("kind") == PTRACE]
    if not refused:
        return results
    signalled = _with_signal(refused, node_dir, seconds, rate)
    retried = {item["rank"]: {**item, "method": "faulthandler"} for item in signalled}
    return [retried.get(item["rank"], item) for item in results]


def report(job_id: str, node: str, job_python: str, seconds: float, rate: int,
           method: str = "auto", root: str = "", ranks: Ranks | None = None) -> dict:  # fmt: skip
    """`ranks`: the job's ranks on this node when the caller has found them already."""
    doc: dict = {"node": node, "job_id": job_id, "mode": "profile" if seconds else "dump"}
    ranks = procs.job_ranks(job_id, node) if ranks is None else ranks
    py_spy = find_py_spy(job_python)
    doc["py_spy"] = py_spy
    doc["method"] = method
    if seconds:
        doc["seconds"] = seconds
    if not ranks:
        doc.update(error=f"no rank of job {job_id} runs on this node", kind=NO_RANKS)
        return doc
    node_dir = agent_spec.node_dir(job_id, node, os.getuid(), root)
    if method == "faulthandler":
        doc["ranks"] = [
            {**item, "method": method} for item in _with_signal(ranks, node_dir, seconds, rate)
        ]
    elif method == "py-spy" and py_spy is None:
        doc.update(error=f"py-spy not found beside {job_python} or on PATH", kind=NO_PY_SPY)
        doc["ranks"] = [{"rank": rank, "pid": pid} for rank, pid in ranks]
    elif method == "py-spy":
        doc["ranks"] = [
            {**item, "method": method} for item in _with_py_spy(py_spy, ranks, seconds, rate)
        ]
    else:
        doc["ranks"] = _auto(py_spy, ranks, node_dir, seconds, rate)
    return doc


def main(argv: list[str]) -> int:
    """stacks JOB_ID NODE JOB_PYTHON SECONDS RATE METHOD [ROOT] (SECONDS 0: one dump of every
    rank; METHOD auto, py-spy or faulthandler; ROOT the user's ORCH_NODE_ROOT)."""
    if len(argv) not in (6, 7) or argv[5] not in METHODS:
        print("usage: stacks JOB_ID NODE JOB_PYTHON SECONDS RATE auto|py-spy|faulthandler "
              "[ROOT]", file=sys.stderr)  # fmt: skip
        return 2
    job_id, node, job_python = argv[0], argv[1], argv[2]
    root = argv[6] if len(argv) == 7 else ""
    doc = report(job_id, node, job_python, float(argv[3]), int(argv[4]), argv[5], root)
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
