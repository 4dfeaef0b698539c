"""`orch env push` passed from node to node, on three sandbox nodes whose directory of
environments is each their own: a node lost in the middle of the chain costs only itself
(the node after it is sent again from the head), two pushes of one environment at once
never mix, and an environment path that is a link on a node stays a link."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_support import wait_for

from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.state import SandboxState

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))
BIG = 160 << 20  # long enough a stream to lose a node in the middle of it


def make_env(root: Path, version: str, big: int = 0) -> Path:
    if not root.exists():
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)],
                       check=True, timeout=120)  # fmt: skip
    site = next(root.glob("lib/python*/site-packages"))
    (site / "relay_pkg").mkdir(exist_ok=True)
    (site / "relay_pkg" / "__init__.py").write_text(f"VERSION = {version!r}\n")
    weights = site / "relay_pkg" / "weights.bin"
    if big:
        weights.write_bytes(os.urandom(1 << 20) * (big >> 20))
    elif weights.exists():
        weights.unlink()
    return root


@pytest.fixture(scope="module")
def cluster(sandbox_factory, tmp_path_factory) -> tuple[Sandbox, SandboxState, Path]:
    box, state = sandbox_factory(3, 1)
    envs = tmp_path_factory.mktemp("relay-envs")
    for node in state.nodes:
        SEEN[node.name] = box.private_directory(node.name, envs)
    return box, state, envs


SEEN: dict[str, Path] = {}  # where this machine sees each node's own directory of envs


def stalled_mid_stream(box: Sandbox, run: subprocess.Popen, last: str, root: Path) -> None:
    """Once the stream reaches the last node of the chain, freeze that node: the chain (and
    the head's sending) stops there, mid-stream, however fast the machine is."""
    def reached() -> bool:
        return run.poll() is not None or bool(list(SEEN[last].glob(f"{root.name}.orch-new-*")))

    stopped = wait_for(reached, 120, 0.005) and run.poll() is None
    assert stopped, "the push ended before the stream could be stopped mid-way"
    box.freeze(last)


def push_argv(state: SandboxState, root: Path) -> list[str]:
    return [ORCH, "env", "push", "--hostfile", state.hostfile, "--python",
            str(root / "bin/python"), "--json"]  # fmt: skip


def push(state: SandboxState, root: Path) -> tuple[int, dict]:
    done = subprocess.run(push_argv(state, root), capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def on_node(node: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", node, command], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip


def version_on(node: str, root: Path) -> str:
    code = "import relay_pkg; print(relay_pkg.VERSION)"
    return on_node(node, shlex.join([f"{root}/bin/python", "-c", code])).stdout.strip()


def leftovers(node: str, root: Path) -> str:
    return on_node(node, f"ls -d {shlex.quote(str(root))}.orch-new-* 2>/dev/null").stdout


def by_node(report: dict) -> dict[str, dict]:
    return {n["node"]: n for n in report["nodes"]}


def test_two_pushes_at_once_never_mix(cluster) -> None:
    _, state, envs = cluster
    root = make_env(envs / "twice", "1", big=32 << 20)
    runs = [subprocess.Popen(push_argv(state, root), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    reports = [json.loads(run.communicate(timeout=600)[0]) for run in runs]
    for name in (n.name for n in state.nodes):
        said = [by_node(r)[name] for r in reports]
        # each node took one push whole; a push that found another running says so
        assert any(s["ok"] for s in said), json.dumps(reports, indent=1)
        for s in said:
            assert s["ok"] or "another orch env push of" in s["problem"], s
        assert version_on(name, root) == "1"
        assert leftovers(name, root) == ""


def test_a_node_whose_environment_path_is_a_link_keeps_the_link(cluster) -> None:
    _, state, envs = cluster
    root = make_env(envs / "linked", "1")
    node = state.nodes[1].name
    target = f"{envs}/linked-v1"
    assert on_node(node, f"mkdir {target} && ln -s {target} {root}").returncode == 0
    code, report = push(state, root)
    assert code == 0, report["nodes"]
    assert on_node(node, f"readlink {root}").stdout.strip() == target
    assert version_on(node, root) == "1"
    assert on_node(node, f"test -L {root}").returncode == 0 and leftovers(node, root) == ""


def test_ctrl_c_ends_the_push_at_once_and_every_node_keeps_a_whole_environment(cluster):
    box, state, envs = cluster
    names = [n.name for n in state.nodes]
    root = make_env(envs / "interrupted", "before")
    assert push(state, root)[0] == 0
    make_env(root, "after", big=BIG)
    # as from a shell that started it in the background: SIGINT ignored since start-up
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run = subprocess.Popen(push_argv(state, root), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        stalled_mid_stream(box, run, names[-1], root)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)  # at once, not when the nodes are done
    finally:
        box.thaw(names[-1])
    assert run.returncode == 130 and "interrupted (SIGINT): no node switched" in err
    assert "Traceback" not in err
    for name in names:
        assert version_on(name, root) in ("before", "after")  # a whole one, either
        # The node saw its channel close and dropped its build.
        dropped = wait_for(lambda name=name: leftovers(name, root) == "", 10, 0.2)
        assert dropped, leftovers(name, root)


def test_a_node_lost_mid_chain_costs_only_itself(cluster) -> None:
    """Last: the node it kills stays dead for the rest of the module."""
    box, state, envs = cluster
    first, middle, last = (n.name for n in state.nodes)
    root = make_env(envs / "lossy", "big", big=BIG)
    run = subprocess.Popen(push_argv(state, root), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stalled_mid_stream(box, run, last, root)
        for pid in box.node_pids(middle):  # the node dies for good, its sshd too
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        box.thaw(last)
    out, err = run.communicate(timeout=600)
    report = json.loads(out)
    assert run.returncode == 1, err
    nodes = by_node(report)
    assert nodes[middle]["ok"] is False and middle in nodes[middle]["problem"]
    assert nodes[first]["ok"] and nodes[last]["ok"], report["nodes"]
    assert nodes[last]["from"] == "head"  # sent again, since the chain lost its upstream
    assert version_on(first, root) == version_on(last, root) == "big"
    assert leftovers(last, root) == ""
    # the stream went once to the first node, then once more (at most) to the last
    assert report["head_sent_bytes"] < 2.2 * BIG
