"""orch on a real Slurm (the sandbox's: slurmctld here, a slurmd in every node): inside
`salloc`, launches whose nodes srun starts; `orch submit --sbatch`, `orch status` and
`orch kill` of a batch job; a node Slurm takes down mid-job; srun's refusal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch_support import (
    ALLREDUCE,
    ORCH,
    RACE,
    REPO,
    all_ranks_up,
    job_ids,
    job_json,
    job_processes,
    log_text,
    run_orch,
    slurm_env,
    wait_for,
)

from orchestrator.sandbox.slurm import KILL_WAIT_S, slurm_dir

pytestmark = pytest.mark.sandbox
STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")


@pytest.fixture(scope="module")
def slurm_sandbox(sandbox_factory):
    box, state = sandbox_factory(3, 2, slurm=True)
    return box, state


def _slurm(state, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=slurm_env(state, Path("/nonexistent")),
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def _in_allocation(state, runs: Path, orch_args: list[str], *, nodes: int = 2,
                   timeout: float = 300, shape: tuple[str, ...] = ("--ntasks-per-node=2",),
                   ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`salloc -N <nodes> --ntasks-per-node=2 orch ...`, as a user types it."""
    argv = ["salloc", f"-N{nodes}", *shape, *ORCH, *orch_args]
    return subprocess.run(argv, cwd=REPO, env=slurm_env(state, runs), capture_output=True,
                          text=True, timeout=timeout, check=False)  # fmt: skip


def _queue(state) -> str:
    return _slurm(state, "squeue", "-h", "-o", "%i %T").stdout.strip()


# Slurm's own bound on a job's end: TERM, KillWait, KILL, then up to UnkillableStepTimeout
# (60 s by default) for the step's processes to go before it calls the node broken.
RELEASE_S = KILL_WAIT_S + 60


def _released(state, within: float = RELEASE_S) -> None:
    """The allocation is given back, past Slurm's COMPLETING, within `within` seconds; else
    the failure says what Slurm still holds: the job, its steps, what the nodes' slurmd
    last did and which processes the steps still have."""
    if wait_for(lambda: _queue(state) == "", within):
        return
    jobs = _queue(state)
    said = [f"queue: {jobs}", _slurm(state, "squeue", "-h", "-s").stdout]
    for line in jobs.splitlines():
        said.append(_slurm(state, "scontrol", "show", "job", "-d", line.split()[0]).stdout)
    for log in sorted(slurm_dir(Path(state.directory)).glob("*/slurmd.log")):
        said.append(f"{log}:\n" + "".join(log.read_text().splitlines(True)[-25:]))
    tree = subprocess.run(["ps", "-eo", "pid,ppid,stat,etimes,args", "--forest"],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    said.append("\n".join(line for line in tree.stdout.splitlines()
                          if "slurmstepd" in line or "orch" in line))  # fmt: skip
    pytest.fail("\n".join(said))


def _launch(launcher: str, *script_args: str) -> list[str]:
    return ["launch", "--slurm", "--launcher", launcher, "--no-doctor", ALLREDUCE, "--",
            *script_args]  # fmt: skip


def _names(state) -> list[str]:
    return [n.name for n in state.nodes]


def test_sandbox_runs_a_real_slurm_with_a_slurmd_per_node(slurm_sandbox):
    box, state = slurm_sandbox
    answer = _slurm(state, "srun", "-N3", "hostname")
    assert answer.returncode == 0, answer.stderr
    assert sorted(answer.stdout.split()) == sorted(_names(state))
    # After a step, Slurm shows its nodes "completing" until their cleanup has run: on a busy
    # machine that takes a moment. They must come back idle, not stay taken.
    idle = dict.fromkeys(_names(state), "idle")
    assert wait_for(lambda: box.slurm_states(state) == idle, 60), box.slurm_states(state)
    status = subprocess.run([*ORCH, "sandbox", "status", "--dir", state.directory, "--json"],
                            capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    doc = json.loads(status.stdout)
    assert doc["slurm"]["conf"] == state.slurm_conf
    assert doc["slurm"]["nodes"] == dict.fromkeys(_names(state), "idle")


@pytest.mark.parametrize("launcher", ["torchrun", "standard"])
def test_launch_inside_salloc_runs_every_rank_through_one_srun_step(
    slurm_sandbox, tmp_path, launcher
):
    _box, state = slurm_sandbox
    # Lines longer than one of srun's messages (1024 bytes), which srun would cut, at the very
    # moment the other nodes print theirs.
    args = _launch(launcher, "--steps", "2", "--long-line", "3000")
    result = _in_allocation(state, tmp_path, args)
    assert result.returncode == 0, result.stderr
    assert f"{launcher} on 2 nodes x 2 ranks" in result.stderr
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    names = record["hosts"]  # from SLURM_JOB_NODELIST, no hostfile
    assert len(names) == 2 and set(names) <= set(_names(state))
    assert record["fanout"] == "srun"
    slurm_job = record["slurm_job_id"]
    assert slurm_job and record["slurm_step"].startswith(f"{slurm_job}.")
    assert not record["slurm_batch"]
    # Each node's log holds its own two ranks' lines, labelled with the global rank, up to
    # their last.
    total = sum(range(1, 5))
    for k, node in enumerate(names):
        log = log_text(tmp_path, job_id, node)
        for rank in (2 * k, 2 * k + 1):
            long = f"rank {rank} step 1 long "
            for said in (f"rank {rank} step 1 sum {total}", long + "x" * (3000 - len(long)),
                         f"rank {rank} done"):  # fmt: skip
                line = f" r{rank}/{rank % 2} out {said}\n"
                assert line in log, _where_lost(tmp_path / job_id, node, rank, result.stderr)
    # salloc's allocation is over, nothing queued (once Slurm's cleanup has run: "COMPLETING"
    # lasts a moment on a busy machine, as for any step)
    _released(state)


def _where_lost(run: Path, node: str, rank: int, stderr: str) -> str:
    """What tells where a rank's line was lost: the node's log as the head wrote it, the
    rank's output as its node kept it (pulled back), the lines of no node, orch's own."""
    shown = []
    for path in (run / "logs" / f"{node}.log", run / "nodes" / node / f"rank{rank}.stdout.raw",
                 run / "logs" / "_head.log"):  # fmt: skip
        text = path.read_text(errors="replace")[-6000:] if path.exists() else "(no such file)"
        shown.append(f"--- {path.relative_to(run)}:\n{text}")
    return "\n".join([*shown, f"--- orch's stderr:\n{stderr[-3000:]}"])


def test_a_rank_exiting_7_ends_the_job_with_7_and_a_clean_allocation(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    result = _in_allocation(
        state, tmp_path, _launch("torchrun", "--steps", "2", "--fail-rank", "3", "--exit-code",
                                 "7", "--sleep", "60"),
    )  # fmt: skip
    assert result.returncode == 7, result.stderr
    [job_id] = job_ids(tmp_path)
    failure = job_json(tmp_path, job_id)["first_failure"]
    assert failure["rank"] == 3 and failure["exit_code"] == 7
    assert "first failure: " in result.stderr and "rank 3" in result.stderr
    for node in _names(state):
        assert job_processes(node, job_id) == []
    _released(state)


def test_under_srun_the_rank_that_exits_first_is_named_with_its_own_code(slurm_sandbox,
                                                                          tmp_path):
    """The race of tests/run/test_first_failure_sandbox.py inside an allocation of 2 nodes x
    2 ranks, on the default launcher: rank 3 exits 7, its peers exit 1 milliseconds later."""
    _box, state = slurm_sandbox
    race = (*RACE, "--fail-rank", "3", "--exit-code", "7")
    result = _in_allocation(state, tmp_path, _launch("pdsh", *race), nodes=2)
    assert result.returncode == 7, result.stderr[-3000:]
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    roles = {entry["rank"]: entry["role"] for entry in record["ranks"]}
    assert roles == {3: "cause", 0: "consequence", 1: "consequence", 2: "consequence"}
    second = record["hosts"][1]
    assert f"first failure: {second} rank 3: exited with code 7" in result.stderr
    _released(state)


def test_srun_refusing_the_step_is_reported_in_its_words(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{n} slots=2\n" for n in _names(state)))
    args = ["launch", "--hostfile", str(hostfile), "--fanout", "srun", "--launcher", "torchrun",
            "--no-doctor", ALLREDUCE]  # fmt: skip
    result = _in_allocation(state, tmp_path / "runs", args, nodes=2)
    assert result.returncode == 1
    assert "srun refused the step: Only allocated 2 nodes asked for 3" in result.stderr


def test_a_node_slurm_takes_down_mid_job_is_named_with_its_reason(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    log = tmp_path / "salloc.log"
    argv = ["salloc", "-N2", "--ntasks-per-node=2", *ORCH,
            *_launch("torchrun", "--steps", "2", "--sleep", "120")]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=slurm_env(state, tmp_path), stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    victim = _names(state)[1]
    try:
        assert wait_for(lambda: len(job_ids(tmp_path)) == 1, 60), log.read_text()
        [job_id] = job_ids(tmp_path)
        hosts = job_json(tmp_path, job_id)["hosts"]
        victim = hosts[1]
        assert wait_for(lambda: all_ranks_up(tmp_path, job_id, hosts), 120), log.read_text()
        down = _slurm(state, "scontrol", "update", f"nodename={victim}", "state=down",
                      "reason=ECC errors on GPU 3")  # fmt: skip
        assert down.returncode == 0, down.stderr
        code = proc.wait(timeout=90)
    finally:
        proc.kill()
        _slurm(state, "scontrol", "update", f"nodename={victim}", "state=resume")
    text = log.read_text(errors="replace")
    assert code == 143, text
    assert f"Slurm took {victim} out: down (reason: ECC errors on GPU 3)" in text
    [job_id] = job_ids(tmp_path)
    assert job_json(tmp_path, job_id)["first_failure"]["node"] == victim
    assert wait_for(lambda: _slurm(state, "sinfo", "-h", "-n", victim, "-o", "%t").stdout.strip()
                    == "idle", 30)  # fmt: skip


def _recipe(tmp_path: Path, *args: str) -> Path:
    recipe = tmp_path / "allreduce.yaml"
    recipe.write_text(
        "name: allreduce\n"
        f"script: {ALLREDUCE}\n"
        f"args: {json.dumps(list(args))}\n"
        "launcher: torchrun\n"
        "nproc_per_node: 2\n"
        "slurm:\n  nodes: 2\n  time: '10'\n"
    )
    return recipe


def _submit(state, runs: Path, recipe: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ORCH, "submit", str(recipe), "--sbatch", *extra], cwd=REPO,
                          env=slurm_env(state, runs), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def _status(state, runs: Path, job_id: str) -> dict:
    done = subprocess.run([*ORCH, "status", job_id, "--json"], cwd=REPO,
                          env=slurm_env(state, runs), capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    return json.loads(done.stdout)


def test_sbatch_runs_a_recipe_to_completion_and_status_follows_it(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    recipe = _recipe(tmp_path, "--steps", "2")
    shown = _submit(state, tmp_path, recipe, "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n" in shown.stdout
    assert "#SBATCH --time=10\n" in shown.stdout
    assert job_ids(tmp_path) == []  # a dry run submits nothing
    result = _submit(state, tmp_path, recipe)
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert "submitted as Slurm job" in result.stderr
    assert _status(state, tmp_path, job_id)["slurm_job_id"]
    assert wait_for(lambda: _status(state, tmp_path, job_id)["state"] == "succeeded", 180)
    record = job_json(tmp_path, job_id)
    assert record["slurm_batch"] and record["fanout"] == "srun"
    assert len(record["hosts"]) == 2 and set(record["hosts"]) <= set(_names(state))
    assert " r3/1 out rank 3 done\n" in log_text(tmp_path, job_id, record["hosts"][1])
    assert "job " + job_id + " succeeded" in (tmp_path / job_id / "sbatch.out").read_text()
    text = run_orch(["status", job_id], tmp_path).stdout
    assert f"slurm: batch job {record['slurm_job_id']}" in text


def test_kill_of_a_batch_job_leaves_nothing_running(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    result = _submit(state, tmp_path, _recipe(tmp_path, "--steps", "2", "--sleep", "300"))
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    assert wait_for(lambda: (tmp_path / job_id / "job.json").is_file()
                    and len(job_json(tmp_path, job_id)["hosts"]) == 2, 180)  # fmt: skip
    names = job_json(tmp_path, job_id)["hosts"]
    assert wait_for(lambda: all_ranks_up(tmp_path, job_id, names), 180)
    assert job_processes(names[0], job_id)
    started = time.monotonic()
    killed = subprocess.run([*ORCH, "kill", job_id], cwd=REPO, env=slurm_env(state, tmp_path),
                            capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert killed.returncode == 0, killed.stderr
    assert "cancelled" in killed.stderr
    assert time.monotonic() - started < 60
    _released(state)
    for node in names:
        assert job_processes(node, job_id) == []
    assert _status(state, tmp_path, job_id)["state"] == "killed"


def test_outside_an_allocation_slurm_is_refused_in_slurm_terms(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    env = slurm_env(state, tmp_path)
    done = subprocess.run([*ORCH, *_launch("torchrun")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "no Slurm allocation: SLURM_JOB_ID is not set" in done.stderr
    assert "salloc" in done.stderr


def test_a_head_killed_with_9_leaves_no_rank_running_on_any_node(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    log = tmp_path / "salloc.log"
    argv = ["salloc", "-N2", "--ntasks-per-node=2", *ORCH,
            *_launch("torchrun", "--steps", "2", "--sleep", "300")]  # fmt: skip
    with log.open("wb") as out:
        salloc = subprocess.Popen(argv, cwd=REPO, env=slurm_env(state, tmp_path), stdout=out,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        assert wait_for(lambda: len(job_ids(tmp_path)) == 1, 60)
        [job_id] = job_ids(tmp_path)
        names = job_json(tmp_path, job_id)["hosts"]
        assert wait_for(lambda: all_ranks_up(tmp_path, job_id, names), 120)
        head = job_json(tmp_path, job_id)["head_pid"]
        os.kill(head, signal.SIGKILL)  # orch only: salloc lives on, as a user's shell would
        # srun, TERMed by orch's watchdog, ends its step: every agent tears its job down.
        assert wait_for(lambda: all(job_processes(n, job_id) == [] for n in names), 60)
        salloc.wait(timeout=60)  # the allocation ends with its command
    finally:
        salloc.kill()
    # Slurm ends the allocation after its KillWait (30 s here) and its epilog: more on a
    # loaded machine.
    _released(state)


def test_doctor_inside_salloc_checks_the_allocations_nodes_over_ssh(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    result = _in_allocation(state, tmp_path, ["doctor", "--json"], nodes=2)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [node["node"] for node in report["nodes"]] == _names(state)[:2]


def test_an_allocation_smaller_than_asked_is_refused_before_anything_runs(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    args = ["launch", "--nodes", "3", "--launcher", "torchrun", ALLREDUCE]
    result = _in_allocation(state, tmp_path, args, nodes=2)
    assert result.returncode == 2
    assert "holds 2 node(s)" in result.stderr and "fewer than the 3 asked for" in result.stderr
    assert job_ids(tmp_path) == []


def test_one_task_per_node_runs_the_ranks_per_node_its_cpus_hold(slurm_sandbox, tmp_path):
    """The torchrun recipe: one task per node, torchrun starts the ranks. An explicit
    --nproc-per-node that the node's CPUs hold is honoured; one beyond them is refused."""
    _box, state = slurm_sandbox
    args = ["launch", "--slurm", "--launcher", "torchrun", "--nproc-per-node", "2",
            "--no-doctor", ALLREDUCE, "--", "--steps", "1"]  # fmt: skip
    result = _in_allocation(state, tmp_path, args, nodes=2,
                            shape=("--ntasks-per-node=1", "--cpus-per-task=2"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "torchrun on 2 nodes x 2 ranks" in result.stderr
    refused = _in_allocation(state, tmp_path / "refused", args, nodes=2, shape=())
    assert refused.returncode == 2, refused.stderr
    first = _names(state)[0]
    assert f"holds 1 CPU(s) on '{first}', fewer than the 2 ranks per node" in refused.stderr
    assert "--cpus-per-task=2" in refused.stderr
    assert job_ids(tmp_path / "refused") == []


def test_a_crash_under_srun_keeps_where_the_survivors_stood(slurm_sandbox, tmp_path):
    """The failed node's agent waits for the head before it exits: Slurm's kill-on-bad-exit
    would otherwise end the survivors before their stacks are taken."""
    _box, state = slurm_sandbox
    script = ["--max-seconds", "100", "--compute", "30", "--fail-rank", "3", "--fail-after", "0"]
    args = ["launch", "--slurm", "--launcher", "torchrun", "--no-doctor", STEPPING, "--", *script]
    result = _in_allocation(state, tmp_path, args)
    assert result.returncode == 7, result.stderr
    [job_id] = job_ids(tmp_path)
    record = job_json(tmp_path, job_id)
    assert record["node_exit_codes"] == dict.fromkeys(record["hosts"], 1)  # every node reported
    kept = json.loads((tmp_path / job_id / record["teardown_stacks"]).read_text())
    ranks = sorted(r for block in kept["stacks"]["blocks"] for r in block["ranks"])
    assert ranks == [0, 1]  # rank 3's node stopped its other rank when it failed
    functions = {f["function"] for b in kept["stacks"]["blocks"] for t in b["threads"]
                 for f in t["frames"]}  # fmt: skip
    assert "compute" in functions
    assert "every running rank's stack:" in result.stderr
    for node in record["hosts"]:
        assert job_processes(node, job_id) == [], f"job left running on {node}"
    _released(state)


def test_ranks_see_the_job_but_not_orchs_own_srun_step(slurm_sandbox, tmp_path):
    _box, state = slurm_sandbox
    script = tmp_path / "env_job.py"
    script.write_text(
        "import os\n"
        "get = os.environ.get\n"
        "print('env', get('RANK'), get('SLURM_JOB_ID'), get('SLURM_PROCID', '-'),"
        " get('SLURM_NTASKS', '-'), flush=True)\n"
    )
    runs = tmp_path / "runs"
    result = _in_allocation(state, runs, ["launch", "--launcher", "torchrun", "--no-doctor",
                                          str(script)])  # fmt: skip
    assert result.returncode == 0, result.stderr
    [job_id] = job_ids(runs)
    record = job_json(runs, job_id)
    slurm_job = record["slurm_job_id"]
    logs = "".join(log_text(runs, job_id, node) for node in record["hosts"])
    for rank in range(4):
        assert f" out env {rank} {slurm_job} - -\n" in logs
