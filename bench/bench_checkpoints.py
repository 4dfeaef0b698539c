"""Benchmark: checkpoints that follow the job, on a 4-node sandbox whose nodes share nothing.

Each repetition gets a sandbox of its own (4 nodes x 1 slot); each node has its own
checkpoint directory and its own orch directory (bind-mounted in its mount namespace only,
as a local disk). The job (bench/jobs/sharded_checkpoints.py, torch DDP over gloo, torchrun,
3 nodes and a spare) does a fixed amount of CPU work per step and, every `--save-every`
steps, writes a sharded checkpoint as DeepSpeed lays one out: each rank its shard on its own
node, then rank 0 `latest`. Three runs per repetition:

- without copies: the job writes its checkpoints, orch is not told where (no
  --checkpoint-dir);
- with copies: `--checkpoint-dir`, 1 copy of each part on another node, the default cap;
- node killed: as "with copies" plus `--max-restarts 2`; once every part of a checkpoint is
  held by another node, every process of the first node (rank 0's, with `latest`) is killed
  for good; attempt 2 runs on the survivors and the spare, from the staged checkpoint.

Measured: the mean step time of the steps that save nothing (by rank 0, in the job), with
against without copies (the ratio in one repetition, on the same sandbox, the order
alternating); the bytes the copies carried against the complete checkpoints' sizes times the
copies asked; from the node's death (the head's clock) to attempt 2's first step line.

Run: python bench/bench_checkpoints.py [--reps 3] [--steps 3000] [--save-every 600] [--shard-mb 20]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from orchestrator.sandbox.state import SandboxState

JOB = common.ROOT / "bench" / "jobs" / "sharded_checkpoints.py"
CAP_S = 900.0
_STEP_TIME = re.compile(r"mean step time: ([\d.]+) ms")


def _argv(state: SandboxState, args: argparse.Namespace, checkpoints: Path, *,
          follow: bool, restarts: int = 0) -> list[str]:  # fmt: skip
    orch = [common.PYTHON, "-m", "orchestrator", "launch", "--hostfile", state.hostfile,
            "--launcher", "torchrun", "--nproc-per-node", "1", "--nodes", "3", "--no-doctor",
            "--hang-timeout", "off", "--max-restarts", str(restarts)]  # fmt: skip
    if follow:
        orch += ["--checkpoint-dir", str(checkpoints)]
    return [*orch, str(JOB), "--", "--steps", str(args.steps), "--save-every",
            str(args.save_every), "--shard-mb", str(args.shard_mb), "--dir", str(checkpoints)]


def _job_dir(runs: Path) -> Path | None:
    found = [p for p in runs.iterdir() if (p / "job.json").exists()] if runs.exists() else []
    return found[0] if found else None


def _record(runs: Path) -> dict:
    job = _job_dir(runs)
    with contextlib.suppress(OSError, ValueError, TypeError):
        return json.loads((job / "checkpoints.json").read_text())  # type: ignore[operator]
    return {}


def _every_part_copied(runs: Path) -> bool:
    return any(entry["complete_at"] and entry["parts"]
               and all(part["holders"] for part in entry["parts"])
               for entry in _record(runs).get("checkpoints", []))  # fmt: skip


def run_once(state: SandboxState, work: Path, args: argparse.Namespace, *, follow: bool,
             fault: bool = False) -> dict[str, object]:  # fmt: skip
    runs, checkpoints, node_root = work / "runs", work / "checkpoints", work / "orch-node"
    env = common.head_env({"ORCH_RUNS_DIR": str(runs), "ORCH_NODE_ROOT": str(node_root)})
    argv = _argv(state, args, checkpoints, follow=follow, restarts=2 if fault else 0)
    log = work / "orch.log"
    with log.open("wb") as out:
        t0 = time.monotonic()
        orch = subprocess.Popen(argv, cwd=common.ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        killed_at = None
        try:
            if fault:
                deadline = time.monotonic() + CAP_S
                while not _every_part_copied(runs) and time.monotonic() < deadline:
                    if orch.poll() is not None:
                        break
                    time.sleep(0.2)
                killed_at = time.time()
                common.kill_node(state, state.nodes[0].name)
            code = orch.wait(timeout=CAP_S)
        finally:
            if orch.poll() is None:
                os.killpg(orch.pid, signal.SIGKILL)
        wall = time.monotonic() - t0
    said = log.read_text(errors="replace")
    times = [float(m) for m in _STEP_TIME.findall(said)]
    result: dict[str, object] = {"follow": follow, "fault": fault, "exit_code": code,
                                 "wall_s": round(wall, 2),
                                 "step_ms": times[-1] if times else None}  # fmt: skip
    record = _record(runs)
    if record:
        complete = [e for e in record["checkpoints"] if e["complete_at"]]
        held = [e for e in complete if e["parts"] and all(p["holders"] for p in e["parts"])]
        result["copied_bytes"] = record.get("copied_bytes", 0)
        result["complete_bytes"] = sum(e["size"] for e in complete)
        # The checkpoints every part of which another node held when the job ended (the
        # last one may complete as the job ends, before its copy).
        result["held_bytes"] = sum(e["size"] for e in held)
        result["checkpoints_complete"] = len(complete)
        result["restores"] = [(r["entry"], r["why"]) for r in record.get("restores", [])]
    job = _job_dir(runs)
    if fault and killed_at is not None and job is not None:
        steps = [when for when, text in common.log_stamps(job / "logs")
                 if re.match(r"r\d+/\d+ out step \d", text)]  # fmt: skip
        result["death_to_first_step_s"] = round(steps[0] - killed_at, 2) if steps else None
    return result


def _private_dirs(state: SandboxState, work: Path) -> None:
    box = common.sandbox_of(state)
    for name in ("checkpoints", "orch-node"):
        directory = work / name
        directory.mkdir(mode=0o700)
        for node in state.nodes:
            box.private_directory(node.name, directory)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--save-every", type=int, default=600)
    parser.add_argument("--shard-mb", type=float, default=20.0)
    args = parser.parse_args()
    common.exit_cleanly_on_sigterm()  # a stopped benchmark takes its sandbox down
    info = common.machine()
    common.print_header("checkpoints copied between nodes (4-node sandbox, nothing shared)",
                        info)  # fmt: skip
    results: list[dict[str, object]] = []
    for rep in range(args.reps):
        with common.private_sandbox(4, slots=1, tag="ckpt") as state:
            order = (False, True) if rep % 2 == 0 else (True, False)
            for follow, fault in [*((f, False) for f in order), (True, True)]:
                with tempfile.TemporaryDirectory(prefix="orch-bench-ckpt-") as work:
                    _private_dirs(state, Path(work))
                    result = run_once(state, Path(work), args, follow=follow, fault=fault)
                result["rep"] = rep + 1
                results.append(result)
                print(f"  rep {rep + 1} {result}", flush=True)
    rows = []
    for rep in range(1, args.reps + 1):
        plain = next(r for r in results if r["rep"] == rep and not r["follow"])
        copied = next(r for r in results if r["rep"] == rep and r["follow"] and not r["fault"])
        faulty = next(r for r in results if r["rep"] == rep and r["fault"])
        slowdown = common.ratio(float(copied["step_ms"] or 0), float(plain["step_ms"] or 0))
        sizes = float(copied.get("held_bytes") or 0) * 1  # 1 copy asked
        carried = common.ratio(float(copied.get("copied_bytes") or 0), sizes)
        rows.append((rep, f"{plain['step_ms']} ms", f"{copied['step_ms']} ms",
                     common.ratio_text(slowdown), common.ratio_text(carried),
                     f"{faulty.get('death_to_first_step_s')} s"))  # fmt: skip
    print(common.render_table(("rep", "step, no copies", "step, copies", "ratio",
                               "bytes copied / size x K", "death -> first step"), rows))
    print(common.machine_line(info))
    document = {"command": common.command_line(), "date": common.now_utc(), "machine": info,
                "runs": results}  # fmt: skip
    print(f"results: {common.write_results('checkpoints', document)}")
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
