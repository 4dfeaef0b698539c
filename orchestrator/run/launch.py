"""Executing a LaunchPlan: write its files, start it, watch every node, tear it down.

The job's output arrives through one pdsh stream (`node: <wire line>`), whichever
launcher runs it: pdsh started by orch (standard, torchrun), or pdsh started by
DeepSpeed's runner through orch's shim (pdsh launcher). Each node's agent sends
heartbeats and an `exit` message; the watcher here turns them into one verdict:

- every node exits 0: success;
- a node reports a non-zero exit: the first failing rank's node and exit code
  (the earliest failure seen within a short settle window) are the job's;
- a node goes silent (no heartbeat for `heartbeat_timeout` s) or its ssh
  connection breaks: that node failed;
- SIGINT / SIGTERM on the head (or `orch kill`): interrupted / killed.

Any failure tears the job down on every node through a separate channel: a
fresh pdsh running the agent's kill-by-job-id program, so it works even when the
job's own channel is wedged. The record in runs/<id>/ is updated at each step.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import OrchError
from orchestrator.logs.sink import LogRouter, LogView
from orchestrator.plan.launch_plan import PRIVATE, LaunchPlan, process_environment
from orchestrator.remote import agent
from orchestrator.run.pdsh import (
    StreamingProcess,
    ssh_exit_of,
    start_streaming,
)
from orchestrator.run.records import (
    FirstFailure,
    JobRecord,
    RunDir,
    finished,
    now_iso,
    process_start_time,
)
from orchestrator.run.teardown import KILL_MARKER, teardown_job
from orchestrator.specs.jobenv import is_secret

TAIL_LINES = 15


@dataclass(frozen=True)
class WatchSettings:
    heartbeat_timeout: float = 15.0  # a started node silent this long has stopped answering
    start_timeout: float = 120.0  # a node never heard from, once another node started
    grace: float = 5.0  # TERM -> KILL on each node
    settle: float = 1.0  # after the first failure, wait this long for an earlier one
    teardown_timeout: float = 20.0


@dataclass(frozen=True)
class LaunchResult:
    job_id: str
    run_dir: Path
    state: str
    exit_code: int
    node_exit_codes: dict[str, int | None]
    first_failure: FirstFailure | None
    teardown: dict[str, str]  # node -> what the kill program reported
    node_logs: dict[str, str]  # node -> "ok" or why its raw logs did not come back


# ----- writing the plan's files ----------------------------------------------------
def write_private_files(plan: LaunchPlan) -> None:
    """The job's private files on the head (its env file with real values, the pdsh shim),
    in a directory only this user can read, made new for the job (never reused)."""
    private = Path(plan.private_dir)
    files = [f for f in plan.files if f.where == PRIVATE]
    if not files:
        return
    try:
        private.mkdir(mode=0o700)
    except OSError as err:
        raise OrchError(
            f"cannot create the job's private directory {private}: {err}",
            "check that the temporary directory is writable (TMPDIR)",
        ) from err
    for planned in files:
        path = private / planned.name
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, planned.mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(planned.content)


def prepare_run(plan: LaunchPlan, run: RunDir) -> JobRecord:
    """Write the plan's files and a first job.json (state "starting")."""
    run.create()
    for planned in plan.files:
        if planned.run_dir:
            run.write_file(planned.name, planned.content)
    run.write_file("env.json", json.dumps(plan.redacted_env, indent=2, sort_keys=True) + "\n")
    record = JobRecord(
        id=plan.job_id,
        state="starting",
        launcher=plan.launcher,
        command=plan.command,
        hosts=plan.hosts,
        workdir=plan.workdir,
        started_at=now_iso(),
        head_pid=os.getpid(),
        head_start=process_start_time(os.getpid()),
        node_exit_codes={host: None for host in plan.hosts},
        recipe=plan.recipe,
        python=plan.python,
    )
    run.save(record)
    return record


# ----- watching --------------------------------------------------------------------
class _Tracker:
    """A LogView that remembers when each node was last heard from and its last lines."""

    def __init__(self, hosts: tuple[str, ...], forward: LogView | None) -> None:
        self.hosts = set(hosts)
        self.forward = forward
        self.last_seen: dict[str, float] = {}
        self.tails: dict[str, deque[str]] = {h: deque(maxlen=TAIL_LINES) for h in (*hosts, "")}
        self.ssh_exits: dict[str, int] = {}

    def _seen(self, node: str) -> None:
        if node in self.hosts:
            self.last_seen[node] = time.monotonic()

    def line(self, node: str, stream: str, data: bytes) -> None:
        text = data.decode("utf-8", "replace")
        if node.startswith("pdsh@"):
            lost = ssh_exit_of(text)
            if lost is not None and lost[0] in self.hosts:
                self.ssh_exits.setdefault(*lost)
            node = ""
        self._seen(node)
        self.tails.setdefault(node, deque(maxlen=TAIL_LINES)).append(text)
        if self.forward is not None:
            self.forward.line(node, stream, data)

    def frame(self, node: str, stream: str, data: bytes) -> None:
        self._seen(node)
        if self.forward is not None:
            self.forward.frame(node, stream, data)

    def control(self, node: str, kind: str, fields: dict) -> None:
        self._seen(node)
        if self.forward is not None:
            self.forward.control(node, kind, fields)


@dataclass(frozen=True)
class _Failure:
    node: str
    reason: str
    exit_code: int
    rank: int | None = None
    kind: str = "rank"  # rank | silent | lost | head | signal
    when: float = 0.0  # failed_at from the agent, or arrival time


class JobRunner:
    """Runs one prepared plan to its end. `interrupt()` may be called from a signal handler."""

    def __init__(
        self,
        plan: LaunchPlan,
        run: RunDir,
        record: JobRecord,
        *,
        settings: WatchSettings | None = None,
        view: LogView | None = None,
        keep_remote_logs: bool = False,
    ) -> None:
        self.plan = plan
        self.keep_remote_logs = keep_remote_logs
        self.run_dir = run
        self.record = record
        self.settings = settings or WatchSettings()
        self.tracker = _Tracker(plan.hosts, view)
        self.exits: dict[str, dict] = {}
        self.candidates: list[_Failure] = []
        self._first_candidate_at: float | None = None
        self.failure: _Failure | None = None
        self.signal: int | None = None
        self.teardown: dict[str, str] = {}
        self._teardown_thread: threading.Thread | None = None
        self._teardown_done = threading.Event()

    def interrupt(self, signum: int) -> None:
        self.signal = signum

    # -- starting ----------------------------------------------------------------
    def _start(self) -> StreamingProcess:
        """Write the plan's private files, then start what the plan says the head runs."""
        write_private_files(self.plan)
        head = self.plan.fanout
        return start_streaming(
            head.argv, env=process_environment(head, os.environ), cwd=head.cwd
        )

    # -- the watch loop ----------------------------------------------------------
    def run(self) -> LaunchResult:
        self.record = replace(self.record, state="running")
        self.run_dir.save(self.record)
        try:
            process = self._start()
        except BaseException:
            self._cleanup_private()
            raise
        chunks: queue.Queue[bytes | None] = queue.Queue()
        reader = threading.Thread(target=_read_into, args=(process.stdout, chunks), daemon=True)
        reader.start()
        router = LogRouter(self.run_dir.logs, view=self.tracker, nodes=self.plan.hosts)
        # The head launcher inherits this process's environment, and accelerate hands all
        # of it to DeepSpeed, whose runner logs it: mask the head's secrets as well.
        redactor = _Redactor({**os.environ, **dict(self.plan.env)})
        started = time.monotonic()
        eof = False
        stop_at: float | None = None
        try:
            while True:
                try:
                    chunk = chunks.get(timeout=0.25)
                except queue.Empty:
                    chunk = b""
                if chunk is None:
                    eof = True
                elif chunk:
                    for node, rec in router.feed_lines(redactor.lines(chunk)):
                        self._on_control(node, rec.text, rec.fields)
                self._check(started, eof, process.poll())
                if self.failure is not None and self._teardown_thread is None:
                    self._begin_teardown()
                if eof and process.poll() is not None:
                    break
                if self._teardown_done.is_set():
                    # Drain what the nodes say as they stop, then end the fan-out.
                    stop_at = stop_at or time.monotonic() + 3.0
                    if time.monotonic() > stop_at:
                        break
                if self._all_exited() and self.failure is None:
                    # Every node is done: give the head launcher time to wind down.
                    stop_at = stop_at or time.monotonic() + 60.0
                    if time.monotonic() > stop_at:
                        break
        finally:
            ended_by_itself = process.poll() is not None
            head_code = process.stop(grace=3.0)
            if not ended_by_itself and self.failure is None and self._all_exited():
                head_code = 0  # stopped by us after every node succeeded
            reader.join(2.0)
            with contextlib.suppress(queue.Empty):
                while (chunk := chunks.get_nowait()) is not None:
                    for node, rec in router.feed_lines(redactor.lines(chunk)):
                        self._on_control(node, rec.text, rec.fields)
            router.feed_lines(redactor.rest())
            router.close()
            if self._teardown_thread is not None:
                self._teardown_thread.join(self.settings.teardown_timeout + 10)
            self._cleanup_private()
        return self._conclude(head_code, self._collect())

    def _collect(self) -> dict[str, str]:
        """Pull each node's raw logs back, whatever way the job ended."""
        from orchestrator.run.collect import collect_logs

        # A node the teardown could not reach just now would only cost another timeout.
        unreachable = {
            n
            for n, said in self.teardown.items()
            if said == "unreachable" or said.startswith("no answer")
        }
        reachable = [h for h in self.plan.hosts if h not in unreachable]
        report = collect_logs(
            reachable, self.plan.job_id, self.run_dir.node_logs,
            keep_remote=self.keep_remote_logs, connect_timeout=5.0, timeout=60.0,
        )  # fmt: skip
        outcome = {
            n.node: "ok" if n.ok else f"{n.problem} ({n.hint})" if n.hint else str(n.problem)
            for n in report.nodes
        }
        for node in unreachable:
            where = agent.node_dir(self.plan.job_id, node)
            outcome[node] = (
                f"{node}: not tried, the teardown could not reach it ({self.teardown[node]}) "
                f"(its logs stay on the node in {where}; fetch them by hand: "
                f"scp -r {node}:{where} .)"
            )
        return {h: outcome[h] for h in self.plan.hosts}

    def _on_control(self, node: str, kind: str, fields: dict) -> None:
        if kind != "exit" or node not in self.tracker.hosts or node in self.exits:
            return
        self.exits[node] = fields
        code = int(fields.get("code", 1))
        if code == 0 or self.failure is not None:
            return
        rank_code = fields.get("rank_code")
        exit_code = int(rank_code) if isinstance(rank_code, int) and rank_code != 0 else code
        reason = str(fields.get("error") or f"exited with code {exit_code}")
        rank = fields.get("rank")
        if self._first_candidate_at is None:
            self._first_candidate_at = time.monotonic()
        self.candidates.append(
            _Failure(
                node=node,
                reason=reason,
                exit_code=exit_code,
                rank=rank if isinstance(rank, int) else None,
                when=float(fields.get("failed_at") or time.time()),
            )
        )

    def _check(self, started: float, eof: bool, head_code: int | None) -> None:
        if self.failure is not None:
            return
        now = time.monotonic()
        if self.signal is not None:
            killed = (self.run_dir.path / KILL_MARKER).exists()
            name = signal.Signals(self.signal).name
            self.failure = _Failure(
                node="",
                reason="killed by `orch kill`" if killed else f"interrupted by {name}",
                exit_code=128 + self.signal,
                kind="killed" if killed else "signal",
            )
            return
        if self.candidates and self._first_candidate_at is not None:
            if now - self._first_candidate_at >= self.settings.settle or eof:
                self.failure = min(self.candidates, key=lambda c: c.when)
            return
        silent = self._silent_node(now, started)
        if silent is not None:
            self.failure = silent
            return
        for node, code in self.tracker.ssh_exits.items():
            if node not in self.exits:
                if code == 255:
                    reason, exit_code = "lost its ssh connection (ssh exit 255)", 1
                else:
                    # The agent never ran (e.g. no such interpreter): the shell's code.
                    reason, exit_code = f"the remote command failed with exit code {code}", code
                self.failure = _Failure(node, reason, exit_code, kind="lost")
                return
        if eof and head_code is not None and not self._all_exited():
            missing = [h for h in self.plan.hosts if h not in self.exits]
            if self.tracker.last_seen or not self.plan.head_command:
                node = missing[0]
                self.failure = _Failure(
                    node, "ended without reporting an exit code", 1, kind="lost"
                )
            else:
                self.failure = _Failure(
                    "", f"the head launcher exited with code {head_code}", head_code or 1,
                    kind="head",
                )  # fmt: skip

    def _silent_node(self, now: float, started: float) -> _Failure | None:
        seen = self.tracker.last_seen
        timeout = self.settings.heartbeat_timeout
        for node in self.plan.hosts:
            if node in self.exits:
                continue
            last = seen.get(node)
            if last is not None and now - last > timeout:
                return _Failure(
                    node, f"stopped answering (no heartbeat for {now - last:.0f} s)", 1,
                    kind="silent",
                )  # fmt: skip
        if seen:
            first = min(seen.values())
            for node in self.plan.hosts:
                if node not in seen and now - first > self.settings.start_timeout:
                    return _Failure(node, "never started", 1, kind="silent")
        return None

    def _all_exited(self) -> bool:
        return all(h in self.exits for h in self.plan.hosts)

    # -- teardown ------------------------------------------------------------------
    def _begin_teardown(self) -> None:
        self.record = replace(self.record, state="stopping")
        self.run_dir.save(self.record)

        def work() -> None:
            try:
                self.teardown = teardown_job(
                    self.plan.hosts,
                    self.plan.job_id,
                    self.plan.python,
                    grace=self.settings.grace,
                    timeout=self.settings.teardown_timeout,
                )
            finally:
                self._teardown_done.set()

        self._teardown_thread = threading.Thread(target=work, daemon=True)
        self._teardown_thread.start()

    def _cleanup_private(self) -> None:
        shutil.rmtree(self.plan.private_dir, ignore_errors=True)

    # -- the verdict -----------------------------------------------------------------
    def _conclude(self, head_code: int, node_logs: dict[str, str]) -> LaunchResult:
        node_codes: dict[str, int | None] = {
            h: (int(self.exits[h]["code"]) if h in self.exits else None) for h in self.plan.hosts
        }
        failure = self.failure
        if failure is None and self.plan.head_command and head_code not in (0, None):
            # Every node said 0 but the head launcher failed: still a failure.
            failure = _Failure("", f"the head launcher exited with code {head_code}", head_code,
                               kind="head")  # fmt: skip
        if failure is None:
            state, code, first = "succeeded", 0, None
        else:
            state = {"signal": "interrupted", "killed": "killed"}.get(failure.kind, "failed")
            code = failure.exit_code
            first = FirstFailure(
                node=failure.node or "head",
                rank=failure.rank,
                exit_code=failure.exit_code,
                reason=failure.reason,
                last_lines=tuple(self.tracker.tails.get(failure.node, ())),
            )
        self.record = finished(
            self.record,
            state=state,
            exit_code=code,
            node_exit_codes=node_codes,
            first_failure=first,
            node_logs=node_logs,
        )
        self.run_dir.save(self.record)
        return LaunchResult(
            job_id=self.plan.job_id,
            run_dir=self.run_dir.path,
            state=state,
            exit_code=code,
            node_exit_codes=node_codes,
            first_failure=first,
            teardown=self.teardown,
            node_logs=node_logs,
        )


class _Redactor:
    """Splits output into lines and masks secret values (DeepSpeed logs its export line)."""

    def __init__(self, env: dict[str, str]) -> None:
        values = {v for k, v in env.items() if is_secret(k) and len(v) >= 4}
        self.secrets = sorted((v.encode() for v in values), key=len, reverse=True)
        self._rest = b""

    def lines(self, chunk: bytes) -> list[bytes]:
        data = self._rest + chunk
        lines = data.split(b"\n")
        self._rest = lines.pop()
        return [self._mask(line) for line in lines] if self.secrets else lines

    def rest(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [self._mask(rest)] if rest else []

    def _mask(self, line: bytes) -> bytes:
        for secret in self.secrets:
            if secret in line:
                line = line.replace(secret, b"***")
        return line


def _read_into(stream, chunks: queue.Queue[bytes | None]) -> None:
    fd = stream.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.put(data)
    except OSError:
        pass
    finally:
        chunks.put(None)
