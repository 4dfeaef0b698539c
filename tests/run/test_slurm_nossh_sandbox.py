"""orch on a Slurm whose compute nodes refuse SSH (`orch sandbox up --slurm --no-ssh`): every
node operation it makes goes through srun steps, decided up front and said in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from launch_support import ORCH, REPO, orch_env, slurm_env

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def no_ssh_sandbox(sandbox_factory):
    _box, state = sandbox_factory(2, 2, sshd_profile="no-ssh", slurm=True)
    return state


def _in_allocation(state, runs: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["salloc", "-N2", "--ntasks-per-node=2", *argv], cwd=REPO,
                          env=slurm_env(state, runs), capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip


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
    from orchestrator.run.srun_nodes import run_on_nodes_via_srun
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
