"""`orch env push` on sandbox nodes with storage of their own: two nodes whose directory of
environments is their own (empty), one that sees the head's (a shared filesystem). A real
virtual environment is pushed (sent once by the head, passed on by the first node to the
second), runs there, and a second push sends only what changed."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox.cluster import Sandbox
from orchestrator.sandbox.state import SandboxState

pytestmark = pytest.mark.sandbox

ORCH = str(Path(sys.executable).with_name("orch"))
BIG = 2 << 20  # a file of the package, so that bytes sent mean something


@pytest.fixture(scope="module")
def cluster(sandbox_factory, tmp_path_factory) -> tuple[Sandbox, SandboxState, Path]:
    box, state = sandbox_factory(3, 1)
    envs = tmp_path_factory.mktemp("envs")
    root = envs / "train"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)],
                   check=True, timeout=120)  # fmt: skip
    site = next(root.glob("lib/python*/site-packages"))
    (site / "demo_pkg").mkdir()
    (site / "demo_pkg" / "__init__.py").write_text("VERSION = '1.0'\n")
    (site / "demo_pkg" / "weights.bin").write_bytes(bytes(range(256)) * (BIG // 256))
    dist = site / "demo_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    for node in state.nodes[1:]:
        box.private_directory(node.name, envs)
    return box, state, root


def push(state: SandboxState, root: Path, *extra: str) -> tuple[int, dict]:
    done = subprocess.run(
        [ORCH, "env", "push", "--hostfile", state.hostfile, "--python", str(root / "bin/python"),
         "--json", *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def on_node(node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", node, shlex.join(argv)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def by_node(report: dict) -> dict[str, dict]:
    return {n["node"]: n for n in report["nodes"]}


def test_push_sends_everything_once_then_only_what_changed(cluster) -> None:
    _, state, root = cluster
    shared, first, second = (n.name for n in state.nodes)
    probe = ("import demo_pkg, importlib.metadata as m; "
             "print(demo_pkg.VERSION, m.version('demo-pkg'))")
    assert on_node(first, "test", "-e", str(root)).returncode == 1  # nothing there yet

    code, report = push(state, root)
    assert code == 0, report["nodes"]
    nodes = by_node(report)
    assert nodes[shared]["shared"] is True and nodes[shared]["sent_files"] == 0
    for name in (first, second):
        assert nodes[name]["sent_bytes"] > BIG
        assert nodes[name]["fingerprint"] == report["fingerprint"]
    # sent once, by the head to the first node, which passed it on to the second
    assert BIG < report["head_sent_bytes"] < 1.5 * BIG and report["payload_bytes"] > BIG
    assert (nodes[first]["from"], nodes[second]["from"]) == ("head", first)
    assert nodes[first]["relayed_bytes"] > BIG and nodes[second]["relayed_bytes"] == 0
    ran = on_node(first, f"{root}/bin/python", "-c", probe)
    assert ran.stdout.split() == ["1.0", "1.0"], ran.stderr

    code, report = push(state, root)  # nothing changed: nothing sent
    assert code == 0 and report["head_sent_bytes"] == 0
    assert all(n["sent_files"] == 0 for n in report["nodes"])

    site = next(root.glob("lib/python*/site-packages"))
    (site / "demo_pkg" / "__init__.py").write_text("VERSION = '1.1'\n")
    code, report = push(state, root, "--dry-run")
    assert code == 0 and report["head_sent_bytes"] == 0
    assert by_node(report)[first]["sent_files"] == 1 and by_node(report)[first]["dry_run"]
    assert on_node(first, f"{root}/bin/python", "-c", probe).stdout.split() == ["1.0", "1.0"]

    code, report = push(state, root)
    assert code == 0, report
    assert [by_node(report)[n]["sent_files"] for n in (first, second)] == [1, 1]
    assert report["head_sent_bytes"] < 64 << 10  # the one file, once, not the package
    assert on_node(second, f"{root}/bin/python", "-c", probe).stdout.split() == ["1.1", "1.0"]
    # rebuilt from what it had: a link stays a link, each mode is the head's
    assert on_node(first, "readlink", f"{root}/lib64").stdout.strip() == "lib"
    modes = ["stat", "-c", "%a", str(root), str(site), str(site / "demo_pkg" / "__init__.py")]
    head_modes = subprocess.run(modes, capture_output=True, text=True, check=True).stdout
    assert on_node(second, *modes).stdout == head_modes
    # the node's environment is its own: a file written there is not on the head
    on_node(first, "touch", f"{root}/only-on-node")
    assert not (root / "only-on-node").exists()


def test_a_push_under_a_running_job_is_refused_naming_it(cluster) -> None:
    _, state, root = cluster
    first = state.nodes[1].name
    push(state, root)
    sleeper = shlex.join([f"{root}/bin/python", "-c", "import time; time.sleep(60)"])
    job = subprocess.Popen(["ssh", first, f"echo $$; ORCH_JOB_ID=j-sleeper exec {sleeper}"],
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert job.stdout is not None
        pid = job.stdout.readline().strip()  # the remote shell's pid, which execs python
        for _ in range(100):  # until the exec happened
            if str(root) in on_node(first, "cat", f"/proc/{pid}/cmdline").stdout:
                break
        code, report = push(state, root)
    finally:
        job.kill()
        on_node(first, "kill", pid)
    assert code == 1
    refused = by_node(report)[first]
    assert refused["ok"] is False
    assert f"orch job j-sleeper (pids {pid}) run from {root}" in refused["problem"]
    assert "orch kill j-sleeper" in refused["fix"] and "--force" in refused["fix"]


def test_a_system_interpreter_is_refused_before_anything_is_sent(cluster) -> None:
    _, state, _ = cluster
    done = subprocess.run([ORCH, "env", "push", "--hostfile", state.hostfile, "--python",
                           sys._base_executable], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode in (1, 2)
    assert "is not in a virtual or conda environment" in done.stderr


def test_an_interrupted_push_leaves_the_previous_environment_working(cluster) -> None:
    _, state, root = cluster
    first = state.nodes[1].name
    push(state, root)
    site = next(root.glob("lib/python*/site-packages"))
    (site / "demo_pkg" / "big.bin").write_bytes(bytes(range(256)) * (200 << 12))  # 200 MiB
    (site / "demo_pkg" / "__init__.py").write_text("VERSION = 'interrupted'\n")
    argv = [ORCH, "env", "push", "--hostfile", state.hostfile, "--python",
            str(root / "bin/python"), "--json"]  # fmt: skip
    head = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    building = False
    try:
        for _ in range(600):  # until the node builds the new environment beside the old
            building = on_node(first, "sh", "-c", f"ls -d {root}.orch-new-*").returncode == 0
            if building or head.poll() is not None:
                break
        head.kill()  # the head is gone mid-transfer, as with a power cut
        head.wait(timeout=30)
    finally:
        (site / "demo_pkg" / "big.bin").unlink()
        (site / "demo_pkg" / "__init__.py").write_text("VERSION = '1.1'\n")
    assert building, "the push ended before it could be interrupted"
    ran = on_node(first, f"{root}/bin/python", "-c", "import demo_pkg; print(demo_pkg.VERSION)")
    assert ran.stdout.strip() in ("1.0", "1.1"), ran.stderr  # the previous one, whole
    for _ in range(100):  # the node side saw the channel close and cleaned up
        if on_node(first, "sh", "-c", f"ls -d {root}.orch-new-*").returncode != 0:
            break
    assert on_node(first, "sh", "-c", f"ls -d {root}.orch-new-*").returncode != 0
