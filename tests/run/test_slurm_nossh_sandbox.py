"""orch on a Slurm whose compute nodes refuse SSH (`orch sandbox up --slurm --no-ssh`): every
node operation it makes goes through srun steps, decided up front and said in one line:
doctor, the job's settings, the main port, the fan-out, the raw logs, a crash's and a hang's
stacks, `orch stacks` and `orch kill` of a running job. Nothing of a job is left behind."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launch_support import (
    ALLREDUCE,
    ORCH,
    REPO,
    job_ids,
    job_json,
    log_text,
    orch_env,
    slurm_env,
    wait_for,
)

from orchestrator.sandbox.cluster import Sandbox

pytestmark = pytest.mark.sandbox
STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")


@pytest.fixture(scope="module")
def no_ssh_sandbox(sandbox_factory):
    _box, state = sandbox_factory(2, 2, sshd_profile="no-ssh", slurm=True)
    return state


def _in_allocation(state, runs: Path, argv: list[str], *,
                   home: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`salloc -N2 --ntasks-per-node=2 ...`; with `home`, as a user with no SSH key and no
    SSH configuration at all (an empty home)."""
    env = slurm_env(state, runs)
    if home is not None:
        home.mkdir(exist_ok=True)
        env["HOME"] = str(home)
    return subprocess.run(["salloc", "-N2", "--ntasks-per-node=2", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def _launch(*args: str) -> list[str]:
    return [*ORCH, "launch", "--no-doctor", *args]


def _job_pids(job_id: str) -> list[int]:
    """Processes of the job on any sandbox node: the nodes share this machine's kernel, and
    no SSH reaches them to look from inside."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"ORCH_JOB_ID={job_id}".encode() in environ:
                found.append(int(entry.name))
    return found


def _node_dirs_left(job_id: str) -> list[Path]:
    job_dir = Path(f"/tmp/orch-{os.getuid()}/runs/{job_id}")
    return list(job_dir.iterdir()) if job_dir.exists() else []


def test_the_nodes_refuse_ssh(no_ssh_sandbox, tmp_path):
    result = subprocess.run([*ORCH, "doctor", "--hostfile", no_ssh_sandbox.hostfile], cwd=REPO,
                            env=orch_env(tmp_path), capture_output=True, text=True,
                            timeout=120, check=False)  # fmt: skip
    assert result.returncode == 1
    assert "authentication rejected" in result.stdout


def test_doctor_inside_the_allocation_checks_every_node_through_srun(no_ssh_sandbox, tmp_path):
    names = [node.name for node in no_ssh_sandbox.nodes]
    result = _in_allocation(no_ssh_sandbox, tmp_path, [*ORCH, "doctor", "--json"])
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["transport"] == "slurm"
    assert [node["node"] for node in report["nodes"]] == names
    assert all(node["reachable"] for node in report["nodes"])
    assert report["main"]["port"]  # node 0 picked it, through srun
    said = [line for line in result.stderr.splitlines() if "through Slurm" in line]
    assert len(said) == 1 and f"SSH to {names[0]} is refused" in said[0]
    table = _in_allocation(no_ssh_sandbox, tmp_path, [*ORCH, "doctor"])
    assert table.returncode == 0 and "srun" in table.stdout and "all checks passed" in table.stdout
    forced = _in_allocation(no_ssh_sandbox, tmp_path, [*ORCH, "doctor", "--transport", "ssh"])
    assert forced.returncode == 1 and "authentication rejected" in forced.stdout


_STEPS = textwrap.dedent("""
    import os, sys
    from orchestrator.nodes.srun import run_on_nodes_via_srun
    from orchestrator.specs.inventory import expand_nodeset
    job = os.environ["SLURM_JOB_ID"]
    names = list(expand_nodeset(os.environ["SLURM_JOB_NODELIST"]))
    ran = run_on_nodes_via_srun(names + ["nosuchnode"], "hostname; cat; echo said >&2; exit 3",
                                slurm_job=job, stdin=b"from stdin\\n", timeout=30)
    for r in ran:
        v = r.value
        print(r.node, "|", r.problem if v is None else (v.exit_code, v.stdout, v.stderr))
    [slow] = run_on_nodes_via_srun(names[:1], "echo rehash lock >&2; sleep 60", slurm_job=job,
                                   timeout=3)
    print("slow |", slow.problem)
""")


def test_node_commands_as_srun_steps_give_each_nodes_own_answer(no_ssh_sandbox, tmp_path):
    names = [node.name for node in no_ssh_sandbox.nodes]
    result = _in_allocation(no_ssh_sandbox, tmp_path, [sys.executable, "-c", _STEPS])
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" | ", 1) for line in result.stdout.splitlines())
    for name in names:  # stdin reached the command; its own code and stderr came back
        assert lines[name] == repr((3, f"{name}\nfrom stdin\n".encode(), b"said\n"))
    assert lines["nosuchnode"].startswith("nosuchnode: Slurm could not run a step there: srun:")
    assert lines["slow"].startswith(f"{names[0]}: command did not finish within 3s (through srun)")
    assert "it printed on stderr: rehash lock" in lines["slow"]


def test_a_job_runs_through_srun_alone_and_its_raw_logs_come_back(no_ssh_sandbox, tmp_path):
    names = [node.name for node in no_ssh_sandbox.nodes]
    home, tmp_path = tmp_path / "home", tmp_path / "runs"
    launch = _launch("--launcher", "torchrun", ALLREDUCE, "--", "--steps", "2")
    result = _in_allocation(no_ssh_sandbox, tmp_path, launch, home=home)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "every node operation goes through Slurm job" in result.stderr
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert (record["transport"], record["fanout"], record["state"]) == ("slurm", "srun",
                                                                        "succeeded")  # fmt: skip
    assert record["node_logs"] == dict.fromkeys(names, "ok")  # pulled back through srun
    for node in names:
        assert any((tmp_path / job_id / "nodes" / node).iterdir())
        assert " out rank " in log_text(tmp_path, job_id, node)
    assert _node_dirs_left(job_id) == [] and _job_pids(job_id) == []


def test_a_crash_and_a_hang_are_named_with_every_ranks_stack_through_srun(no_ssh_sandbox,
                                                                          tmp_path):  # fmt: skip
    crash = _in_allocation(no_ssh_sandbox, tmp_path / "crash", _launch(
        "--launcher", "standard", STEPPING, "--", "--max-seconds", "100", "--compute", "30",
        "--fail-rank", "3", "--fail-after", "0"))  # fmt: skip
    assert crash.returncode == 7, crash.stderr[-3000:]
    [job_id] = job_ids(tmp_path / "crash")
    record = job_json(tmp_path / "crash", job_id)
    assert record["first_failure"]["rank"] == 3
    kept = json.loads((tmp_path / "crash" / job_id / record["teardown_stacks"]).read_text())
    # The failed rank's node has ended its ranks by then (its launcher does); the other
    # node's stand where they waited.
    assert sorted(r for b in kept["stacks"]["blocks"] for r in b["ranks"]) == [0, 1]
    hang = _in_allocation(no_ssh_sandbox, tmp_path / "hang", _launch(
        "--launcher", "torchrun", "--hang-timeout", "8", STEPPING, "--", "--compute", "0",
        "--lead-pause", "0.05", "--stall-rank", "1", "--stall-after", "2", "--max-seconds", "120"),
        home=tmp_path / "home")  # fmt: skip
    assert hang.returncode == 124, hang.stderr[-3000:]
    [job_id] = job_ids(tmp_path / "hang")
    record = job_json(tmp_path / "hang", job_id)
    assert record["first_failure"]["kind"] == "hang" and record["first_failure"]["rank"] == 1
    kept = json.loads((tmp_path / "hang" / job_id / record["teardown_stacks"]).read_text())
    assert sorted(r for b in kept["stacks"]["blocks"] for r in b["ranks"]) == [0, 1, 2, 3]
    assert _job_pids(job_id) == [] and _node_dirs_left(job_id) == []


def test_stacks_and_kill_reach_a_running_job_through_slurm(no_ssh_sandbox, tmp_path):
    names = [node.name for node in no_ssh_sandbox.nodes]
    argv = ["salloc", "-N2", "--ntasks-per-node=2",
            *_launch("--launcher", "torchrun", ALLREDUCE, "--", "--steps", "2", "--sleep", "600")]
    env = slurm_env(no_ssh_sandbox, tmp_path)
    with (tmp_path / "salloc.log").open("w") as out:
        salloc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: job_ids(tmp_path), 60)
        [job_id] = job_ids(tmp_path)
        assert wait_for(lambda: all("step 1" in log_text(tmp_path, job_id, n) for n in names),
                        120), (tmp_path / "salloc.log").read_text()[-3000:]  # fmt: skip
        stacks = subprocess.run([*ORCH, "stacks", job_id, "--json"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert stacks.returncode == 0, stacks.stderr
        document = json.loads(stacks.stdout)
        assert sorted(r for b in document["stacks"]["blocks"] for r in b["ranks"]) == [0, 1, 2, 3]
        killed = subprocess.run([*ORCH, "kill", job_id], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)  # fmt: skip
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert salloc.wait(120) != 0
    finally:
        if salloc.poll() is None:
            salloc.kill()
    assert job_json(tmp_path, job_id)["state"] == "killed"
    assert wait_for(lambda: _job_pids(job_id) == [], 30)


def test_what_needs_ssh_is_refused_before_anything_runs(no_ssh_sandbox, tmp_path):
    pdsh = _in_allocation(no_ssh_sandbox, tmp_path, _launch("--launcher", "pdsh", ALLREDUCE))
    assert pdsh.returncode == 2, pdsh.stderr
    assert "pdsh launcher's nodes are started by DeepSpeed's runner over SSH" in pdsh.stderr
    sync = _in_allocation(no_ssh_sandbox, tmp_path, _launch(
        "--launcher", "torchrun", "--sync", ALLREDUCE))  # fmt: skip
    assert sync.returncode != 0 and "--sync copies the working directory over SSH" in sync.stderr
    assert job_ids(tmp_path) == []


def test_env_push_goes_through_slurm_steps(no_ssh_sandbox, tmp_path):
    """`orch env push` inside the allocation, with no SSH at all: the nodes' looks and
    transfers are srun steps, and the stream still goes once, node to node."""
    box = Sandbox(Path(no_ssh_sandbox.directory))
    envs = tmp_path / "envs"
    envs.mkdir()
    root = envs / "train"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True,
                   timeout=120)  # fmt: skip
    site = next(root.glob("lib/python*/site-packages"))
    (site / "stepped.py").write_text("WHERE = 'pushed'\n")
    (site / "weights.bin").write_bytes(os.urandom(4 << 20))
    for node in no_ssh_sandbox.nodes:
        box.private_directory(node.name, envs)
    python = root / "bin" / "python"
    script = (f"{shlex.join([*ORCH, 'env', 'push', '--python', str(python), '--json'])} "
              f"&& srun -N2 -n2 {python} -c "
              "'import stepped, socket; print(stepped.WHERE)'")  # fmt: skip
    result = _in_allocation(no_ssh_sandbox, tmp_path, ["sh", "-c", script],
                            home=tmp_path / "home")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    first, second = (n.name for n in no_ssh_sandbox.nodes)
    nodes = {n["node"]: n for n in report["nodes"]}
    assert nodes[first]["from"] == "head" and nodes[second]["from"] == first
    assert (4 << 20) < report["head_sent_bytes"] < (6 << 20)  # once, not once per node
    assert "every node operation goes through Slurm" in result.stderr
    assert result.stdout.split().count("pushed") == 2  # both nodes run the pushed env
