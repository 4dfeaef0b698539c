"""Benchmark: pre-flight. `orch doctor` against a serial ssh loop and DeepSpeed's check.

For each size (its own private sandbox), four methods alternate on the same nodes:

- deepspeed-check: what DeepSpeed's runner checks before a multi-node launch,
  `ssh -o PasswordAuthentication=no <first host> hostname` (first host only, no
  timeout of its own);
- serial-ssh: a shell loop over the hostfile, `ssh node <doctor's probe command>`
  one node after the other: the same facts doctor gathers, by hand;
- orch-preflight: doctor's `run_preflight` in a fresh Python process (parallel
  SSH, the probe, the main-port test), without the CLI's start-up;
- orch-doctor: `orch doctor --hostfile H --json`, as a user runs it.

Wall time, head CPU seconds per node (getrusage of the children), and how many
nodes each looked at. Then what each catches: on a 4-node sandbox whose LAST node
is frozen (SIGSTOP: sockets open, nothing answers), does it fail, how long does it
take, and does it name the node.

Run: .venv/bin/python bench/bench_preflight.py [--sizes 1,4,16,32] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ORCH,
    PYTHON,
    ROOT,
    Budget,
    Sample,
    alternation,
    command_line,
    exit_cleanly_on_sigterm,
    head_env,
    machine,
    machine_line,
    now_utc,
    print_header,
    private_sandbox,
    ratio,
    ratio_text,
    render_table,
    run_timed,
    sandbox_of,
    summarize,
    write_results,
)
from orchestrator.probe.commands import probe_command
from orchestrator.sandbox.state import SandboxState

METHODS = ("deepspeed-check", "serial-ssh", "orch-preflight", "orch-doctor")
# doctor's pre-flight in a fresh process without the CLI's start-up; prints doctor's
# findings for the nodes it names.
PREFLIGHT = """
import json, sys
from orchestrator.specs.inventory import read_hostfile
from orchestrator.checks.request import PreflightRequest
from orchestrator.prepare.preflight import run_preflight
hostfile, python, workdir, port, timeout = sys.argv[1:6]
request = PreflightRequest(read_hostfile(hostfile), python=python, workdir=workdir,
                           main_port=int(port))
report = run_preflight(request, timeout=float(timeout))
findings = [{"node": f.node, "severity": f.severity} for f in report.findings]
print(json.dumps({"ok": report.ok, "findings": findings}))
sys.exit(0 if report.ok else 1)
"""
# Per-node step timeout for the timing rows: generous, as the sandbox's nodes share the
# head's 2 cores (a probe can queue for seconds); the frozen-node row uses orch's default.
DOCTOR_TIMEOUT_S = 60


def doctor_timeout(nodes: int) -> float:
    """Every sandbox node's probe runs on the head's own cores, so at 128 nodes the
    probes queue for them for over a minute; on a real cluster each runs on its node."""
    return max(DOCTOR_TIMEOUT_S, 1.5 * nodes)


FROZEN_TIMEOUT_S = 10


def deepspeed_check_argv(state: SandboxState) -> list[str]:
    # deepspeed/launcher/runner.py: the whole multi-node pre-launch check.
    return ["ssh", "-o", "PasswordAuthentication=no", state.nodes[0].name, "hostname"]


def serial_ssh_argv(state: SandboxState) -> list[str]:
    """`for node in hostfile: ssh node <probe>`, as a shell loop; stops at the first failure."""
    names = [node.name for node in state.nodes]
    probe = probe_command(PYTHON, workdir=str(ROOT), script=None, names=names)
    loop = (
        'for node in "$@"; do ssh -o BatchMode=yes "$node" ' + shlex.quote(probe)
        + ' > /dev/null || { echo "failed: $node"; exit 1; }; done'
    )  # fmt: skip
    return ["bash", "-c", loop, "serial-ssh", *names]


def doctor_argv(state: SandboxState, port: int, timeout: float) -> list[str]:
    return [
        ORCH, "doctor", "--hostfile", state.hostfile, "--json",
        "--timeout", str(timeout), "--python", PYTHON, "--workdir", str(ROOT),
        "--main-port", str(port),
    ]  # fmt: skip


def preflight_argv(state: SandboxState, port: int, timeout: float) -> list[str]:
    return [
        PYTHON, "-c", PREFLIGHT, state.hostfile, PYTHON, str(ROOT), str(port), str(timeout),
    ]  # fmt: skip


def run_method(
    method: str, state: SandboxState, port: int, cap: float, timeout: float = DOCTOR_TIMEOUT_S
) -> Sample:
    if method == "deepspeed-check":
        argv = deepspeed_check_argv(state)
    elif method == "serial-ssh":
        argv = serial_ssh_argv(state)
    elif method == "orch-preflight":
        argv = preflight_argv(state, port, timeout)
    else:
        argv = doctor_argv(state, port, timeout)
    done = run_timed(argv, cwd=ROOT, env=head_env(), timeout=cap)
    checked = 1 if method == "deepspeed-check" else len(state.nodes)
    note = "killed at the cap" if done.code is None else f"exit {done.code}"
    named: list[str] = []
    if method == "serial-ssh":
        named = sorted(line.split(": ", 1)[1] for line in done.output.splitlines()
                       if line.startswith("failed: "))  # fmt: skip
    elif method != "deepspeed-check":
        named = sorted(_nodes_named(done.output))
        if named:
            note += f", names {', '.join(named)}"
    return Sample(
        wall=done.wall, cpu=done.cpu, ok=done.code == 0, note=note,
        extra={"nodes_checked": checked, "exit_code": done.code, "nodes_named": named},
    )  # fmt: skip


def _nodes_named(output: str) -> set[str]:
    """The nodes that doctor's JSON findings name (errors only)."""
    # stdout and stderr arrive merged: the JSON document is the part from its first line.
    start = 0 if output.startswith("{") else output.find("\n{") + 1
    try:
        document = json.loads(output[start:]) if start >= 0 else {}
    except ValueError:
        return set()
    return {
        f.get("node", "")
        for f in document.get("findings", [])
        if isinstance(f, dict) and f.get("severity") == "error"
    }


def bench_sizes(sizes: list[int], reps: int, budget: Budget) -> dict[int, dict[str, list[Sample]]]:
    results: dict[int, dict[str, list[Sample]]] = {}
    for nodes in sizes:
        if budget.expired():
            break
        port = 29100 + uuid.uuid4().int % 500
        results[nodes] = {m: [] for m in METHODS}
        with private_sandbox(nodes, 1, tag="pd") as state:
            # One uncounted run first: the nodes' first Python start-ups fill the page cache.
            timeout = doctor_timeout(nodes)
            run_method("orch-preflight", state, port, cap=600, timeout=timeout)
            for rep, method in alternation(METHODS, reps):
                sample = run_method(method, state, port, cap=600, timeout=timeout)
                results[nodes][method].append(sample)
                print(f"  {nodes:3d} nodes rep {rep + 1} {method:16s} {sample.wall:6.2f} s "
                      f"{sample.cpu:6.2f} s CPU  {sample.note}", flush=True)  # fmt: skip
    return results


def frozen_node_check(cap: float) -> dict[str, Sample]:
    """4 nodes, the last one frozen: which check notices, how fast, naming what."""
    outcome: dict[str, Sample] = {}
    with private_sandbox(4, 1, tag="pf") as state:
        box = sandbox_of(state)
        victim = state.nodes[-1].name
        box.freeze(victim)
        try:
            for method in METHODS:
                outcome[method] = run_method(method, state, 29099, cap, FROZEN_TIMEOUT_S)
                print(f"  frozen {victim}: {method:16s} {outcome[method].wall:6.2f} s "
                      f"{outcome[method].note}", flush=True)  # fmt: skip
        finally:
            box.thaw(victim)
    return outcome


def doctor_with_defaults(nodes: int, reps: int) -> dict[str, list[Sample]]:
    """`orch doctor` as a user runs it, no timeout given (connect 10 s, probe 120 s), on a
    sandbox of `nodes`; then the same with its last node frozen."""
    outcome: dict[str, list[Sample]] = {"all answer": [], "last node frozen": []}
    argv_of = lambda state: [  # noqa: E731
        ORCH, "doctor", "--hostfile", state.hostfile, "--json", "--python", PYTHON,
        "--workdir", str(ROOT),
    ]  # fmt: skip
    with private_sandbox(nodes, 1, tag="pz") as state:
        run_timed(argv_of(state), cwd=ROOT, env=head_env(), timeout=900)  # page cache
        for case in outcome:
            if case == "last node frozen":
                sandbox_of(state).freeze(state.nodes[-1].name)
            for rep in range(reps if case == "all answer" else 1):
                done = run_timed(argv_of(state), cwd=ROOT, env=head_env(), timeout=900)
                failing = sorted(_nodes_named(done.output))
                sample = Sample(
                    wall=done.wall, cpu=done.cpu, ok=done.code is not None,
                    note=f"exit {done.code}", extra={"failing": failing},
                )  # fmt: skip
                outcome[case].append(sample)
                print(f"  {nodes} nodes, {case}, rep {rep + 1}: {done.wall:6.2f} s, exit "
                      f"{done.code}, failing: {', '.join(failing) or '-'}", flush=True)  # fmt: skip
        sandbox_of(state).thaw(state.nodes[-1].name)
    return outcome


def defaults_rows(nodes: int, outcome: dict[str, list[Sample]]) -> list[list[object]]:
    return [
        [nodes, case, summarize([s.wall for s in samples]).text(),
         ", ".join(sorted({s.note for s in samples})),
         "; ".join(sorted({", ".join(s.extra["failing"]) or "-" for s in samples}))]
        for case, samples in outcome.items()
    ]  # fmt: skip


def size_rows(results: dict[int, dict[str, list[Sample]]]) -> list[list[object]]:
    rows: list[list[object]] = []
    for nodes, by_method in results.items():
        ds = summarize([s.wall for s in by_method["deepspeed-check"] if s.ok])
        loop = summarize([s.wall for s in by_method["serial-ssh"] if s.ok])
        for method, samples in by_method.items():
            good = [s for s in samples if s.ok]
            wall = summarize([s.wall for s in good])
            cpu_per_node = summarize([s.cpu / nodes for s in good])
            checked = samples[0].extra["nodes_checked"] if samples else 0
            rows.append([
                nodes, method, f"{checked}/{nodes}", wall.text(2), cpu_per_node.text(3),
                ratio_text(ratio(wall.median, ds.median)),
                ratio_text(ratio(loop.median, wall.median)), f"{len(good)}/{len(samples)}",
            ])  # fmt: skip
    return rows


def frozen_rows(outcome: dict[str, Sample]) -> list[list[object]]:
    rows: list[list[object]] = []
    for method, sample in outcome.items():
        if sample.extra.get("exit_code") is None:
            verdict = "still running at the cap (killed)"
        else:
            verdict = "passes: the frozen node is not seen" if sample.ok else "fails"
        named = sample.extra.get("nodes_named") or []
        rows.append([method, f"{sample.wall:.2f}", verdict, ", ".join(named) or "-"])  # type: ignore[arg-type]
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,32")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cap", type=float, default=1800.0, help="total time cap, s")
    parser.add_argument("--quick", action="store_true", help="sizes 1,4; 1 repetition")
    parser.add_argument("--no-frozen", action="store_true", help="skip the frozen-node check")
    parser.add_argument(
        "--defaults", type=int, metavar="NODES",
        help="only `orch doctor` with its default timeouts on NODES nodes, then with the last "
        "node frozen",
    )  # fmt: skip
    return parser.parse_args()


def main() -> None:
    exit_cleanly_on_sigterm()
    args = parse_args()
    sizes = [1, 4] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 1 if args.quick else args.reps
    info = machine()
    print_header("pre-flight: orch doctor vs a serial ssh loop and DeepSpeed's check", info)
    budget = Budget(args.cap)
    if args.defaults:
        outcome = doctor_with_defaults(args.defaults, reps)
        table = render_table(["nodes", "case", "wall s, median (min-max)", "exit",
                              "nodes failing"], defaults_rows(args.defaults, outcome))  # fmt: skip
        print(table)
        path = write_results("preflight-defaults", {
            "benchmark": "preflight-defaults", "date": now_utc(), "command": command_line(),
            "machine": info, "machine_line": machine_line(info), "nodes": args.defaults,
            "reps": reps, "results": outcome, "table": table,
        })  # fmt: skip
        print(f"results: {path}")
        return
    results = bench_sizes(sizes, reps, budget)
    frozen = {} if args.no_frozen else frozen_node_check(cap=120.0)
    headers = ["nodes", "method", "nodes checked", "wall s, median (min-max)",
               "head CPU s per node", "wall / DeepSpeed check", "serial loop / this",
               "ok runs"]  # fmt: skip
    table = render_table(headers, size_rows(results))
    frozen_table = render_table(
        ["4 nodes, last one frozen", "wall s", "verdict", "nodes named"], frozen_rows(frozen)
    )
    print(table)
    print(frozen_table)
    path = write_results(
        "preflight",
        {
            "benchmark": "preflight",
            "doctor_timeout_s": {str(n): doctor_timeout(n) for n in results},
            "date": now_utc(),
            "command": command_line(),
            "machine": info,
            "machine_line": machine_line(info),
            "reps": reps,
            "results": {str(n): r for n, r in results.items()},
            "frozen_last_node": frozen,
            "tables": {"sizes": table, "frozen": frozen_table},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
