"""Benchmark: time to teardown after a rank crash, a node freeze and Ctrl-C.

One private sandbox (4 nodes x 2 ranks by default). For each scenario the
methods run alternating, several repetitions:

- crash:  the last rank (on the last node) exits 7 after its third step; the
          fault time is the time stamp the rank writes just before it exits;
- freeze: every rank has reached an all_reduce loop; then every process of the
          last node (its sshd included) gets SIGSTOP: sockets stay open, nothing
          answers (`Sandbox.freeze`);
- sigint: every rank is in the all_reduce loop; then SIGINT goes to the
          launcher's whole process group, as Ctrl-C in a terminal does;
- hang:   every rank has reached the all_reduce loop; then the last rank stops in
          plain Python and the others wait for it, silently (orch runs with
          --hang-timeout 30); the fault time is the stamp the rank writes as it stops.

Teardown time: from the fault until the launcher has exited AND no process of
the job is left on any node that can still run (the frozen node excluded).
Methods that do not get there within --cap seconds are reported as "> cap"
(they are then killed by the benchmark). Job processes are found by a unique
token in the job's arguments (the head sees every node's processes).

Run: .venv/bin/python bench/bench_teardown.py [--reps 2] [--cap 120] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    JOB_SCRIPT,
    Budget,
    Sample,
    alternation,
    command_line,
    exit_cleanly_on_sigterm,
    head_env,
    kill_session,
    kill_token,
    launcher_argv,
    machine,
    machine_line,
    now_utc,
    orch_launch_available,
    prepare_workdir,
    print_header,
    private_sandbox,
    processes_with_token,
    render_table,
    sandbox_of,
    summarize,
    warm_up_job_ops,
    write_results,
)
from orchestrator.sandbox.state import SandboxState

SLOTS = 2
SCENARIOS = ("crash", "freeze", "sigint", "hang")
HANG_TIMEOUT_S = 30  # orch's --hang-timeout in the hang scenario
PLAIN_METHODS = ("accelerate", "deepspeed")
START_TIMEOUT_S = 480.0  # the job must reach the fault point within this (loaded 2-core box)
POLL_S = 0.25


@dataclass(frozen=True)
class Outcome:
    """What one teardown run saw; `teardown` is None when the cap was reached."""

    teardown: float | None
    launcher_exit: float | None
    nodes_clear: float | None  # no job process left on a runnable node (head not counted)
    exit_code: int | None
    leftovers: dict[str, int]
    note: str

    def sample(self, cap: float) -> Sample:
        wall = self.teardown if self.teardown is not None else cap
        return Sample(
            wall=wall,
            cpu=0.0,
            ok=self.teardown is not None,
            note=self.note,
            extra={
                "launcher_exit_s": self.launcher_exit,
                "nodes_clear_s": self.nodes_clear,
                "exit_code": self.exit_code,
                "leftovers_at_cap": self.leftovers,
            },
        )


class Teardowns:
    def __init__(self, state: SandboxState, base: Path, cap: float) -> None:
        self.state = state
        self.base = base
        self.cap = cap
        self.world = len(state.nodes) * SLOTS
        self.victim = state.nodes[-1].name
        self.port = 29400 + uuid.uuid4().int % 100 * 2
        self.count = 0

    def argv(self, method: str, job: list[str], workdir: Path, scenario: str) -> list[str]:
        self.count += 1
        hang = ("--hang-timeout", str(HANG_TIMEOUT_S)) if scenario == "hang" else ()
        return launcher_argv(
            method, self.state, job=job, workdir=workdir, port=self.port + self.count,
            runs_dir=self.base / "runs", processes_per_node=SLOTS, orch_options=hang,
        )  # fmt: skip

    def job_args(self, scenario: str, token: str, events: Path) -> list[str]:
        job = [str(JOB_SCRIPT), "--steps", "6", "--events", str(events), "--token", token]
        if scenario == "crash":
            return [*job, "--crash-rank", str(self.world - 1), "--crash-code", "7"]
        if scenario == "hang":
            return [*job, "--hang", "--stall-rank", str(self.world - 1)]
        return [*job, "--hang"]

    def run(self, scenario: str, method: str) -> Outcome:
        token = f"bench-teardown-{uuid.uuid4().hex[:10]}"
        events = self.base / f"events-{token}"
        events.mkdir(parents=True)
        workdir = prepare_workdir(self.base, method)
        log = self.base / f"{scenario}-{method}-{self.count + 1}.log"
        argv = self.argv(method, self.job_args(scenario, token, events), workdir, scenario)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=workdir, env=head_env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            try:
                return self._fault_and_watch(scenario, proc, token, events)
            finally:
                self._clean_up(proc, token, scenario)

    def _fault_and_watch(
        self, scenario: str, proc: subprocess.Popen, token: str, events: Path
    ) -> Outcome:
        fault_at = self._wait_and_inject(scenario, proc, events)
        if fault_at is None:
            return Outcome(None, None, None, proc.poll(), {}, "job never reached the fault point")
        exited_at: float | None = None
        clear_at: float | None = None
        frozen = self.victim if scenario == "freeze" else None
        while time.time() - fault_at < self.cap:
            if exited_at is None and proc.poll() is not None:
                exited_at = time.time()
            alive = [n for n in processes_with_token(token).values() if n != frozen]
            if clear_at is None and not [n for n in alive if n != "head"]:
                clear_at = time.time()
            if exited_at is not None and not alive:
                return Outcome(
                    teardown=time.time() - fault_at,
                    launcher_exit=exited_at - fault_at,
                    nodes_clear=(clear_at or time.time()) - fault_at,
                    exit_code=proc.returncode,
                    leftovers={},
                    note=f"exit {proc.returncode}" + self._named(),
                )
            time.sleep(POLL_S)
        leftovers: dict[str, int] = {}
        for node in processes_with_token(token).values():
            if node != frozen:
                leftovers[node] = leftovers.get(node, 0) + 1
        state = "launcher still running" if proc.poll() is None else f"exit {proc.returncode}"
        return Outcome(
            teardown=None,
            launcher_exit=None if exited_at is None else exited_at - fault_at,
            nodes_clear=None if clear_at is None else clear_at - fault_at,
            exit_code=proc.poll(),
            leftovers=leftovers,
            note=f"not torn down within {self.cap:.0f} s: {state}, "
            f"{sum(leftovers.values())} job processes still on {sorted(leftovers)}",
        )

    def _named(self) -> str:
        """What orch's record names as the first failure (plain tools keep no record)."""
        records = sorted((self.base / "runs").glob("*/job.json"), key=lambda p: p.stat().st_mtime)
        if not records:
            return ""
        failure = json.loads(records[-1].read_text()).get("first_failure") or {}
        if failure.get("kind") != "hang":
            return ""
        where = failure.get("reason", "").rpartition(" at ")[2]
        return f", names rank {failure.get('rank')} at {where}"

    def _wait_and_inject(self, scenario: str, proc: subprocess.Popen, events: Path) -> float | None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if scenario in ("crash", "hang"):  # the job faults by itself, and says when
                said = events / ("crash" if scenario == "crash" else "stall")
                if said.exists() and said.read_text():
                    return float(said.read_text())
            elif len(list(events.glob("ready-*"))) >= self.world:
                if scenario == "freeze":
                    sandbox_of(self.state).freeze(self.victim)
                else:
                    os.killpg(proc.pid, signal.SIGINT)
                return time.time()
            if proc.poll() is not None:
                return None
            time.sleep(POLL_S)
        return None

    def _clean_up(self, proc: subprocess.Popen, token: str, scenario: str) -> None:
        if scenario == "freeze":
            sandbox_of(self.state).thaw(self.victim)
        if proc.poll() is None:
            kill_session(proc)
        deadline = time.time() + 30
        while kill_token(token) and time.time() < deadline:
            time.sleep(0.5)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def run_all(
    state: SandboxState, methods: tuple[str, ...], scenarios: list[str], reps: int,
    cap: float, budget: Budget,
) -> dict[str, dict[str, list[Outcome]]]:  # fmt: skip
    base = Path(tempfile.mkdtemp(prefix="orch-bench-teardown-"))
    runner = Teardowns(state, base, cap)
    results: dict[str, dict[str, list[Outcome]]] = {}
    for scenario in scenarios:
        results[scenario] = {m: [] for m in methods}
        for rep, method in alternation(methods, reps):
            if budget.expired():
                print("  time cap reached", file=sys.stderr)
                return results
            outcome = runner.run(scenario, method)
            results[scenario][method].append(outcome)
            shown = "> cap" if outcome.teardown is None else f"{outcome.teardown:.1f} s"
            if outcome.nodes_clear is not None:
                shown += f" (nodes clear {outcome.nodes_clear:.1f} s)"
            print(f"  {scenario:6s} rep {rep + 1} {method:10s} {shown:>9s}  {outcome.note}",
                  flush=True)  # fmt: skip
    print(f"  logs: {base}")
    return results


HEADERS = [
    "scenario", "method", "teardown s, median (min-max)", "nodes clear s", "ended within cap",
    "notes",
]  # fmt: skip


def table_rows(results: dict[str, dict[str, list[Outcome]]], cap: float) -> list[list[object]]:
    rows: list[list[object]] = []
    for scenario, by_method in results.items():
        for method, outcomes in by_method.items():
            ended = [o.teardown for o in outcomes if o.teardown is not None]
            if len(ended) == len(outcomes) and ended:
                shown = summarize(ended).text()
            elif ended:
                shown = f"{summarize(ended).text()}; other runs > {cap:.0f} (cap)"
            else:
                shown = f"> {cap:.0f} (cap)"
            notes = "; ".join(sorted({o.note for o in outcomes}))
            clear = [o.nodes_clear for o in outcomes if o.nodes_clear is not None]
            clear_text = summarize(clear).text() if clear else "-"
            rows.append(
                [scenario, method, shown, clear_text, f"{len(ended)}/{len(outcomes)}", notes]
            )
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--cap", type=float, default=120.0, help="teardown cap per run, s")
    parser.add_argument("--total-cap", type=float, default=3600.0, help="whole run cap, s")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--methods", default="", help="subset of accelerate,deepspeed,orch")
    parser.add_argument("--quick", action="store_true", help="1 repetition, 60 s cap")
    return parser.parse_args()


def main() -> None:
    exit_cleanly_on_sigterm()
    args = parse_args()
    reps = 1 if args.quick else args.reps
    cap = min(args.cap, 60.0) if args.quick else args.cap
    if args.methods:
        methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    else:
        methods = PLAIN_METHODS + (("orch",) if orch_launch_available() else ())
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    info = machine()
    print_header("time to teardown", info)
    print(f"methods: {', '.join(methods)}; scenarios: {scenarios}; reps: {reps}; "
          f"cap {cap:.0f} s; {args.nodes} nodes x {SLOTS} ranks", flush=True)  # fmt: skip
    print(f"warm-up (DeepSpeed CPU op build/load): {warm_up_job_ops():.1f} s", flush=True)
    budget = Budget(args.total_cap)
    with private_sandbox(args.nodes, SLOTS, tag="bt") as state:
        results = run_all(state, methods, scenarios, reps, cap, budget)
    table = render_table(HEADERS, table_rows(results, cap))
    print(table)
    path = write_results(
        "teardown",
        {
            "benchmark": "teardown",
            "date": now_utc(),
            "command": command_line(),
            "machine": info,
            "machine_line": machine_line(info),
            "cap_s": cap,
            "nodes": args.nodes,
            "methods": methods,
            "results": {
                scenario: {m: [o.sample(cap) for o in outs] for m, outs in by_method.items()}
                for scenario, by_method in results.items()
            },
            "table": table,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
