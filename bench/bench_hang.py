"""Hangs found with no flag: the time from a stall to the teardown with the threshold orch
learns, against a fixed --hang-timeout and the collectives' own timeouts; and quiet work
that must not be taken for a hang, counted over repeated runs.

A sandbox of 2 nodes x 2 torch ranks (gloo, torchrun) runs tests/jobs/stepping.py, rank 0
printing a line every step (a step: 0.2 s of compute and an all_reduce):

- stall-learned:   rank 3 stops in plain Python after 40 s (a loader that never yields),
                   no --hang-timeout: caught after the learned threshold (at least 120 s)
                   and a look that finds no rank working;
- stall-fixed-30:  the same with --hang-timeout 30;
- evaluation:      after 40 s rank 0 computes 150 s without a word while the others wait
                   in all_reduce; must end with 0;
- checkpoint:      after 40 s every rank writes a file for 150 s without a word; must end
                   with 0.

Shorter versions of the quiet work, with floors given (`auto:20s:60s`: 20 s in place of
2 minutes), to count false positives over many runs:

- evaluation-short, checkpoint-short: the same spells, 45 s long after 15 s;
- silent-short:    a job that prints nothing but its ranks' start and end (floors 10 s):
                   rank 3 computes 50 s without a word on a fifth of a core while the
                   others wait, then every rank steps on silently; looked at every 10 s.

The stall is timed from the moment orch's log has the line the stalled rank printed, to
orch's exit. gloo's default timeout is 30 minutes and NCCL's 10 (torch.distributed's
defaults): what a hang costs when nothing else looks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ORCH,
    RESULTS_DIR,
    ROOT,
    command_line,
    head_env,
    kill_session,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    write_results,
)

JOB = ROOT / "tests" / "jobs" / "stepping.py"
GLOO_DEFAULT_S, NCCL_DEFAULT_S = 1800.0, 600.0
STEP = ("--compute", "0.2", "--max-seconds", "260")
PACED = ("--print-every", "1")  # rank 0 prints a line every step
SHORT = ("--hang-timeout", "auto:20s:60s")
SCENARIOS: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {
    # name: (orch options, job arguments, the exit code it must end with)
    "stall-learned": ((), (*PACED, "--stall-rank", "3", "--stall-after", "40",
                           "--max-seconds", "900"), 124),
    "stall-fixed-30": (("--hang-timeout", "30"),
                       (*PACED, "--stall-rank", "3", "--stall-after", "40",
                        "--max-seconds", "900"), 124),
    "evaluation": ((), (*PACED, "--quiet-rank", "0", "--quiet-at", "40", "--quiet-for", "150"),
                   0),
    "checkpoint": ((), (*PACED, "--quiet-rank", "-2", "--quiet-at", "40", "--quiet-for", "150"),
                   0),
    "evaluation-short": (SHORT, (*PACED, "--quiet-rank", "0", "--quiet-at", "15",
                                 "--quiet-for", "45", "--max-seconds", "70"), 0),
    "checkpoint-short": (SHORT, (*PACED, "--quiet-rank", "-2", "--quiet-at", "15",
                                 "--quiet-for", "45", "--max-seconds", "70"), 0),
    "silent-short": (("--hang-timeout", "auto:10s:10s"),
                     ("--quiet=3:0:50", "--duty", "0.2", "--max-seconds", "70"), 0),
}  # fmt: skip


def run_once(hostfile: str, name: str, base: Path) -> dict[str, object]:
    options, job_args, expected = SCENARIOS[name]
    runs = base / "runs"
    argv = [ORCH, "launch", "--hostfile", hostfile, "--launcher", "torchrun",
            "--nproc-per-node", "2", "--no-doctor", "--runs-dir", str(runs), "--quiet",
            *options, str(JOB), "--", *STEP, *job_args]  # fmt: skip
    log = base / "launch.out"
    with log.open("wb") as out:
        head = subprocess.Popen(argv, cwd=base, env=head_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        stalled_at = None
        deadline = time.monotonic() + 1500
        while head.poll() is None and time.monotonic() < deadline:
            if stalled_at is None and "stalls after" in _logs(runs):
                stalled_at = time.monotonic()
            time.sleep(0.5)
        if head.poll() is None:
            kill_session(head)
        code = head.wait()
    ended = time.monotonic()
    record = _record(runs)
    failure = record.get("first_failure") or {}
    return {
        "scenario": name, "exit_code": code, "expected": expected, "ok": code == expected,
        "stall_to_exit_s": round(ended - stalled_at, 1) if stalled_at else None,
        "rank_named": failure.get("rank"), "reason": failure.get("reason"),
        "hang_watch": record.get("hang_watch"), "looks_found_working": _working_looks(runs),
        "log": str(log),
    }  # fmt: skip


def _logs(runs: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in runs.glob("*/logs/*.log"))


def _working_looks(runs: Path) -> int:
    """How many looks at the quiet job found it working: each a chance of a false hang."""
    found = 0
    for path in runs.glob("*/moments.jsonl"):
        found += sum(json.loads(line)["kind"] == "quiet" for line in path.read_text().splitlines())
    return found


def _record(runs: Path) -> dict:
    for path in runs.glob("*/job.json"):
        return json.loads(path.read_text())
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=1, help="runs of each quiet-work scenario")
    parser.add_argument("--scenarios", default="stall-learned,stall-fixed-30,evaluation,checkpoint")
    args = parser.parse_args()
    info = machine()
    print_header("hangs found with no flag", info)
    results = []
    with private_sandbox(2, 2, tag="hang") as state:
        for name in args.scenarios.split(","):
            reps = args.reps if SCENARIOS[name][2] == 0 else 1
            for _ in range(reps):
                with tempfile.TemporaryDirectory(prefix="orch-bench-hang-") as base:
                    result = run_once(state.hostfile, name, Path(base))
                    if not result["ok"]:  # what orch said and recorded, for reading later
                        kept = RESULTS_DIR / f"hang-failed-{name}-{len(results)}"
                        shutil.copytree(base, kept, symlinks=True, dirs_exist_ok=True)
                        result["log"] = str(kept / "launch.out")
                print(f"  {name}: exit {result['exit_code']}, stall to exit "
                      f"{result['stall_to_exit_s']} s, rank {result['rank_named']}, "
                      f"{result['looks_found_working']} look(s) found work")  # fmt: skip
                results.append(result)
    rows = []
    for name in args.scenarios.split(","):
        mine = [r for r in results if r["scenario"] == name]
        times = [r["stall_to_exit_s"] for r in mine if r["stall_to_exit_s"] is not None]
        rows.append((name, f"{sum(r['ok'] for r in mine)}/{len(mine)}",
                     f"{min(times):.0f}-{max(times):.0f}" if times else "-",
                     f"{GLOO_DEFAULT_S / max(times):.0f}x / {NCCL_DEFAULT_S / max(times):.1f}x"
                     if times else "-",
                     str(sum(r["looks_found_working"] for r in mine))))  # fmt: skip
    print(render_table(["scenario", "ended as it must", "stall to exit, s",
                        "faster than gloo / NCCL default", "looks that found work"],
                       rows))  # fmt: skip
    path = write_results("hang", {
        "when": now_utc(), "machine": info, "machine_line": machine_line(info),
        "command": command_line(), "results": results,
    })  # fmt: skip
    print(f"results: {path}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
