"""`orch launch --push-env` on sandbox nodes that have none of the job's environment: a real
virtual environment (torch, deepspeed, accelerate: this project's own packages, hard-linked)
at a path that is empty on every node. The pre-flight finds it missing, the head's is pushed,
the pre-flight passes, and a 3-node x 1-rank torchrun training job runs in it; its record
says which environment every node ran, and afterwards the doctor passes and another push
sends next to nothing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from launch_support import ORCH, REPO, orch_env

from orchestrator.sandbox.state import SandboxState

pytestmark = pytest.mark.sandbox

NODES, SLOTS = 3, 1
TRAIN = str(REPO / "tests" / "jobs" / "env_train.py")


def linked_copy(source: Path, target: Path) -> None:
    """`source`'s tree at `target`, every file a hard link (no bytes copied)."""
    for top, dirs, files in os.walk(source):
        here = target / Path(top).relative_to(source)
        here.mkdir(exist_ok=True)
        for name in [*files, *(d for d in dirs if (Path(top) / d).is_symlink())]:
            path = Path(top) / name
            if path.is_symlink():
                os.symlink(os.readlink(path), here / name)
            else:
                os.link(path, here / name)


@pytest.fixture(scope="module")
def cluster(sandbox_factory, tmp_path_factory) -> tuple[SandboxState, Path]:
    """The sandbox, and an environment at a path each node has its own (empty) copy of."""
    box, state = sandbox_factory(NODES, SLOTS)
    envs = tmp_path_factory.mktemp("envs")
    root = envs / "train"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)],
                   check=True, timeout=120)  # fmt: skip
    site = next(root.glob("lib/python*/site-packages"))
    shutil.rmtree(site)
    linked_copy(next(Path(sys.prefix).glob("lib/python*/site-packages")), site)
    for node in state.nodes:
        box.private_directory(node.name, envs)
    return state, root


@dataclass(frozen=True)
class Launched:
    done: subprocess.CompletedProcess[str]
    record: dict
    job: Path
    seconds: float


@pytest.fixture(scope="module")
def launched(cluster, tmp_path_factory) -> Launched:
    state, root = cluster
    runs = tmp_path_factory.mktemp("runs")
    argv = [*ORCH, "launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
            "--push-env", "--python", str(root / "bin/python"), TRAIN, "--", "--steps", "20"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=orch_env(runs), capture_output=True, text=True,
                          timeout=1800, check=False)  # fmt: skip
    seconds = time.monotonic() - started
    jobs = [p for p in runs.iterdir() if (p / "job.json").is_file()]
    assert len(jobs) == 1, done.stderr[-4000:]
    [job] = jobs
    return Launched(done, json.loads((job / "job.json").read_text()), job, seconds)


def test_the_job_runs_on_every_rank_in_the_pushed_environment(cluster, launched) -> None:
    state, root = cluster
    done, record = launched.done, launched.record
    assert done.returncode == 0, done.stderr[-4000:]
    assert record["state"] == "succeeded"
    assert "--push-env: the environment of" in done.stderr
    # format_bytes's unit follows the size: a venv with torch is near 1 GiB
    assert re.search(r"--push-env: pushed .* \d+(\.\d)? [KMG]iB sent", done.stderr), done.stderr
    said = "".join((launched.job / "logs" / f"{n.name}.log").read_text() for n in state.nodes)
    ranks = {line.split("rank ", 1)[1].split("/")[0] for line in said.splitlines()
             if f"prefix={root} executable={root}/bin/python" in line}  # fmt: skip
    assert ranks == {str(r) for r in range(NODES * SLOTS)}, said[-3000:]
    assert "trained 20 steps" in said


def test_the_record_keeps_every_nodes_environment_the_heads(cluster, launched) -> None:
    state, _ = cluster
    kept = launched.record["environment"]
    names = [n.name for n in state.nodes]
    assert kept["reference"] and set(kept["nodes"]) == set(names)
    assert all(fingerprint == kept["reference"] for fingerprint in kept["nodes"].values())
    assert sorted(kept["pushed"]) == sorted(names) and kept["pushed_bytes"] > 100 << 20


def test_afterwards_the_doctor_passes_and_another_push_sends_next_to_nothing(
    cluster, launched
) -> None:
    state, root = cluster
    python = str(root / "bin/python")
    doctor = subprocess.run([*ORCH, "doctor", "--hostfile", state.hostfile, "--python", python,
                             "--json"], cwd=REPO, capture_output=True, text=True, timeout=300,
                            check=False)  # fmt: skip
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    prints = json.loads(doctor.stdout)["environment"]["fingerprints"]
    assert set(prints.values()) == {launched.record["environment"]["reference"]}
    push = subprocess.run([*ORCH, "env", "push", "--hostfile", state.hostfile, "--python",
                           python, "--json"], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert push.returncode == 0, push.stdout[-3000:] + push.stderr[-2000:]
    report = json.loads(push.stdout)
    assert report["fingerprint"] == launched.record["environment"]["reference"]
    assert report["head_sent_bytes"] < 1 << 20  # the package is not sent again
    assert report["payload_bytes"] > 100 << 20


def test_a_push_a_node_refuses_starts_nothing_and_names_the_node(
    cluster, launched, tmp_path: Path
) -> None:
    """Last: the head's environment gains a launcher's package. Without --push-env the
    pre-flight's finding names the push of the job's own nodes; with it, a node where a
    process runs from the environment refuses the push, and nothing starts."""
    state, root = cluster
    python = str(root / "bin/python")
    site = next(root.glob("lib/python*/site-packages"))
    dist = site / "colossalai-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: colossalai\nVersion: 0.0.1\n")
    runs = tmp_path / "runs"

    def launch(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [*ORCH, "launch", "--hostfile", state.hostfile, "--launcher", "torchrun",
                "--python", python, *extra, TRAIN]  # fmt: skip
        return subprocess.run(argv, cwd=REPO, env=orch_env(runs), capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip

    plain = launch()
    assert plain.returncode == 78, plain.stderr[-3000:]  # the pre-flight's finding
    assert "colossalai missing (0.0.1 on the head)" in plain.stderr
    assert (f"`orch env push --hostfile {state.hostfile} --python {python}`, or launch again "
            "with --push-env") in plain.stderr  # fmt: skip

    busy = state.nodes[1].name
    sleeper = f"echo $$; exec {python} -c 'import time; time.sleep(120)'"
    job = subprocess.Popen(["ssh", busy, sleeper], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None
        pid = job.stdout.readline().strip()
        for _ in range(100):  # until the shell has become the python
            seen = subprocess.run(["ssh", busy, f"cat /proc/{pid}/cmdline"], capture_output=True,
                                  text=True, timeout=30, check=False)  # fmt: skip
            if str(root) in seen.stdout:
                break
        pushing = launch("--push-env")
    finally:
        job.kill()
        subprocess.run(["ssh", busy, f"kill {pid}"], timeout=30, check=False)
    assert pushing.returncode == 69, pushing.stderr[-3000:]  # a node could not take it
    said = pushing.stderr
    assert f"could not be pushed to {busy}; nothing was started" in said
    assert f"{busy}: processes (pids {pid}) run from {root}" in said and "--force" in said
    assert not runs.exists()  # no job was recorded: none started
