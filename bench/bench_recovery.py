"""Benchmark: recovery from a node that dies mid-job, on a 4-node sandbox.

Each repetition gets a sandbox of its own (4 nodes x 2 slots) and runs the same job twice:
`recipes/scripts/resume_train.py` (torch DDP over gloo, checkpoint every 5 steps) with
torchrun, `--nodes 3` (the 4th node is the spare), `--max-restarts 2`, default heartbeat:

- no fault: the job runs to its end;
- node killed: once the job's rank 0 printed step 20, every process of the job's second node
  (its sshd too) is killed with SIGKILL, for good. orch tears the job down, re-checks the
  nodes, takes the spare and starts attempt 2, which resumes from the checkpoint.

Measured from the kill (the head's clock), by the head-side logs' own time stamps:
- the next attempt's first line: the first line any node of attempt 2 sent (its agent's
  "started"), and the first line a rank of attempt 2 printed (torch imported, the process
  group up, the checkpoint loaded);
- the whole job's wall time, against the same job without a fault.
The no-fault run always runs first on a fresh sandbox (the fault run ends it for good).

Run: python bench/bench_recovery.py [--reps 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from orchestrator.sandbox.state import SandboxState

SCRIPT = common.ROOT / "recipes" / "scripts" / "resume_train.py"
KILL_AT = "step 20:"  # rank 0's line after which the node dies
CAP_S = 600.0


def _argv(state: SandboxState, steps: int, checkpoints: Path) -> list[str]:
    return [
        common.PYTHON, "-m", "orchestrator", "launch", "--hostfile", state.hostfile,
        "--launcher", "torchrun", "--nproc-per-node", "2", "--nodes", "3", "--max-restarts", "2",
        "--no-doctor", "--quiet", str(SCRIPT), "--", "--steps", str(steps), "--step-sleep", "0.2",
        "--checkpoint-dir", str(checkpoints),
    ]  # fmt: skip


def _job_dir(runs: Path) -> Path | None:
    found = [p for p in runs.iterdir() if (p / "job.json").exists()] if runs.exists() else []
    return found[0] if found else None


def _printed(runs: Path, words: str) -> bool:
    job = _job_dir(runs)
    return job is not None and any(words in text for _, text in common.log_stamps(job / "logs"))


def run_once(state: SandboxState, work: Path, steps: int, *, fault: bool) -> dict[str, object]:
    runs, checkpoints = work / "runs", work / "checkpoints"
    env = common.head_env({"ORCH_RUNS_DIR": str(runs)})
    with (work / "orch.log").open("wb") as out:
        t0 = time.monotonic()
        orch = subprocess.Popen(_argv(state, steps, checkpoints), cwd=common.ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        killed_at = None
        try:
            if fault:
                deadline = time.monotonic() + CAP_S
                while not _printed(runs, KILL_AT) and time.monotonic() < deadline:
                    time.sleep(0.1)
                killed_at = time.time()
                common.kill_node(state, state.nodes[1].name)
            code = orch.wait(timeout=CAP_S)
        finally:
            if orch.poll() is None:
                os.killpg(orch.pid, signal.SIGKILL)
        wall = time.monotonic() - t0
    job = _job_dir(runs)
    record = json.loads((job / "job.json").read_text()) if job else {}
    result: dict[str, object] = {"fault": fault, "exit_code": code, "wall_s": round(wall, 2),
                                 "attempts": len(record.get("attempts", ()))}  # fmt: skip
    if fault and job is not None and killed_at is not None:
        lines = common.log_stamps(job / "logs")  # the latest attempt's: attempt 2's
        ranks = [when for when, text in lines if text.startswith("r")]
        result["to_next_attempt_s"] = round(lines[0][0] - killed_at, 2) if lines else None
        result["to_first_rank_line_s"] = round(ranks[0] - killed_at, 2) if ranks else None
        result["cause"] = (record["attempts"][0].get("cause") or {}).get("message")
    return result


def _values(results: list[dict[str, object]], key: str) -> list[float]:
    return [float(r[key]) for r in results if r.get(key) is not None]  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    info = common.machine()
    common.print_header("recovery from a node killed mid-job (4-node sandbox)", info)
    results: list[dict[str, object]] = []
    for rep in range(args.reps):
        with common.private_sandbox(4, slots=2, tag="recovery") as state:
            for fault in (False, True):
                with tempfile.TemporaryDirectory(prefix="orch-bench-recovery-") as work:
                    result = run_once(state, Path(work), args.steps, fault=fault)
                results.append(result)
                print(f"  rep {rep + 1} {'node killed' if fault else 'no fault':12s} {result}",
                      flush=True)  # fmt: skip
    clean = [float(r["wall_s"]) for r in results if not r["fault"]]  # type: ignore[arg-type]
    faulty = [r for r in results if r["fault"]]
    measures = {
        "node death -> attempt 2's first line (its agent started)": _values(faulty,
                                                                           "to_next_attempt_s"),
        "node death -> attempt 2's first rank line": _values(faulty, "to_first_rank_line_s"),
        "whole job, no fault": clean,
        "whole job, node killed": _values(faulty, "wall_s"),
    }  # fmt: skip
    rows = []
    for label, values in measures.items():
        summary = common.summarize(values)
        rows.append((label, f"{summary.median:.1f} s", f"{summary.low:.1f}-{summary.high:.1f} s",
                     len(values)))  # fmt: skip
    print(common.render_table(("measure", "median", "range", "runs"), rows))
    print(common.machine_line(info))
    document = {"command": common.command_line(), "date": common.now_utc(), "machine": info,
                "runs": results}  # fmt: skip
    path = common.write_results("recovery", document)
    print(f"results: {path}")
    ok = all(r["exit_code"] == 0 for r in results) and all(r["attempts"] == 2 for r in faulty)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
