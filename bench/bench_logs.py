"""Log path cost: a job whose ranks print as fast as Python can, through orch and without it.

Methods, alternating, several repetitions each, on a private sandbox:
- pdsh:        `pdsh -R ssh -w NODES python print_fast.py N`, output to a file (what
               orch's log path replaces; no accelerate)
- pdsh-unbuffered: the same with PYTHONUNBUFFERED=1 (lines leave the rank as printed,
               as they do under orch's agent and DeepSpeed's runner); not run by default
- orch-wire:   the same command under orch's node agent through pdsh, pdsh's output
               through orch's LogRouter into per-node logs (orch's log path alone)
- orch-wire-ranks: the same, with the rank started through orch-rank as every launcher
               starts it under orch launch: the rank's output on its own connections
               to the agent, its lines tagged with its rank (the per-rank path)
- accelerate:  `accelerate launch --config_file <pdsh config> print_fast.py N` (the seed
               recipe: DeepSpeed's pdsh runner), output to a file
- orch:        `orch launch --hostfile H -- print_fast.py N` (the same accelerate path,
               under orch: agent, wire, per-node logs, plain live view to a file)
- orch@NAME:   `orch launch` as above, its head run from the source tree given as
               `--tree NAME=PATH` (`python -m orchestrator` with PYTHONPATH=PATH): a tree
               before a change and after it, alternating in one run on one sandbox

Wall time is the whole run; head CPU is getrusage(RUSAGE_CHILDREN) of the run (pdsh,
its ssh clients, accelerate's head side, orch's head). Lines delivered: the numbered
lines found in what the head kept (output file or per-node logs), of nodes x ranks x N.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    PYTHON,
    ROOT,
    Budget,
    Sample,
    command_line,
    head_env,
    kill_token,
    launcher_argv,
    machine,
    machine_line,
    now_utc,
    prepare_workdir,
    print_header,
    private_sandbox,
    ratio,
    ratio_text,
    render_table,
    run_alternating,
    run_timed,
    summarize,
    write_results,
)

JOB = ROOT / "bench" / "jobs" / "print_fast.py"
METHODS = ("pdsh", "orch-wire", "orch-wire-ranks", "accelerate", "orch")
WIRE_METHODS = ("orch-wire", "orch-wire-ranks")
RUN_TIMEOUT_S = 900.0
_NUMBERED = re.compile(rb"r\d+ step \d+ ")


def count_numbered(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        rest = b""
        with path.open("rb") as handle:
            while block := handle.read(1 << 22):
                # count whole lines only: a line cut by the block edge waits for the next
                block = rest + block
                cut = block.rfind(b"\n") + 1
                total += len(_NUMBERED.findall(block, 0, cut))
                rest = block[cut:]
        total += len(_NUMBERED.findall(rest))
    return total


class LogRuns:
    def __init__(self, state, base: Path, lines: int, slots: int,
                 trees: dict[str, str] | None = None) -> None:  # fmt: skip
        self.state = state
        self.trees = trees or {}
        self.base = base
        self.lines = lines
        self.slots = slots
        self.hosts = [n.name for n in state.nodes]
        self.hostfile = base / "hostfile"
        self.hostfile.write_text("".join(f"{h} slots={slots}\n" for h in self.hosts))
        self.port = 29700 + uuid.uuid4().int % 100 * 10
        self.count = 0

    def expected(self, method: str) -> int:
        launched = method.partition("@")[0] in ("accelerate", "orch")
        ranks = len(self.hosts) * (self.slots if launched else 1)
        return ranks * self.lines

    def argv(self, method: str, token: str, workdir: Path) -> list[str]:
        self.count += 1
        job = [str(JOB), str(self.lines), token]
        if method in ("pdsh", "pdsh-unbuffered"):
            # unbuffered: each line leaves the rank when printed, as under orch's agent
            # and DeepSpeed's runner (both set PYTHONUNBUFFERED=1 for live output)
            unbuffered = ["PYTHONUNBUFFERED=1"] if method == "pdsh-unbuffered" else []
            remote = " ".join([*unbuffered, PYTHON, *job])
            return ["pdsh", "-R", "ssh", "-f", "64", "-w", ",".join(self.hosts), remote]
        if method in WIRE_METHODS:
            ranks = "ranks" if method == "orch-wire-ranks" else "node"
            return [PYTHON, __file__, "--wire-child", ranks, ",".join(self.hosts), str(workdir),
                    *job]  # fmt: skip
        if method in ("accelerate", "orch") or method.startswith("orch@"):
            argv = launcher_argv(
                method.partition("@")[0], self.state, job=job, workdir=workdir,
                port=self.port + self.count, runs_dir=workdir / "runs",
                processes_per_node=self.slots, hostfile=str(self.hostfile),
            )  # fmt: skip
            return [PYTHON, "-m", "orchestrator", *argv[1:]] if "@" in method else argv
        raise ValueError(f"unknown method {method}")

    def kept(self, method: str, workdir: Path, log: Path) -> list[Path]:
        if method in WIRE_METHODS:
            return sorted((workdir / "logs").glob("*.log"))
        if method.partition("@")[0] == "orch":
            return sorted((workdir / "runs").glob("*/logs/*.log"))
        return [log]

    def run(self, method: str) -> Sample:
        token = f"bench-logs-{uuid.uuid4().hex[:10]}"
        workdir = prepare_workdir(self.base, f"{method}-{self.count + 1}")
        log = workdir / "output.log"
        tree = self.trees.get(method.partition("@")[2])
        done = run_timed(
            self.argv(method, token, workdir), cwd=workdir,
            env=head_env({"PYTHONPATH": tree} if tree else None), timeout=RUN_TIMEOUT_S, log=log,
        )  # fmt: skip
        leftovers = kill_token(token)
        delivered = count_numbered(self.kept(method, workdir, log))
        expected = self.expected(method)
        ok = done.code == 0 and delivered == expected
        note = f"exit {done.code}, {delivered}/{expected} lines"
        if leftovers:
            note += f", {leftovers} processes left behind (killed)"
        if not ok:
            print(f"  {method}: FAILED ({note}); output: {log}", file=sys.stderr)
        return Sample(
            wall=done.wall, cpu=done.cpu, ok=ok, note=note,
            extra={"lines": delivered, "expected": expected},
        )  # fmt: skip


def _write_private(job_id: str, hosts: list[str], rank_argv: list[str]) -> str:
    """The rank's command in each node's private file, as orch writes it before a launch
    (the sandbox's nodes share this machine's /tmp); its hash, for the agent's spec."""
    from orchestrator.plan.launch_plan import node_private_text
    from orchestrator.remote.agent_spec import PRIVATE_FILE, node_dir

    text = node_private_text({}, rank_argv)
    for host in hosts:
        directory = Path(node_dir(job_id, host, os.getuid()))
        directory.mkdir(parents=True, exist_ok=True)
        (directory / PRIVATE_FILE).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def wire_child(ranks: str, hosts: str, workdir: str, job: list[str]) -> int:
    """orch's log path alone: the node agent under pdsh, the head's LogRouter; with
    ranks == "ranks", the node's one rank started through orch-rank (rank = node rank)."""
    from orchestrator.logs.router import LogRouter
    from orchestrator.plan import agent_command
    from orchestrator.remote.agent_spec import AgentSpec
    from orchestrator.remote.logwire import ControlKind

    spec = AgentSpec(
        job_id=f"benchlogs-{uuid.uuid4().hex[:8]}", workdir=workdir, command=(PYTHON, *job)
    )
    if ranks == "ranks":
        private = _write_private(spec.job_id, hosts.split(","), [PYTHON, *job])
        spec = replace(spec, shell='RANK="$ORCH_NODE_RANK" LOCAL_RANK=0 exec orch-rank',
                       private_sha256=private)  # fmt: skip
    remote = agent_command.agent_command(PYTHON, spec)
    argv = ["pdsh", "-R", "ssh", "-f", "64", "-w", hosts, remote]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    # As orch launch does: one thread only drains pdsh's pipe (pdsh burns CPU when
    # its stdout backs up), the router works on what it read.
    chunks: queue.Queue[bytes] = queue.Queue()
    fd = process.stdout.fileno()  # type: ignore[union-attr]

    def drain() -> None:
        while data := os.read(fd, 1 << 16):
            chunks.put(data)
        chunks.put(b"")

    threading.Thread(target=drain, daemon=True).start()
    exits: dict[str, int] = {}
    with LogRouter(Path(workdir) / "logs") as router:
        while data := chunks.get():
            for node, record in router.feed(data):
                if record.text == ControlKind.EXIT:
                    exits[node] = int(record.fields.get("code", 1))
    code = process.wait()
    from orchestrator.remote.agent_spec import runs_root

    subprocess.run(["rm", "-rf", f"{runs_root(os.getuid())}/{spec.job_id}"], check=False)
    return code or max(exits.values(), default=1)


def table_rows(samples: dict[str, list[Sample]]) -> list[list[object]]:
    good = {m: [s for s in runs if s.ok] for m, runs in samples.items()}
    wall = {m: summarize([s.wall for s in runs]) for m, runs in good.items()}
    cpu = {m: summarize([s.cpu for s in runs]) for m, runs in good.items()}
    base = {
        "pdsh": "pdsh", "pdsh-unbuffered": "pdsh", "orch-wire": "pdsh", "orch-wire-ranks": "pdsh",
        "accelerate": "accelerate", "orch": "accelerate",
    }  # fmt: skip
    rows = []
    for method, runs in samples.items():
        ref = base[method.partition("@")[0]]
        lines = sorted({f"{s.extra['lines']}/{s.extra['expected']}" for s in runs})
        rows.append([
            method, wall[method].text(), cpu[method].text(),
            ratio_text(ratio(wall[method].median, wall[ref].median)) if ref in wall else "n/a",
            ratio_text(ratio(cpu[method].median, cpu[ref].median)) if ref in cpu else "n/a",
            ", ".join(lines), f"{len(good[method])}/{len(runs)}",
        ])  # fmt: skip
    return rows


HEADERS = [
    "method", "wall s, median (min-max)", "head CPU s, median (min-max)", "wall vs plain",
    "head CPU vs plain", "lines delivered", "ok runs",
]  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1, help="ranks per node (accelerate, orch)")
    parser.add_argument("--lines", type=int, default=200_000, help="numbered lines per rank")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cap", type=float, default=3600.0, help="total time cap, seconds")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="also run orch (method orch@NAME) from the source tree PATH")
    parser.add_argument("--wire-child", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.wire_child:
        ranks, hosts, workdir, *job = args.wire_child
        sys.exit(wire_child(ranks, hosts, workdir, job))
    trees = dict(tree.split("=", 1) for tree in args.tree)
    trees = {name: str(Path(path).resolve()) for name, path in trees.items()}
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    methods += tuple(f"orch@{name}" for name in trees)
    info = machine()
    print_header("log path: ranks printing as fast as Python can", info)
    print(
        f"methods: {', '.join(methods)}; {args.nodes} nodes; {args.lines} lines per rank; "
        f"reps: {args.reps}",
        flush=True,
    )
    budget = Budget(args.cap)
    with private_sandbox(args.nodes, args.slots, tag="lg") as state:
        base = Path(tempfile.mkdtemp(prefix="orch-bench-logs-"))
        runs = LogRuns(state, base, args.lines, args.slots, trees)
        samples = run_alternating(methods, args.reps, budget, runs.run)
    table = render_table(HEADERS, table_rows(samples))
    print(table)
    path = write_results(
        "logs",
        {
            "benchmark": "logs",
            "date": now_utc(),
            "command": command_line(),
            "machine": info,
            "machine_line": machine_line(info),
            "methods": methods,
            "trees": trees,
            "nodes": args.nodes,
            "slots": args.slots,
            "lines_per_rank": args.lines,
            "reps": args.reps,
            "results": samples,
            "table": table,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
