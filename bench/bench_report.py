"""The job's page: its size, the time to build it, and the time Chromium takes to render it.

Pages measured:
- synthetic run directories of N ranks (8 per node; `--ranks 128,1000`): a failed job as
  orch leaves it (tests/_report_job.py), every rank's end, the teardown's stacks, the
  pre-flight's report, the moments, and SAMPLES progress samples per rank (by default
  what the per-job cap leaves each rank: 50,000 / N);
- with `--demo`, the jobs of the sandbox demo, run on a private 4-node x 2-slot sandbox
  from this checkout: the cpu-smoke recipe (`orch submit recipes/cpu-smoke.yaml`, real
  accelerate + DeepSpeed on CPU, as scripts/demo.sh runs it), and a job with a straggler
  and a failure (tests/jobs/straggler.py: rank 3 three times slower per step, rank 6
  raising at step 25); `--screenshot PATH` keeps the latter's page as a PNG (README);
- any run directory given with `--run-dir`.

Build time is `write_report` (read the run directory, draw, write the file), in this
process, median of REPS. Chromium time is the wall and CPU time (every process of it) of
`chromium --headless --dump-dom` on the page, median of REPS, next to the same on an empty
page: most of it is the browser's own start.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from common import ROOT

sys.path.insert(0, str(ROOT / "tests"))

from _chromium import QUIET
from _report_job import failed_job

from orchestrator.logs.progress import SAMPLE_CAP
from orchestrator.records.job import PROGRESS_FILE
from orchestrator.records.rundir import RunDir
from orchestrator.report import write_report
from orchestrator.specs.units import format_bytes

PER_NODE = 8
STRAGGLER_JOB = ROOT / "tests" / "jobs" / "straggler.py"
RECIPE = ROOT / "recipes" / "cpu-smoke.yaml"
CHROMIUM = "chromium"


def synthetic(base: Path, ranks: int, samples: int | None) -> Path:
    """A failed job of `ranks` ranks, with `samples` progress samples per rank over an hour."""
    run = failed_job(base / f"ranks-{ranks}", nodes=ranks // PER_NODE, per_node=PER_NODE)
    record = run.load()
    per_rank = samples if samples is not None else SAMPLE_CAP // ranks
    start = record.ranks[0].start or 0.0
    lines = []
    for rank in record.ranks:
        step = 0.3 if rank.rank == 2 else 0.1
        for i in range(per_rank):
            t = start + 3600.0 * i / per_rank
            steps = int((t - start) / step)
            lines.append(f'{{"t":{t:.3f},"node":"{rank.node}","rank":{rank.rank},'
                         f'"n":{steps},"total":null,"rate":{1 / step:.4g}}}')  # fmt: skip
    (run.path / PROGRESS_FILE).write_text("\n".join(lines) + "\n")
    return run.path


def orch_argv(*args: str) -> list[str]:
    return [common.PYTHON, "-m", "orchestrator", *args]


def demo_jobs(base: Path) -> list[Path]:
    """The sandbox demo's jobs on a private 4-node sandbox; their run directories."""
    runs = base / "runs"
    env = common.head_env({"PYTHONPATH": str(ROOT), "ORCH_RUNS_DIR": str(runs)})
    found: list[Path] = []
    with common.private_sandbox(4, 2, tag="report") as state:
        jobs = [
            orch_argv("submit", str(RECIPE), "--hostfile", state.hostfile),
            orch_argv("launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
                      "--nproc-per-node", "2", str(STRAGGLER_JOB), "--", "--steps", "60",
                      "--step", "0.1", "--slow-rank", "3", "--fail-rank", "6", "--fail-at",
                      "25"),
        ]  # fmt: skip
        for argv in jobs:
            before = set(runs.iterdir()) if runs.exists() else set()
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=1800, check=False)  # fmt: skip
            print(f"  {' '.join(argv[3:5])}: exit {done.returncode}", flush=True)
            found += sorted(set(runs.iterdir()) - before)
    return found


def build_seconds(run_dir: Path, reps: int) -> tuple[float, Path]:
    times = []
    page = run_dir
    for _ in range(reps):
        t0 = time.perf_counter()
        page = write_report(run_dir)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), page


def chromium_seconds(page: Path, profile: Path, reps: int) -> tuple[float, float]:
    """Chromium's wall time and CPU time (all its processes) to load the page and print its
    DOM, medians of `reps`."""
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), common.children_cpu()
        subprocess.run([CHROMIUM, *QUIET, f"--user-data-dir={profile}", "--dump-dom",
                        page.as_uri()], capture_output=True, timeout=300, check=True)  # fmt: skip
        times.append(time.perf_counter() - t0)
        cpu.append(common.children_cpu() - c0)
    return statistics.median(times), statistics.median(cpu)


def screenshot(page: Path, target: Path, profile: Path) -> None:
    subprocess.run([CHROMIUM, *QUIET, f"--user-data-dir={profile}", f"--screenshot={target}",
                    "--window-size=1100,1500", "--hide-scrollbars", page.as_uri()],
                   capture_output=True, timeout=300, check=True)  # fmt: skip


def describe(run_dir: Path) -> str:
    record = RunDir(run_dir).load()
    return f"{len(record.hosts)} nodes, {len(record.ranks)} ranks, {record.state}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="128,1000", help="synthetic jobs of these sizes")
    parser.add_argument("--samples", type=int, default=None,
                        help="samples per rank (default: what the cap leaves)")  # fmt: skip
    parser.add_argument("--demo", action="store_true", help="also the sandbox demo's jobs")
    parser.add_argument("--run-dir", action="append", default=[], type=Path)
    parser.add_argument("--screenshot", type=Path, help="the demo's failed job's page, as PNG")
    parser.add_argument("--reps", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    info = common.machine()
    common.print_header("the job's page: size, build time, Chromium time", info)
    base = Path(tempfile.mkdtemp(prefix="orch-bench-report-"))
    profile = base / "chromium-profile"
    pages: list[tuple[str, Path]] = []
    demo: list[Path] = demo_jobs(base) if args.demo else []
    pages += [(f"sandbox demo: {describe(d)}", d) for d in demo]
    pages += [(f"{d.name}: {describe(d)}", d) for d in map(Path, args.run_dir)]
    for ranks in (int(r) for r in args.ranks.split(",") if r):
        path = synthetic(base, ranks, args.samples)
        pages.append((f"synthetic: {describe(path)}", path))
    empty = base / "empty.html"
    empty.write_text("<!DOCTYPE html><title>empty</title>")
    chromium_seconds(empty, profile, 1)  # the profile's first use is not counted
    empty_s, empty_cpu = chromium_seconds(empty, profile, args.reps)
    rows, results = [], []
    for label, run_dir in pages:
        build, page = build_seconds(run_dir, args.reps)
        shown, shown_cpu = chromium_seconds(page, profile, args.reps)
        size = page.stat().st_size
        rows.append([label, format_bytes(size), f"{build * 1000:.0f} ms",
                     f"{shown:.2f} s / {shown_cpu:.2f} s",
                     f"{empty_s:.2f} s / {empty_cpu:.2f} s"])  # fmt: skip
        results.append({"page": label, "run_dir": str(run_dir), "bytes": size, "build_s": build,
                        "chromium_s": shown, "chromium_cpu_s": shown_cpu,
                        "chromium_empty_s": empty_s,
                        "chromium_empty_cpu_s": empty_cpu})  # fmt: skip
    if args.screenshot:
        failed = [d for d in demo if RunDir(d).load().state == "failed"]
        if failed:
            screenshot(failed[-1] / "report.html", args.screenshot, profile)
            print(f"screenshot: {args.screenshot}")
    headers = ["page", "size", "build (median)", "Chromium --dump-dom, wall / CPU (median)",
               "an empty page, wall / CPU"]  # fmt: skip
    table = common.render_table(headers, rows)
    print(table)
    path = common.write_results("report", {
        "benchmark": "report", "date": common.now_utc(), "command": common.command_line(),
        "machine": info,
        "machine_line": common.machine_line(info), "reps": args.reps, "results": results,
        "table": table,
    })  # fmt: skip
    print(f"results: {path}; pages under {base}")


if __name__ == "__main__":
    main()
