"""Slurm's side of orch on values: the allocation as an inventory, srun's command line, the
agent under srun, the batch script, a batch job's shown state, failures in Slurm's words,
and the sandbox's slurm.conf."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.checks.model import Finding
from orchestrator.checks.slurm import ssh_inside_allocation
from orchestrator.errors import UsageError
from orchestrator.outcome.events import NodeExited, WatchSettings
from orchestrator.outcome.slurm_words import in_slurm_words
from orchestrator.outcome.states import Failure
from orchestrator.outcome.verdict import JobVerdict
from orchestrator.plan.agent_command import agent_argv
from orchestrator.plan.build import build_plan
from orchestrator.plan.launch_plan import HeadContext, Placement
from orchestrator.plan.request import (
    HostsRequest,
    JobRequest,
    LaunchOverrides,
    LaunchSpec,
    RecoveryRequest,
    SbatchRequest,
    WatchRequest,
    recipe_spec,
)
from orchestrator.plan.sbatch_script import (
    batch_request,
    render_batch_script,
    request_batch,
    submit_argv,
)
from orchestrator.plan.srun_command import build_srun_argv
from orchestrator.records.job import JobRecord, batch_state
from orchestrator.remote.agent import slurm_node_and_rank, without_step_variables
from orchestrator.remote.agent_spec import AgentSpec, decode
from orchestrator.sandbox.slurm import SlurmNode, render_conf
from orchestrator.specs.inventory import job_nodes, make_hostfile, read_hostfile
from orchestrator.specs.slurm import (
    Allocation,
    allocation_from_env,
    allocation_hostfile,
    chosen_fanout,
    expand_counts,
    job_inventory,
)

ALLOC_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[07-08],gpu10",
    "SLURM_TASKS_PER_NODE": "8(x2),4",
}


@pytest.mark.parametrize(
    ("text", "counts"),
    [("2(x3)", (2, 2, 2)), ("8(x2),4", (8, 8, 4)), ("1", (1,)), ("", ()), ("3,2(x1)", (3, 2))],
)
def test_per_node_counts_expand_as_slurm_writes_them(text, counts):
    assert expand_counts(text) == counts


def test_a_count_slurm_never_writes_is_refused_naming_it():
    with pytest.raises(UsageError, match=r"'2\(y3\)'"):
        expand_counts("2(y3)")


def test_the_allocation_gives_nodes_in_order_and_tasks_as_slots():
    allocation = allocation_from_env(ALLOC_ENV)
    assert allocation == Allocation("4242", ("gpu07", "gpu08", "gpu10"), (8, 8, 4), None)
    hostfile = allocation_hostfile(allocation)
    assert [(h.host, h.slots) for h in hostfile.hosts] == [("gpu07", 8), ("gpu08", 8),
                                                            ("gpu10", 4)]  # fmt: skip
    assert hostfile.source == "Slurm job 4242"


def test_gpus_on_node_win_over_tasks():
    env = {**ALLOC_ENV, "SLURM_GPUS_ON_NODE": "4"}
    assert allocation_from_env(env).slots == (4, 4, 4)


def test_outside_an_allocation_there_is_none():
    assert allocation_from_env({"HOME": "/root"}) is None


def test_an_allocation_smaller_than_asked_is_refused_in_slurm_terms():
    allocation = allocation_from_env({**ALLOC_ENV, "SLURM_GPUS_ON_NODE": "4"})
    with pytest.raises(UsageError) as nodes:
        allocation_hostfile(allocation, nodes=4)
    assert "Slurm job 4242 holds 3 node(s) (gpu07, gpu08, gpu10), fewer than the 4" in str(
        nodes.value
    )
    assert "salloc -N 4" in nodes.value.hint
    with pytest.raises(UsageError) as gpus:
        allocation_hostfile(allocation, nproc_per_node=8)
    assert "holds 4 GPU(s) per node, fewer than the 8 ranks per node" in str(gpus.value)


def test_a_hostfile_wins_unless_slurm_is_asked_for(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("a slots=1\n")
    given = read_hostfile(path)
    assert job_inventory(given, slurm=False, environ=ALLOC_ENV) == (given, None)
    hosts, allocation = job_inventory(given, slurm=True, environ=ALLOC_ENV)
    assert hosts.names == ("gpu07", "gpu08", "gpu10") and allocation.job_id == "4242"
    hosts, _ = job_inventory(None, slurm=False, environ=ALLOC_ENV)  # inside one: implied
    assert hosts.names == ("gpu07", "gpu08", "gpu10")


def test_no_allocation_and_no_hostfile_say_which_is_missing():
    with pytest.raises(UsageError, match="no Slurm allocation: SLURM_JOB_ID is not set") as err:
        job_inventory(None, slurm=True, environ={})
    assert "salloc" in err.value.hint and "--sbatch" in err.value.hint
    with pytest.raises(UsageError, match="no hostfile given"):
        job_inventory(None, slurm=False, environ={})


def test_srun_is_the_fanout_inside_an_allocation_for_launchers_orch_starts():
    assert chosen_fanout(None, "torchrun", True) == "srun"
    assert chosen_fanout(None, "standard", True) == "srun"
    assert chosen_fanout(None, "pdsh", True) == "pdsh"
    assert chosen_fanout(None, "torchrun", False) == "pdsh"
    assert chosen_fanout("pdsh", "torchrun", True) == "pdsh"


def test_srun_argv_gives_every_count_and_exports_only_the_login_basics():
    environ = {"PATH": "/bin", "HOME": "/h", "TOKEN": "s"}
    argv = build_srun_argv(["gpu07", "gpu08", "gpu10"], ["py", "-c", "x"], slurm_job="4242",
                           job_id="j1", environ=environ)  # fmt: skip
    assert argv == [
        "srun", "--jobid=4242", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1",
        "--nodelist=gpu[07-08,10]", "--kill-on-bad-exit=1", "--input=none",
        "--job-name=orch-j1", "--export=PATH,HOME", "--", "py", "-c", "x",
    ]  # fmt: skip


def _srun_plan(launcher: str = "torchrun", **kw):
    spec = LaunchSpec(script="train.py", args=("--note", "it's $HOME"), launcher=launcher,
                      python="/opt/py/bin/python", workdir="/work/x",
                      env=(("WANDB_API_KEY", "k"),))  # fmt: skip
    place = dict(job_id="job-1", hostfile=make_hostfile(["n1", "n2"], 2), run_dir="/runs/job-1",
                 main_port=29511, fanout="srun", slurm_job="77")  # fmt: skip
    head = HeadContext("pdsh", "/tmp/orch-job-1", sys.executable,
                       environ={"PATH": "/bin", "HF_TOKEN": "hf_secret"})  # fmt: skip
    return build_plan(spec, Placement(**{**place, **kw}), head)


def test_an_srun_plan_starts_the_agent_in_one_step_with_nothing_the_user_typed():
    plan = _srun_plan()
    argv = plan.launch.head_process.argv
    assert argv[0] == "srun" and "--jobid=77" in argv and "--nodelist=n[1-2]" in argv
    assert plan.job.fanout == "srun" and plan.job.slurm_job == "77"
    dash = argv.index("--")
    assert argv[dash + 1 : dash + 3] == ("/opt/py/bin/python", "-c")
    assert argv[-4] == "run" and argv[-2:] == ("-", "-")
    spec = decode(argv[-3])
    assert spec.hosts == ("n1", "n2") and spec.label_lines is True
    text = " ".join(argv)
    for typed in ("it's $HOME", "hf_secret", "WANDB_API_KEY", "=k"):
        assert typed not in text
    assert plan.launch.head_process.set_env == ()  # pdsh's settings are not srun's


def test_srun_needs_an_allocation_and_a_launcher_whose_nodes_orch_starts():
    with pytest.raises(UsageError, match="runs inside a Slurm allocation, and there is none"):
        _srun_plan(slurm_job="")
    with pytest.raises(UsageError, match="pdsh launcher's nodes are started by DeepSpeed"):
        _srun_plan(launcher="pdsh")
    with pytest.raises(UsageError, match="unknown fan-out 'mpirun'"):
        _srun_plan(fanout="mpirun")


def test_the_agent_under_srun_takes_its_name_from_slurm_and_its_rank_from_the_plan(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    monkeypatch.setenv("SLURM_NODEID", "0")  # Slurm's order is not the plan's
    spec = AgentSpec("j", hosts=("n1", "n2"))
    assert slurm_node_and_rank(spec, "-", "-") == ("n2", "1")
    assert slurm_node_and_rank(spec, "n1", "0") == ("n1", "0")


@pytest.mark.process
def test_the_agent_labels_every_line_with_its_node_under_srun():
    code = (
        "from orchestrator.remote.channel import Channel\n"
        "c = Channel(b'n2: ')\nc.send(b'one\\ntwo\\n')\nc.send(b'three\\n')\nc.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30,
                         check=True).stdout  # fmt: skip
    assert out == b"n2: one\nn2: two\nn2: three\n"


def test_agent_argv_needs_no_shell():
    argv = agent_argv("/opt/py/bin/python", AgentSpec("j"))
    assert argv[0] == "/opt/py/bin/python" and argv[1] == "-c" and argv[3] == "run"
    assert decode(argv[4]) == AgentSpec("j")


def test_the_batch_script_asks_for_the_allocation_and_runs_orch_in_it():
    request = batch_request(
        job_id="j1", name="orch-smoke", nodes=4, ntasks_per_node=None, gpus_per_node=8,
        workdir="/work/x y", output="/runs/j1/sbatch.out", time="1:00:00", partition="gpu",
        command=["/opt/py/bin/python", "-m", "orchestrator", "submit", "/r/a b.yaml"],
    )  # fmt: skip
    text = render_batch_script(request)
    assert text.startswith("#!/bin/sh\n")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --time=1:00:00", "#SBATCH --partition=gpu",
                 "#SBATCH --chdir=/work/x y", "#SBATCH --output=/runs/j1/sbatch.out"):  # fmt: skip
        assert line + "\n" in text
    assert text.endswith("exec /opt/py/bin/python -m orchestrator submit '/r/a b.yaml'\n")
    assert "--account" not in text


def _sbatch_request(**kw) -> JobRequest:
    from orchestrator.specs.recipe import parse_recipe

    recipe = parse_recipe("name: smoke\nscript: t.py\nnproc_per_node: 2\n"
                          "slurm: {nodes: 2, time: '5', account: acc}\n")  # fmt: skip
    base = dict(spec=recipe_spec(recipe, "r.yaml"), recipe=recipe, sbatch=SbatchRequest(),
                hosts=HostsRequest(nodes=recipe.slurm.nodes))  # fmt: skip
    return JobRequest(**{**base, **kw})


def test_the_batch_script_runs_the_same_request_passing_on_only_what_was_given():
    plain = _sbatch_request()
    argv = submit_argv(plain, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert argv == ("/py", "-m", "orchestrator", "submit", "/r.yaml", "--slurm", "--job-id", "j1",
                    "--runs-dir", "/runs", "--nodes", "2")  # fmt: skip
    # --nodes on the head asks for an allocation of that size, and the job inside runs on it.
    fewer = _sbatch_request(hosts=HostsRequest(nodes=1))
    assert submit_argv(fewer, python="/py", recipe="/r.yaml", job_id="j1",
                       runs_dir="/runs")[-2:] == ("--nodes", "1")  # fmt: skip
    watch = WatchRequest(preflight=False, sync=True, heartbeat_timeout=20.0, hang_timeout=30.0)
    recovery = RecoveryRequest(max_restarts=2, restart_on="any", min_nodes=1)
    given = _sbatch_request(watch=watch, main_port=29600, fanout="pdsh", extra_args=("a", "b"),
                            recovery=recovery)  # fmt: skip
    argv = submit_argv(given, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert argv[12:] == ("--no-doctor", "--sync", "--heartbeat-timeout", "20.0",
                         "--hang-timeout", "30.0", "--main-port", "29600", "--fanout", "pdsh",
                         "--max-restarts", "2", "--restart-on", "any", "--min-nodes", "1",
                         "--", "a", "b")  # fmt: skip
    pushing = _sbatch_request(watch=WatchRequest(push_env=True))
    assert submit_argv(pushing, python="/py", recipe="/r.yaml", job_id="j1",
                       runs_dir="/runs")[12:] == ("--push-env",)  # fmt: skip
    batch = request_batch(_sbatch_request(sbatch=SbatchRequest(partition="p")), job_id="j1",
                          cwd="/w", output="/o", command=argv)  # fmt: skip
    assert (batch.name, batch.nodes, batch.ntasks_per_node, batch.workdir) == (
        "orch-smoke", 2, 2, "/w")  # fmt: skip
    assert (batch.time, batch.partition, batch.account) == ("5", "p", "acc")
    assert "--no-kill" not in render_batch_script(batch)
    restarting = request_batch(_sbatch_request(recovery=RecoveryRequest(max_restarts=1)),
                               job_id="j1", cwd="/w", output="/o", command=argv)  # fmt: skip
    assert "#SBATCH --no-kill\n" in render_batch_script(restarting)  # a node's loss keeps it
    # Slurm warns orch (the batch shell) the ranks' grace and a margin before the end.
    assert "#SBATCH --signal=B:USR1@180\n" in render_batch_script(batch)  # 120 s grace + 60


def test_the_batch_job_runs_with_launchs_options_given_over_the_recipe():
    from orchestrator.specs.recipe import parse_recipe

    recipe = parse_recipe("name: smoke\nscript: t.py\nnproc_per_node: 2\nworkdir: /w\n"
                          "slurm: {nodes: 2}\n")  # fmt: skip
    given = LaunchOverrides(launcher="torchrun", nproc_per_node=4, python="/py3",
                            workdir="/srv", env=("HF_TOKEN",))  # fmt: skip
    spec = recipe_spec(recipe, "r.yaml", overrides=given, environ={"HF_TOKEN": "x"})
    request = _sbatch_request(spec=spec, overrides=given)
    argv = submit_argv(request, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert argv[12:] == ("--launcher", "torchrun", "--nproc-per-node", "4", "--python", "/py3",
                         "--workdir", "/srv", "--env", "HF_TOKEN")  # fmt: skip
    batch = request_batch(request, job_id="j1", cwd="/here", output="/o", command=argv)
    assert (batch.ntasks_per_node, batch.workdir) == (4, "/srv")  # the given ones, not the recipe's
    valued = _sbatch_request(overrides=LaunchOverrides(env=("HF_TOKEN=hf_secret",)))
    with pytest.raises(UsageError, match="would write the value into the batch script") as err:
        submit_argv(valued, python="/py", recipe="/r.yaml", job_id="j1", runs_dir="/runs")
    assert "hf_secret" not in str(err.value) + (err.value.hint or "")


def test_env_given_over_a_recipe_wins_whether_set_or_forwarded():
    from orchestrator.specs.recipe import parse_recipe

    recipe = parse_recipe("name: r\nscript: t.py\nenv: {A: '1', B: '2'}\n"
                          "passthrough_env: [C, D]\n")  # fmt: skip
    given = LaunchOverrides(env=("A", "C=3", "E=5"))
    spec = recipe_spec(recipe, "r.yaml", overrides=given, environ={"A": "head"})
    assert dict(spec.env) == {"B": "2", "C": "3", "E": "5"}
    assert spec.passthrough == ("D", "A")
    assert recipe_spec(recipe, "r.yaml").passthrough == ("C", "D")  # nothing given: the recipe's


def test_a_batch_job_needs_a_node_count():
    with pytest.raises(UsageError, match="--sbatch needs a node count") as err:
        batch_request(job_id="j", name="n", nodes=None, ntasks_per_node=2, gpus_per_node=None,
                      workdir="/", output="/o", command=["orch"])  # fmt: skip
    assert "slurm: {nodes: N}" in err.value.hint


def _record(state: str) -> JobRecord:
    return JobRecord(id="j", state=state, launcher="torchrun", command=(), hosts=(),
                     workdir="/", started_at="", head_pid=0, head_start=None,
                     slurm_job_id="9", slurm_batch=True)  # fmt: skip


@pytest.mark.parametrize(
    ("recorded", "slurm_state", "shown"),
    [
        ("queued", "PENDING", "queued"),
        ("queued", "RUNNING", "starting"),  # orch inside has not written its record yet
        ("running", "RUNNING", "running"),
        ("queued", "CANCELLED", "slurm-cancelled"),
        ("queued", None, "slurm-gone"),
        ("running", "COMPLETED", "head-died"),
    ],
)
def test_a_batch_jobs_state_is_the_records_while_slurm_runs_it(recorded, slurm_state, shown):
    assert batch_state(_record(recorded), slurm_state) == shown


def test_srun_refusing_the_step_is_the_failure_when_no_node_answered():
    lost = Failure("n1", "ended without reporting an exit code", 1, kind="lost")
    lines = ("srun: error: Only allocated 2 nodes asked for 3",)
    told = in_slurm_words(lost, lines, heard_any=False, node_problems={})
    assert (told.node, told.kind) == ("", "head")
    assert told.reason == "srun refused the step: Only allocated 2 nodes asked for 3"
    assert in_slurm_words(lost, lines, heard_any=True, node_problems={}) == lost


def test_a_node_slurm_took_down_is_named_but_a_drain_leaves_a_ranks_own_exit():
    rank = Failure("n1", "exited with code 7", 7, rank=3)
    down = in_slurm_words(rank, (), True, {"n2": "down (reason: ECC errors)"})
    assert (down.node, down.kind, down.rank) == ("n2", "lost", None)
    assert down.reason == "Slurm took n2 out: down (reason: ECC errors)"
    assert in_slurm_words(rank, (), True, {"n2": "drained (reason: maint)"}) == rank


def test_a_launcher_killed_by_a_signal_gives_the_shells_exit_code():
    verdict = JobVerdict(("n1", "n2"), WatchSettings(), head_launcher=False)
    verdict.feed(NodeExited("n1", {"code": -15}, 1.0, 1.0))
    [failure] = verdict.candidates
    assert failure.exit_code == 143 and failure.reason == "killed by SIGTERM"


def test_the_sandbox_slurm_conf_gives_each_slurmd_its_port_and_paths(tmp_path: Path):
    nodes = [SlurmNode("node1", "127.1.2.1", 16818), SlurmNode("node2", "127.1.2.2", 16819)]
    conf = render_conf(tmp_path, "head", 16817, nodes, cpus=2)
    assert "SlurmctldHost=head(127.0.0.1)\nSlurmctldPort=16817\n" in conf
    assert "NodeName=node2 NodeAddr=127.1.2.2 Port=16819 CPUs=2 State=UNKNOWN\n" in conf
    assert f"SlurmdSpoolDir={tmp_path}/%n/spool\n" in conf
    assert f"AuthInfo=socket={tmp_path}/munge/munge.sock\n" in conf
    assert "ProctrackType=proctrack/linuxproc\n" in conf


def test_inside_an_allocation_the_job_takes_its_first_nodes_or_refuses_more():
    pool, _ = job_inventory(None, slurm=True, environ=ALLOC_ENV, nodes=2)
    assert pool.names == ("gpu07", "gpu08", "gpu10")  # the third is the job's spare
    assert job_nodes(pool, 2, None).names == ("gpu07", "gpu08")
    with pytest.raises(UsageError, match="holds 3 node"):
        job_inventory(None, slurm=True, environ=ALLOC_ENV, nodes=5)


def test_doctor_inside_an_allocation_says_what_ssh_is_still_needed_for():
    ssh = Finding("gpu08", "ssh", "authentication failed", "add your key")
    disk = Finding("gpu08", "disk", "2 GiB free", "free some", severity="warning")
    told = ssh_inside_allocation((ssh, disk), "4242")
    assert told[1] == disk
    assert told[0].fix.startswith("add your key; inside Slurm job 4242, srun reaches this node")
    assert "pam_slurm_adopt" in told[0].fix


def test_sbatch_refuses_options_that_name_nodes_itself(tmp_path, orch_here):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=1\n")
    recipe = Path(__file__).resolve().parents[2] / "recipes" / "cpu-smoke-slurm.yaml"
    done = orch_here(["submit", str(recipe), "--sbatch", "--dry-run", "--hostfile",
                      str(hostfile), "--exclude", "a"], tmp_path / "runs")  # fmt: skip
    assert done.returncode == 2
    assert "--sbatch runs on the nodes Slurm allocates: --hostfile, --exclude cannot apply" in (
        done.stderr
    )
    assert done.stdout == ""


def test_ranks_do_not_inherit_what_srun_says_of_orchs_own_step():
    environ = {
        "PATH": "/bin", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURMD_NODENAME": "n2", "SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
        "SLURM_CPU_BIND_TYPE": "none", "SLURM_SRUN_COMM_PORT": "4100",
    }  # fmt: skip
    assert without_step_variables(environ) == {
        "PATH": "/bin", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURMD_NODENAME": "n2",
    }  # fmt: skip


ONE_TASK_PER_NODE = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "hnode[1-2]",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
}


def test_ranks_per_node_that_fit_the_cpus_of_a_one_task_allocation_are_honoured():
    allocation = allocation_from_env(ONE_TASK_PER_NODE)
    assert allocation.cpus_per_node == (4, 4)
    hostfile = allocation_hostfile(allocation, nproc_per_node=2)
    assert [(h.host, h.slots) for h in hostfile.hosts] == [("hnode1", 2), ("hnode2", 2)]
    # Without a count asked for, the tasks stay the ranks, as before.
    assert [h.slots for h in allocation_hostfile(allocation).hosts] == [1, 1]


def test_ranks_per_node_beyond_a_nodes_cpus_are_refused_naming_node_and_fix():
    env = {**ONE_TASK_PER_NODE, "SLURM_JOB_CPUS_PER_NODE": "4,1"}
    with pytest.raises(UsageError) as err:
        allocation_hostfile(allocation_from_env(env), nproc_per_node=2)
    assert "Slurm job 77 holds 1 CPU(s) on 'hnode2', fewer than the 2 ranks per node" in str(
        err.value
    )
    assert "--cpus-per-task=2" in err.value.hint


def test_the_cpus_on_this_node_stand_for_every_node_when_the_list_is_missing():
    env = {**ONE_TASK_PER_NODE, "SLURM_CPUS_ON_NODE": "8"}
    del env["SLURM_JOB_CPUS_PER_NODE"]
    assert allocation_from_env(env).cpus_per_node == (8, 8)
    assert "SLURM_CPUS_ON_NODE" not in ALLOC_ENV
    assert allocation_from_env(ALLOC_ENV).cpus_per_node == ()


def test_gpus_still_bound_the_ranks_whatever_the_cpus():
    env = {**ONE_TASK_PER_NODE, "SLURM_GPUS_ON_NODE": "2"}
    assert [h.slots for h in allocation_hostfile(allocation_from_env(env), nproc_per_node=2)
            .hosts] == [2, 2]  # fmt: skip
    with pytest.raises(UsageError, match="holds 2 GPU"):
        allocation_hostfile(allocation_from_env(env), nproc_per_node=4)
