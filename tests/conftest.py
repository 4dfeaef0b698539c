"""Shared fixtures: a home of the tests' own, a real loopback SSH cluster for integration
tests, and the tiers.

Every test runs with HOME (and the XDG directories) in a temporary home of its session
(each xdist worker has its own), so no test reads or edits the developer's own files, its
~/.ssh/config above all (a sandbox adds an `Include` there). OpenSSH's client reads the
home of the passwd entry, not $HOME: the temporary home's bin/ holds an `ssh` that reads
$HOME/.ssh/config, first on PATH, for pdsh and for the tests' own ssh. Programs the tests
start inherit all of it.

Each test module gets its own sandboxes (own state directory, subnet and node name
prefix), so it never touches a sandbox the user has up, parallel runs on one machine do
not collide, and every sandbox is taken down when its module ends.

The tiers: a test is `fast` (pure and in-process: `pytest -m fast`) unless it needs the
sandbox (its fixtures, or the `sandbox` mark) or starts processes (the `process` mark), or
is `slow`. A fast test that starts any child process fails, naming it.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import shutil
import subprocess
import tempfile
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _home import TestHome, developers_ssh_config, fingerprint, make_test_home
from hypothesis import settings
from launch_support import REPO

from orchestrator.remote.agent_spec import runs_root
from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.state import SandboxState

# Property tests check values, not speed: on a shared 2-core machine a slow example is no
# failure (hypothesis's default 200 ms deadline made them flaky under load).
settings.register_profile("orch", deadline=None)
settings.load_profile("orch")


def _sandbox_prereqs_missing() -> str | None:
    for tool in ("sshd", "ssh", "pdsh", "ssh-keygen"):
        if not shutil.which(tool) and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            return tool
    return None


SANDBOX_FIXTURES = frozenset({"sandbox", "sandbox_factory", "hostfile"})
NOT_FAST = ("sandbox", "process", "slow")

_HOME = pytest.StashKey[TestHome]()
_DEVELOPERS_SSH_CONFIG = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    """The session's home, before anything is collected (modules may look at ~ on import)."""
    # pytest-xdist 3.7+ hands modules out by their number of tests, most first, unless told
    # not to: the long sandbox modules, of a few tests each, would start last and the run
    # end on one worker. The order is ours (_longest_modules_first).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    config.stash[_DEVELOPERS_SSH_CONFIG] = fingerprint(developers_ssh_config())
    home = make_test_home(os.environ.get("PATH", os.defpath))
    config.stash[_HOME] = home
    os.environ.update(home.environ)
    for name in home.cleared:
        os.environ.pop(name, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home.path, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The developer's ~/.ssh/config is as it was: a test that wrote this session's paths
    into it (a sandbox's Include) fails the run. Someone else may change it meanwhile (the
    developer's own `orch sandbox up`): that is only said."""
    config = session.config
    path = developers_ssh_config()
    if config.stash.get(_DEVELOPERS_SSH_CONFIG, None) == fingerprint(path):
        return
    ours = [str(config.stash[_HOME].path), str(config._tmp_path_factory.getbasetemp())]
    text = path.read_text(errors="replace") if path.exists() else ""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if any(mark in text for mark in ours):
        if reporter is not None:
            reporter.write_line(f"ERROR: a test wrote this session's paths into {path}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif reporter is not None:
        reporter.write_line(f"warning: {path} changed while the tests ran (not by them)")


@pytest.fixture(autouse=True)
def _in_the_test_home(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts in the session's home, whatever a test before it left behind."""
    home = request.config.stash[_HOME]
    for name, value in home.environ.items():
        monkeypatch.setenv(name, value)
    for name in home.cleared:
        monkeypatch.delenv(name, raising=False)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config,
                                  items: list[pytest.Item]) -> Iterator[None]:  # fmt: skip
    """Mark the tiers before anything selects by mark; order the modules after pytest's own
    reordering by fixture."""
    for item in items:
        if SANDBOX_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.sandbox)
        if not any(item.get_closest_marker(name) for name in NOT_FAST):
            item.add_marker(pytest.mark.fast)
    yield
    items[:] = _longest_modules_first(items)


# What a test of each tier costs, roughly, in seconds: the order modules start in.
_TIER_COST = {"slow": 60.0, "sandbox": 8.0, "process": 1.0, "fast": 0.05}
# The modules that took longest in a parallel run of the whole suite (seconds, rounded):
# measured, since a module's few tests may each run a job for minutes. Only an order.
_MEASURED = {
    "tests/stacks/test_quiet_work_sandbox.py": 700,
    "tests/stacks/test_learned_hang_sandbox.py": 200,
    "tests/run/test_requeue_slurm_sandbox.py": 420, "tests/run/test_stop_sandbox.py": 310,
    "tests/checkpoint_copies/test_checkpoints_follow_sandbox.py": 290,
    "tests/run/test_slurm_sandbox.py": 270, "tests/stacks/test_stacks_sandbox.py": 250,
    "tests/run/test_ordinary_users_sandbox.py": 240, "tests/run/test_recovery_sandbox.py": 200,
    "tests/run/test_stop_slurm_sandbox.py": 180, "tests/run/test_launch_torchrun.py": 170,
    "tests/prepare/test_push_env_sandbox.py": 150, "tests/report/test_report_sandbox.py": 140,
    "tests/cli/test_doctor_sandbox.py": 110, "tests/run/test_first_failure_sandbox.py": 90,
    "tests/run/test_slurm_nossh_sandbox.py": 80, "tests/run/test_launch_pdsh.py": 70,
    "tests/run/test_shared_kernel_sandbox.py": 60, "tests/remote/test_rank_capture_sandbox.py": 60,
    "tests/run/test_concurrent_sandbox.py": 50, "tests/envpush/test_push_refusals_sandbox.py": 45,
    "tests/logs/test_logs_pipeline.py": 45, "tests/run/test_head_load_sandbox.py": 40,
    "tests/envpush/test_relay_sandbox.py": 40, "tests/run/test_hardened_sandbox.py": 40,
}  # fmt: skip


def _longest_modules_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The modules that take longest first, each module's tests together and in order: with
    xdist (--dist loadfile) the long ones start at once instead of last on one worker."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    cost: dict[str, float] = {}
    for item in items:
        tier = next(t for t in _TIER_COST if item.get_closest_marker(t) is not None)
        cost[module(item)] = cost.get(module(item), 0.0) + _TIER_COST[tier]
    cost.update((name, seconds) for name, seconds in _MEASURED.items() if name in cost)
    return sorted(items, key=lambda item: -cost[module(item)])  # stable: in order within


def _program(args: object) -> str:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or ())  # type: ignore[call-overload]
    if not argv:
        return "?"
    first = os.fsdecode(argv[0]).split()
    return os.path.basename(first[0]) if first else "?"


@pytest.fixture(autouse=True)
def _fast_tests_stay_in_process(request: pytest.FixtureRequest, monkeypatch) -> Iterator[None]:
    """A test the tiers call fast may not start a child process of any kind (subprocess,
    fork, spawn, multiprocessing): it fails, naming what it started; mark it `process`.
    Noted as well as raised, so that code which swallows the error does not hide it."""
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    started: list[str] = []

    def refuse(what: str) -> None:
        # Where: the last few frames before this guard, as a traceback would show them.
        where = "".join(traceback.format_list(traceback.extract_stack()[-7:-2]))
        started.append(f"{what}, from\n{where}")
        pytest.fail(f"a fast test started a process ({started[-1]}): mark the test `process`",
                    False)  # fmt: skip

    def popen(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        refuse(f"`{_program(args)}`")

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, lambda *a, _name=name, **k: refuse(f"os.{_name}"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start",
                        lambda self: refuse("multiprocessing"))  # fmt: skip
    yield
    if started:
        pytest.fail(f"a fast test started a process ({started[0]}): mark the test `process`",
                    False)  # fmt: skip


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def orch_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """`orch ARGS` run in this process (the console script's own entry point): its exit
    code and what it printed, with runs recorded under RUNS, from the repository."""
    from orchestrator.cli.main import main

    monkeypatch.delenv("ORCH_HOSTFILE", raising=False)

    def run(args: list[str], runs: Path) -> CliResult:
        monkeypatch.setenv("ORCH_RUNS_DIR", str(runs))
        # What orch keeps in the temporary directory (a dry run's long commands) stays in
        # the test's own.
        temporary = runs.parent / "tmp"
        temporary.mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(temporary))
        monkeypatch.delenv("ORCH_JOB_ID", raising=False)
        # The defaults of the user running the tests are not the test's (a test's own
        # ORCH_HOSTFILE, set after this fixture, stays).
        monkeypatch.setenv("XDG_CONFIG_HOME", f"{runs}.config")
        monkeypatch.chdir(REPO)
        capsys.readouterr()
        try:
            main(args)
            code = 0
        except SystemExit as end:
            code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


@pytest.fixture(scope="module")
def sandbox_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start sandboxes with unique names; every one is taken down when the module ends."""
    missing = _sandbox_prereqs_missing()
    if missing:
        # scripts/test.sh installs these; a bare `pytest` without them is a setup error.
        pytest.fail(f"`{missing}` is not installed: run `bash scripts/test.sh`", pytrace=False)
    started: list[Sandbox] = []
    node_names: list[str] = []

    def start(nodes: int = 4, slots: int = 2, sshd_profile: str = "default", slurm: bool = False,
              shared_pids: bool = False, guests: tuple[str, ...] = ()):  # fmt: skip
        tag = uuid.uuid4().hex[:6]
        box = Sandbox(tmp_path_factory.mktemp(f"sandbox-{tag}", numbered=False))
        started.append(box)
        state = box.up(nodes=nodes, slots=slots, prefix=f"t{tag}n", sshd_profile=sshd_profile,
                       slurm=slurm, shared_pids=shared_pids, guest_users=guests)  # fmt: skip
        node_names.extend(node.name for node in state.nodes)
        return box, state

    yield start
    for box in started:
        box.down()
    _remove_node_local_logs(node_names)


def _remove_node_local_logs(node_names: list[str]) -> None:
    """Node-local raw logs that tests kept on purpose (or could not pull back): the
    sandbox's nodes write them to this machine's /tmp. Only this session's nodes."""
    root = Path(runs_root(os.getuid()))  # the sandbox's nodes run as this user
    if not root.is_dir():
        return
    for job in root.iterdir():
        ours = [job / name for name in node_names if (job / name).exists()]
        for node_dir in ours:
            shutil.rmtree(node_dir, ignore_errors=True)
        # Only a job of these nodes, when nothing else is left in it: an empty one may be
        # another session's, just made, whose node directory is about to go in.
        if ours:
            with contextlib.suppress(OSError):
                job.rmdir()


@pytest.fixture(scope="module")
def sandbox(sandbox_factory) -> tuple[Sandbox, SandboxState]:
    """One 4-node, 2-slot sandbox shared by the module's tests that only read from it."""
    return sandbox_factory(4, 2)


@pytest.fixture
def hostfile(sandbox) -> Path:
    return Path(sandbox[1].hostfile)
