"""Shared helpers for the benchmarks: private sandboxes, alternating repetitions,
median and spread, head CPU, tables and JSON results.

The pure helpers (summaries, ratios, tables, the alternation order) take and
return plain values; only the runners below them start processes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.sandbox.cluster import Sandbox  # noqa: E402
from orchestrator.sandbox.state import SandboxState  # noqa: E402

VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python") if (VENV_BIN / "python").exists() else sys.executable
ORCH = str(VENV_BIN / "orch")
RESULTS_DIR = ROOT / "bench" / "results"
JOB_SCRIPT = ROOT / "bench" / "jobs" / "cpu_smoke.py"


# ----- pure helpers ------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """One run of one method: wall seconds, head CPU seconds, whether it did its job."""

    wall: float
    cpu: float
    ok: bool
    note: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Summary:
    median: float
    low: float
    high: float
    count: int

    @property
    def spread(self) -> float:
        """(max - min) / median: how far apart the repetitions landed."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def text(self, digits: int = 1) -> str:
        if self.count == 0:
            return "n/a"
        if self.count == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        return Summary(median=float("nan"), low=float("nan"), high=float("nan"), count=0)
    return Summary(
        median=statistics.median(values), low=min(values), high=max(values), count=len(values)
    )


def ratio(numerator: float, denominator: float) -> float | None:
    if denominator <= 0 or numerator != numerator or denominator != denominator:
        return None
    return numerator / denominator


def ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def alternation(methods: Sequence[str], reps: int) -> list[tuple[int, str]]:
    """(repetition, method) in the order to run them: every method once per repetition,
    the starting method rotating so no method always runs first (warm caches, load)."""
    order: list[tuple[int, str]] = []
    count = len(methods)
    for rep in range(reps):
        shift = rep % count if count else 0
        order.extend((rep, methods[(shift + i) % count]) for i in range(count))
    return order


def run_alternating(
    methods: Sequence[str],
    reps: int,
    budget: Budget,
    run: Callable[[str], Sample],
    label: str = "",
) -> dict[str, list[Sample]]:
    """Run every method `reps` times in `alternation` order until the budget runs out,
    printing one progress line per run."""
    samples: dict[str, list[Sample]] = {m: [] for m in methods}
    for rep, method in alternation(methods, reps):
        if budget.expired():
            print(f"  time cap reached: stopping at rep {rep + 1}", file=sys.stderr)
            break
        sample = run(method)
        samples[method].append(sample)
        print(
            f"  {label}rep {rep + 1} {method:12s} {sample.wall:7.1f} s wall "
            f"{sample.cpu:6.1f} s head CPU  {sample.note}",
            flush=True,
        )
    return samples


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; every cell turned into text, pipes escaped."""

    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, table has {len(headers)} columns")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


class Budget:
    """A total time cap for a benchmark run."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.deadline = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self.deadline - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


# ----- machine and provenance ---------------------------------------------------------
def _package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def machine() -> dict[str, object]:
    mem_kib = 0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    pdsh = subprocess.run(["pdsh", "-V"], capture_output=True, text=True, check=False)
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_gib": round(mem_kib / 2**20, 1),
        "load_avg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "deepspeed": _package_version("deepspeed"),
        "accelerate": _package_version("accelerate"),
        "pdsh": (pdsh.stdout or pdsh.stderr).splitlines()[0] if pdsh.returncode == 0 else "?",
    }


def machine_line(info: Mapping[str, object]) -> str:
    return (
        f"{info['cpus']} cores ({info['cpu_model'] or 'unknown CPU'}), {info['mem_gib']} GiB, "
        f"Linux {info['kernel']}, Python {info['python']}, torch {info['torch']}, "
        f"deepspeed {info['deepspeed']}, accelerate {info['accelerate']}, {info['pdsh']}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in info['load_avg_at_start'])}"  # type: ignore[union-attr]
    )


def command_line() -> str:
    """The exact command that produced this run, relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    return shlex.join([".venv/bin/python", str(script), *sys.argv[1:]])


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_results(name: str, payload: Mapping[str, object]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value: object) -> object:
    if isinstance(value, Sample | Summary):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ----- sandboxes ------------------------------------------------------------------------
@contextlib.contextmanager
def private_sandbox(
    nodes: int, slots: int = 2, tag: str = "bench", slurm: bool = False
) -> Iterator[SandboxState]:
    """A sandbox of its own (directory, subnet, node names), always taken down after."""
    unique = uuid.uuid4().hex[:5]
    directory = Path(tempfile.mkdtemp(prefix=f"orch-{tag}-{unique}-"))
    box = Sandbox(directory)
    try:
        yield box.up(nodes=nodes, slots=slots, prefix=f"{tag[:2]}{unique}n", slurm=slurm)
    finally:
        box.down()
        shutil.rmtree(directory, ignore_errors=True)


def sandbox_of(state: SandboxState) -> Sandbox:
    return Sandbox(Path(state.directory))


# ----- running things -------------------------------------------------------------------
def children_cpu() -> float:
    """CPU seconds of every child this process has waited for (and their waited children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def head_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a user of the venv has: its bin directory first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class Finished:
    code: int | None  # None: killed at the time cap
    wall: float
    cpu: float
    output: str


def run_timed(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    log: Path | None = None,
) -> Finished:
    """Run a command to its end (or kill its whole session at `timeout`), with its wall
    time and the head CPU it and its descendants used."""
    with log.open("w+b") if log else tempfile.TemporaryFile() as out:
        cpu0, t0 = children_cpu(), time.perf_counter()
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_session(proc)
            code = None
        wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
        out.seek(0)
        text = out.read().decode(errors="replace")
    return Finished(code=code, wall=wall, cpu=cpu, output=text)


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL a process started with start_new_session=True and its whole session."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# ----- finding a run's processes on the sandbox nodes -----------------------------------
def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def processes_with_token(token: str) -> dict[int, str]:
    """pid -> sandbox node name of every process whose command line holds `token`.

    The benchmark passes a unique token in each job's arguments, so this finds the
    job's launchers, shells and ranks on every node (the head sees every node's PID
    namespace). Processes not started through a node's sshd map to "head"."""
    needle = token.encode()
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        cmdline = _read(f"/proc/{entry}/cmdline")
        if needle not in cmdline:
            continue
        stat = _read(f"/proc/{entry}/stat")
        if stat and stat.rsplit(b")", 1)[-1].split()[:1] == [b"Z"]:
            continue  # a zombie is gone for our purposes
        node = "head"
        for item in _read(f"/proc/{entry}/environ").split(b"\0"):
            if item.startswith(b"ORCH_SANDBOX_NODE="):
                node = item.split(b"=", 1)[1].decode(errors="replace")
        found[int(entry)] = node
    return found


def kill_token(token: str) -> int:
    """SIGKILL (and SIGCONT, in case the node is frozen) every process of a run."""
    victims = processes_with_token(token)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    return len(victims)


def prepare_workdir(base: Path, name: str) -> Path:
    """A clean per-method working directory (accelerate appends to ./.deepspeed_env)."""
    workdir = base / name
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (workdir / ".deepspeed_env").unlink()
    return workdir


def accelerate_pdsh_config(
    state: SandboxState, *, processes_per_node: int, port: int, hostfile: str | None = None
) -> str:
    """The accelerate YAML a user writes by hand for the pdsh launcher (seed recipe)."""
    count = len(state.nodes)
    return f"""compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  deepspeed_hostfile: {hostfile or state.hostfile}
  deepspeed_multinode_launcher: pdsh
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 2
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_process_ip: {state.nodes[0].address}
main_process_port: {port}
main_training_function: main
mixed_precision: 'no'
num_machines: {count}
num_processes: {count * processes_per_node}
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


def launcher_argv(
    method: str,
    state: SandboxState,
    *,
    job: Sequence[str],
    workdir: Path,
    port: int,
    runs_dir: Path,
    processes_per_node: int,
    hostfile: str | None = None,
    orch_options: Sequence[str] = (),
) -> list[str]:
    """One launch of `job` (script and arguments) by one method, on the sandbox (with
    its own hostfile, or `hostfile` naming the same nodes with other slots).

    accelerate: `accelerate launch` with a hand-written pdsh config (the seed recipe);
    deepspeed: `deepspeed --hostfile`; orch: `orch launch --no-doctor`;
    orch+doctor: `orch launch` with its pre-flight.
    """
    hosts = hostfile or state.hostfile
    if method == "accelerate":
        config = workdir / "accelerate_pdsh.yaml"
        config.write_text(
            accelerate_pdsh_config(
                state, processes_per_node=processes_per_node, port=port, hostfile=hosts
            )
        )
        return [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(config), *job]
    if method == "deepspeed":
        return [
            str(VENV_BIN / "deepspeed"), "--hostfile", hosts,
            "--master_addr", state.nodes[0].address, "--master_port", str(port), *job,
        ]  # fmt: skip
    if method in ("orch", "orch+doctor"):
        doctor = ["--no-doctor"] if method == "orch" else []
        return [
            ORCH, "launch", "--hostfile", hosts, "--main-port", str(port),
            "--runs-dir", str(runs_dir), *doctor, *orch_options, "--", *job,
        ]  # fmt: skip
    raise ValueError(f"unknown method {method}")


def orch_launch_available() -> bool:
    """Whether `orch launch` exists in this checkout (it is benchmarked only then)."""
    if not Path(ORCH).exists():
        return False
    done = subprocess.run(
        [ORCH, "launch", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode == 0 and "--hostfile" in done.stdout


def print_header(title: str, info: Mapping[str, object]) -> None:
    print(f"# {title}")
    print(f"machine: {machine_line(info)}")
    print(f"command: {command_line()}")
    print(f"date: {now_utc()}")


BENCH_TORCH_EXTENSIONS = Path.home() / ".cache" / "orch-bench-torch-extensions"


def warm_up_job_ops(timeout: float = 900.0) -> float:
    """Build (or load) DeepSpeed's CPU shm op the way the job will, before timing anything.

    bench/jobs/cpu_smoke.py uses the venv's ninja and this build directory, so every
    launcher's ranks find the op up to date; the first build ever takes minutes."""
    env = head_env({"TORCH_EXTENSIONS_DIR": str(BENCH_TORCH_EXTENSIONS)})
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    t0 = time.perf_counter()
    subprocess.run(
        [PYTHON, "-c", code], env=env, cwd=tempfile.gettempdir(), capture_output=True,
        timeout=timeout, check=True,
    )  # fmt: skip
    return time.perf_counter() - t0


def exit_cleanly_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so `private_sandbox` takes its sandbox down."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def log_stamps(log_dir: Path) -> list[tuple[float, str]]:
    """Every line of a job's head-side logs: (its arrival time, its text), oldest first."""
    lines = []
    for path in log_dir.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            stamp, _, text = line.partition(" ")
            with contextlib.suppress(ValueError):
                when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                lines.append((when, text))
    return sorted(lines)


def kill_node(state: SandboxState, name: str) -> None:
    """A sandbox node dies for good: every process of it, its sshd among them."""
    for pid in sandbox_of(state).node_pids(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
