"""Benchmark: `orch doctor` as a user runs it (no timeout given) on many sandbox nodes, every
one of them on this machine's cores: slow probes are not dead nodes, so every node passes;
and a node frozen among them (SIGSTOP: sockets open, nothing answers) is still named as not
answering, with the connect timeout.

The suite keeps the same checks on 16 nodes (tests/cli/test_doctor_scale_sandbox.py); this
is the measurement at 128, where the probes queue for the head's cores for minutes.
Per size: wall time and head CPU of each doctor run, its exit code, how many nodes it
reported, and the nodes it named with an error.

Run: .venv/bin/python bench/bench_doctor_scale.py [--sizes 128] [--budget 3600]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ORCH,
    ROOT,
    Budget,
    exit_cleanly_on_sigterm,
    head_env,
    machine,
    now_utc,
    print_header,
    private_sandbox,
    render_table,
    run_timed,
    sandbox_of,
    write_results,
)


def error_nodes(report: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for finding in report.get("findings", []):
        if finding["severity"] == "error":
            found.setdefault(finding["node"], []).append(finding["problem"])
    return found


def doctor(hostfile: str, timeout: float) -> dict[str, object]:
    done = run_timed([ORCH, "doctor", "--hostfile", hostfile, "--json"], cwd=ROOT,
                     env=head_env(), timeout=timeout)  # fmt: skip
    start = done.output.find("{")
    report = json.loads(done.output[start:]) if start >= 0 else {}
    errors = error_nodes(report)
    return {"code": done.code, "wall_s": round(done.wall, 1), "head_cpu_s": round(done.cpu, 1),
            "nodes": len(report.get("nodes", [])), "error_nodes": sorted(errors),
            "timed_out_named": [n for n, problems in errors.items()
                                if any("timed out" in p for p in problems)]}  # fmt: skip


def measure(size: int, budget: Budget) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    with private_sandbox(size, 1, tag="doctorscale") as state:
        rows.append({"size": size, "run": "all up",
                     **doctor(state.hostfile, budget.remaining())})  # fmt: skip
        frozen = state.nodes[-1].name
        box = sandbox_of(state)
        box.freeze(frozen)
        try:
            row = doctor(state.hostfile, budget.remaining())
        finally:
            box.thaw(frozen)
        rows.append({"size": size, "run": f"{frozen} frozen", **row,
                     "named_only_the_frozen": row["error_nodes"] == [frozen]})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128")
    parser.add_argument("--budget", type=float, default=3600.0, help="seconds in all")
    args = parser.parse_args()
    exit_cleanly_on_sigterm()
    info = machine()
    print_header("orch doctor at scale, on sandbox nodes", info)
    budget = Budget(args.budget)
    rows: list[dict[str, object]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows.extend(measure(size, budget))
    headers = ["nodes", "run", "exit", "wall s", "head CPU s", "reported", "named"]
    print(render_table(headers, [
        [r["size"], r["run"], r["code"], r["wall_s"], r["head_cpu_s"], r["nodes"],
         ",".join(r["error_nodes"]) or "-"] for r in rows  # type: ignore[arg-type]
    ]))  # fmt: skip
    path = write_results("doctor_scale", {"date": now_utc(), "machine": info, "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
