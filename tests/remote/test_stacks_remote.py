"""The node side of `orch stacks` (remote/stacks.py), run here the way a node runs it:
`sh -c <stacks_command>` against real processes that carry a job's environment."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.plan.agent_command import stacks_command
from orchestrator.remote import program_source
from orchestrator.remote.agent_spec import node_dir, runs_root
from orchestrator.remote.procs import job_ranks
from orchestrator.remote.rank import SITE_DIR, use_site
from orchestrator.remote.stacks import GONE, OTHER, PTRACE, _failure
from orchestrator.stacks.model import (
    NO_HANDLER,
    NO_PY_SPY,
    NO_RANKS,
    NodeReport,
    parse_node_report,
)

RANK_PROGRAM = textwrap.dedent("""\
    import os, subprocess, sys, time

    def wait_here():
        time.sleep(120)

    if os.environ.get("CHILD") != "1":
        # A rank's own child (a data loader worker) inherits RANK: it is not a rank.
        subprocess.Popen([sys.executable, __file__], env={**os.environ, "CHILD": "1"})
    print("ready", flush=True)
    wait_here()
""")


def _start(program: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(program)], env={**os.environ, **env}, stdout=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _with_handler(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """The environment orch-rank gives a rank: the agent's sitecustomize first on PYTHONPATH."""
    directory = node_dir(job_id, env["ORCH_NODE"], os.getuid())
    site = Path(directory) / SITE_DIR
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(program_source("rank_site"))
    with_site = {**env, "ORCH_NODE_DIR": directory}
    use_site(str(site), with_site)
    return with_site


@pytest.fixture(params=["plain", "handler"])
def job(request, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A job on node n1: a rank 3 (with a child), its launcher (no RANK), and a rank 4
    started for another node on the same machine, as sandbox nodes may share /proc. With
    "handler", rank 3 is started as orch-rank starts it (its stack on SIGUSR2)."""
    job_id = f"test-{uuid.uuid4().hex[:8]}"
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    base = {"ORCH_JOB_ID": job_id, "ORCH_NODE": "n1", "CHILD": "1"}
    rank3 = {**base, "RANK": "3", "CHILD": "0"}
    if request.param == "handler":
        rank3 = _with_handler(job_id, rank3)
    procs = []
    try:
        procs.append(_start(program, rank3))
        procs.append(_start(program, base))  # the launcher: the job's, but no RANK
        procs.append(_start(program, {**base, "RANK": "4", "ORCH_NODE": "n2"}))
        yield job_id, procs[0]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
        shutil.rmtree(f"{runs_root(os.getuid())}/{job_id}", ignore_errors=True)


def _node_says(
    job_id: str, node: str, python: str, seconds: float = 0, env=None, method: str = "auto"
) -> NodeReport:
    command = stacks_command(python, job_id, node, seconds=seconds, rate=50, method=method)
    result = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=60, check=False,
        env=env or dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return parse_node_report(node, result.stdout, python, job_id)


@pytest.mark.process
def test_only_the_nodes_rank_processes_are_ranks(job) -> None:
    job_id, rank = job
    assert job_ranks(job_id, "n1") == [(3, rank.pid)]


@pytest.mark.process
def test_the_shipped_program_dumps_every_thread_of_the_rank(job) -> None:
    job_id, rank = job
    report = _node_says(job_id, "n1", sys.executable)
    assert report.ok, report
    [only] = report.ranks
    assert (only.rank, only.pid) == (3, rank.pid)
    main = next(thread for thread in only.threads if thread.main)
    assert main.frames[0].function in ("wait_here", "<module>")
    assert any(frame.function == "wait_here" and frame.is_user for frame in main.frames)


@pytest.mark.process
def test_the_shipped_program_samples_a_rank_for_a_profile(job) -> None:
    job_id, _rank = job
    report = _node_says(job_id, "n1", sys.executable, seconds=1)
    [only] = report.ranks
    assert only.ok and only.samples, only
    assert sum(sample.count for sample in only.samples if sample.main) > 0


# Neither beside the (missing) job interpreter, nor beside python3, nor on PATH.
NO_PY_SPY_ENV = {"PATH": "/usr/bin:/bin"}
NOWHERE = "/nonexistent/venv/bin/python"


@pytest.mark.process
def test_a_node_without_py_spy_says_so_with_the_fix(job) -> None:
    job_id, _rank = job
    env = {**os.environ, **NO_PY_SPY_ENV}
    report = _node_says(job_id, "n1", NOWHERE, env=env, method="py-spy")
    assert report.kind == NO_PY_SPY
    assert "py-spy not found beside /nonexistent/venv/bin/python" in report.error
    assert "-m pip install py-spy" in report.hint
    assert [r.rank for r in report.ranks] == [3]


@pytest.mark.process
@pytest.mark.parametrize("job", ["handler"], indirect=True)
@pytest.mark.parametrize("method", ["faulthandler", "auto"])
def test_without_ptrace_the_rank_dumps_its_own_stack_and_runs_on(job, method: str) -> None:
    job_id, rank = job
    env = {**os.environ, **NO_PY_SPY_ENV}
    report = _node_says(job_id, "n1", NOWHERE, env=env, method=method)
    assert report.ok, report
    [only] = report.ranks
    assert (only.rank, only.pid) == (3, rank.pid)
    main = next(thread for thread in only.threads if thread.main)
    functions = [frame.function for frame in main.frames]
    assert functions[:2] == ["wait_here", "<module>"], functions
    assert main.frames[0].is_user and main.frames[0].file.endswith("rank.py")
    again = _node_says(job_id, "n1", NOWHERE, env=env, method=method)
    assert again.ok and again.ranks[0].threads == only.threads  # only the new dump is read
    assert rank.poll() is None, "the rank did not survive its stack being taken"


@pytest.mark.process
@pytest.mark.parametrize("job", ["handler"], indirect=True)
def test_without_ptrace_a_profile_samples_the_rank_by_signal(job) -> None:
    job_id, rank = job
    env = {**os.environ, **NO_PY_SPY_ENV}
    report = _node_says(job_id, "n1", NOWHERE, seconds=1, env=env, method="faulthandler")
    [only] = report.ranks
    assert only.ok and only.samples, only
    [main] = [sample for sample in only.samples if sample.main]
    assert main.count >= 5 and main.frames[0].function == "wait_here"
    assert rank.poll() is None


@pytest.mark.process
@pytest.mark.parametrize("job", ["plain"], indirect=True)
def test_a_rank_without_the_handler_is_named_and_never_signalled(job) -> None:
    job_id, rank = job
    env = {**os.environ, **NO_PY_SPY_ENV}
    report = _node_says(job_id, "n1", NOWHERE, env=env)
    [only] = report.ranks
    assert only.kind == NO_HANDLER and "python -E, -I or -S" in (only.error or "")
    assert "pip install py-spy" in (only.hint or "")
    assert rank.poll() is None, "an unhandled SIGUSR2 would have ended the rank"


@pytest.mark.process
def test_a_node_without_ranks_of_the_job_says_so() -> None:
    report = _node_says(f"absent-{uuid.uuid4().hex[:8]}", "n1", sys.executable)
    assert report.kind == NO_RANKS and report.ranks == ()


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("Permission Denied: Try running again with elevated permissions by going 'sudo'",
         PTRACE),
        ("Error: Operation not permitted (os error 1)", PTRACE),
        ("Error: Failed to get process executable name. Check that the process is running.\n"
         "\nCaused by:\n    No such file or directory (os error 2)", GONE),
        ("Error: Failed to find python version from target process\n\nStack backtrace:", OTHER),
    ],
)  # fmt: skip
def test_py_spy_failures_are_told_apart(stderr: str, kind: str) -> None:
    failure = _failure(stderr, 1)
    assert failure["kind"] == kind
    assert "\n" not in failure["error"] and "backtrace" not in failure["error"].lower()



def test_the_head_knows_every_kind_the_node_program_reports() -> None:
    # remote/stacks.py is shipped alone, so it keeps its own copy of the kinds.
    from orchestrator.remote import stacks as remote
    from orchestrator.stacks import model

    for name in ("NO_PY_SPY", "PTRACE", "GONE", "NO_RANKS", "TIMEOUT", "OTHER", "NO_HANDLER"):
        assert getattr(remote, name) == getattr(model, name)


def test_the_shipped_rank_programs_agree_on_their_names() -> None:
    # orch-rank and the ranks' sitecustomize each run alone (no orch to import from).
    from orchestrator.remote import agent, procs, rank, rank_site, rank_streams

    assert rank.SITE_DIR_VAR == rank_site.SITE_DIR_VAR
    assert rank.NODE_DIR_VAR == rank_site.NODE_DIR_VAR == agent.NODE_DIR_VAR == procs.NODE_DIR_VAR
    assert rank.SOCKET_PATH_MAX == rank_streams.SOCKET_PATH_MAX
