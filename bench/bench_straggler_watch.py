"""What the profile orch takes now and then while a job runs costs the job: its step time
while the profile is taken, against its step time the rest of the run, and that difference
spread over the watch's period (one profile of PROFILE_S every EVERY_S).

A sandbox of 2 nodes x 2 torch ranks (gloo, torchrun) runs tests/jobs/stepping.py: each
step does a fixed amount of work on the CPU (3000 64x64 matrix products), which the ranks
share with py-spy on this machine's 2 cores (on a GPU node the step runs on the GPU and
py-spy takes a core of the many), then joins an all_reduce; rank 0 prints every step. The
step times come from the job's own progress record (progress.jsonl), the profile's end from
its moment (moments.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ORCH,
    ROOT,
    command_line,
    head_env,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    write_results,
)

from orchestrator.run.straggler_watch import EVERY_S, FIRST_AFTER_S, PROFILE_S

JOB = ROOT / "tests" / "jobs" / "stepping.py"
STEP = ("--matmuls", "3000", "--print-every", "1", "--max-seconds", str(FIRST_AFTER_S + 30))
SETTLE_S = 10.0  # the first steps (start-up, the rendezvous) are left out


def step_time(points: list[tuple[float, int]]) -> float | None:
    """Seconds per step over (time, step) points; None with fewer than two."""
    if len(points) < 2 or points[-1][1] == points[0][1]:
        return None
    return (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])


def run_once(hostfile: str, base: Path) -> dict[str, object]:
    runs = base / "runs"
    argv = [ORCH, "launch", "--hostfile", hostfile, "--launcher", "torchrun",
            "--nproc-per-node", "2", "--no-doctor", "--runs-dir", str(runs), "--quiet",
            str(JOB), "--", *STEP]  # fmt: skip
    code = subprocess.run(argv, cwd=base, env=head_env(), capture_output=True, timeout=600,
                          check=False).returncode  # fmt: skip
    [run] = list(runs.iterdir())
    points = [(doc["t"], doc["n"]) for doc in map(json.loads, (run / "progress.jsonl").open())
              if doc.get("rank") == 0]  # fmt: skip
    ends = [doc["t"] for doc in map(json.loads, (run / "moments.jsonl").open())
            if doc.get("kind") == "profile"]  # fmt: skip
    if not ends or not points:
        return {"exit_code": code, "profiled": False}
    end = ends[0]
    start = end - PROFILE_S - 0.5  # the profile's own start-up on the nodes included
    first = points[0][0] + SETTLE_S
    inside = [p for p in points if start <= p[0] <= end]
    before = [p for p in points if first <= p[0] < start]
    after = [p for p in points if p[0] > end]
    outside = [t for t in (step_time(before), step_time(after)) if t is not None]
    during = step_time(inside)
    return {"exit_code": code, "profiled": True, "step_during_s": during,
            "step_outside_s": statistics.mean(outside) if outside else None,
            "said": [doc.get("detail") for doc in map(json.loads, (run / "moments.jsonl").open())
                     if doc.get("kind") == "profile"]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    info = machine()
    print_header("the straggler watch's cost to a job", info)
    results = []
    with private_sandbox(2, 2, tag="watch") as state:
        for rep in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="orch-bench-watch-") as base:
                result = run_once(state.hostfile, Path(base))
            print(f"  run {rep + 1}: {result}")
            results.append(result)
    pairs = [(float(r["step_outside_s"]), float(r["step_during_s"]))  # type: ignore[arg-type]
             for r in results if r.get("step_during_s") and r.get("step_outside_s")]  # fmt: skip
    rows = [(f"{out * 1000:.0f} ms", f"{during * 1000:.0f} ms", f"{during / out - 1:+.1%}",
             f"{(during / out - 1) * PROFILE_S / EVERY_S:+.3%}")
            for out, during in pairs]  # fmt: skip
    print(render_table(["step time, rest of the run", f"during the {PROFILE_S:g} s profile",
                        "slower during it", f"over the {EVERY_S:g} s period"], rows))  # fmt: skip
    path = write_results("straggler_watch", {
        "when": now_utc(), "machine": info, "machine_line": machine_line(info),
        "command": command_line(), "results": results,
        "profile_s": PROFILE_S, "every_s": EVERY_S,
    })  # fmt: skip
    print(f"results: {path}")
    return 0 if pairs and all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
