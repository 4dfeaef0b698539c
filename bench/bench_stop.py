"""A graceful stop on a real sandbox: how far apart in time the ranks get the stop signal,
and how long from Ctrl-C to the last rank's exit against the ranks' own save time.

One private sandbox (3 nodes x 2 ranks by default). For each launcher (pdsh, standard,
torchrun) and repetition: tests/jobs/saving.py runs until every rank is up, then SIGINT goes
to orch's process group (Ctrl-C in a terminal). Each rank notes the moment the stop signal
reaches it (its node's clock is the head's: the sandbox's nodes share this machine's),
agrees with the others at a step boundary, saves for `--save-seconds`, exits 0.

- sent spread: from the first rank sent the stop signal to the last (job.json's stop, each
  node's moment put on the head's clock; target: under 1 s across 3 nodes);
- handled spread: the same for the moments the ranks' Python handlers ran (a rank inside a
  collective runs its handler only when the collective returns: the ranks' all_reduce
  makes these nearly equal whatever the sending did);
- SIGINT to first sent, to the last rank's exit (against the save time: the step boundary
  the ranks agree on, then the save) and to orch's own exit (teardown, logs, record).

    .venv/bin/python bench/bench_stop.py [--reps 3] [--save-seconds 10] [--nodes 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from common import (
    ORCH,
    ROOT,
    command_line,
    exit_cleanly_on_sigterm,
    head_env,
    kill_session,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    summarize,
    write_results,
)

from orchestrator.sandbox.state import SandboxState

SLOTS = 2
LAUNCHERS = ("pdsh", "standard", "torchrun")
SAVING = ROOT / "tests" / "jobs" / "saving.py"
HEADERS = ("launcher", "runs", "sent spread, s", "handled spread, s", "SIGINT to first sent, s",
           "SIGINT to last rank exit, s", "SIGINT to orch exit, s", "save, s", "saved")  # fmt: skip


def _job_id(runs: Path) -> str | None:
    found = sorted(p.name for p in runs.iterdir()) if runs.exists() else []
    return found[0] if found else None


def _ranks_up(runs: Path, job_id: str, world: int) -> bool:
    logs = runs / job_id / "logs"
    text = "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    return text.count(" up, grace ") >= world


def one_stop(state: SandboxState, launcher: str, base: Path, save: float,
             cap: float) -> dict[str, object]:  # fmt: skip
    """One job stopped by SIGINT: the ranks' signal times, orch's exit and exit code."""
    world = len(state.nodes) * SLOTS
    out, runs = base / "out", base / "runs"
    out.mkdir(parents=True)
    argv = [ORCH, "launch", "--hostfile", state.hostfile, "--launcher", launcher,
            "--nproc-per-node", str(SLOTS), "--no-doctor", str(SAVING), "--",
            "--out", str(out), "--save-seconds", f"{save:g}", "--workers", "0",
            "--note-signal"]  # fmt: skip
    with (base / "orch.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=base, env=head_env({"ORCH_RUNS_DIR": str(runs)}),
                                stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline:
            job_id = _job_id(runs)
            if job_id and _ranks_up(runs, job_id, world):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{launcher}: the ranks were not up in {cap:g} s")
        time.sleep(2.0)  # every rank in its step loop
        asked = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=save + cap)
        ended = time.time()
    finally:
        if proc.poll() is None:
            kill_session(proc)
    signalled = [float((out / f"rank{r}.signalled").read_text()) for r in range(world)
                 if (out / f"rank{r}.signalled").exists()]  # fmt: skip
    saved = sum((out / f"rank{r}.saved").exists() for r in range(world))
    stop = json.loads((runs / str(job_id) / "job.json").read_text()).get("stop") or {}
    sent = [r["signalled_at"] for r in stop.get("ranks", ()) if r["signalled_at"] is not None]
    exits = [r["ended_at"] for r in stop.get("ranks", ()) if r["ended_at"] is not None]
    return {"code": code, "world": world, "saved": saved,
            "sent_spread": max(sent) - min(sent) if sent else None,
            "handled_spread": max(signalled) - min(signalled) if signalled else None,
            "to_sent": min(sent) - asked if sent else None,
            "to_last_exit": max(exits) - asked if exits else None,
            "to_exit": ended - asked, "stop": stop}  # fmt: skip


def table_rows(results: dict[str, list[dict]], save: float) -> list[list[object]]:
    rows = []
    for launcher, runs in results.items():
        def column(key: str, runs: list[dict] = runs) -> str:
            return summarize([r[key] for r in runs if r[key] is not None]).text(2)

        saved = "; ".join(f"{r['saved']}/{r['world']} (exit {r['code']})" for r in runs)
        rows.append([launcher, len(runs), column("sent_spread"), column("handled_spread"),
                     column("to_sent"), column("to_last_exit"), column("to_exit"), f"{save:g}",
                     saved])  # fmt: skip
    return rows


def main() -> None:
    exit_cleanly_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--save-seconds", type=float, default=10.0)
    parser.add_argument("--cap", type=float, default=180.0, help="start-up cap per run, s")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS))
    args = parser.parse_args()
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    info = machine()
    print_header("graceful stop", info)
    results: dict[str, list[dict]] = {name: [] for name in launchers}
    with private_sandbox(args.nodes, SLOTS, tag="bs") as state:
        base = Path(state.directory) / "runs-bench"
        for rep in range(args.reps):
            for launcher in launchers:  # alternating: the machine's load falls on each alike
                result = one_stop(state, launcher, base / f"{launcher}-{rep}",
                                  args.save_seconds, args.cap)  # fmt: skip
                results[launcher].append(result)
                print(f"{launcher} #{rep + 1}: sent spread {result['sent_spread']}, to exit "
                      f"{result['to_exit']:.2f} s, exit {result['code']}", flush=True)  # fmt: skip
    table = render_table(HEADERS, table_rows(results, args.save_seconds))
    print(table)
    path = write_results("stop", {
        "benchmark": "stop", "date": now_utc(), "command": command_line(), "machine": info,
        "machine_line": machine_line(info), "nodes": args.nodes, "slots": SLOTS,
        "save_s": args.save_seconds, "results": results, "table": table,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
