"""The launch plan, built and checked as a value: no process, no network."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file

from orchestrator.errors import OrchError, UsageError
from orchestrator.plan.build import build_plan
from orchestrator.plan.describe import (
    command_files,
    plan_summary,
    plan_text,
    rendered_pdsh_config,
)
from orchestrator.plan.launch_plan import (
    HEAD_LAUNCHER_NAME,
    Destination,
    HeadContext,
    Placement,
    process_environment,
)
from orchestrator.plan.launchers.pdsh import PDSH_SPEC_NAME
from orchestrator.plan.launchers.standard import standard_spec_name
from orchestrator.plan.pdsh_command import NODE_LAUNCH_CODE, node_launcher_spec
from orchestrator.plan.request import LaunchSpec
from orchestrator.remote.agent_spec import AgentSpec, decode
from orchestrator.run.plan_files import head_private_dir, write_private_files
from orchestrator.specs.constants import HOSTFILE_NAME, PDSH_CONFIG_NAME, standard_config_name
from orchestrator.specs.inventory import make_hostfile
from orchestrator.specs.jobenv import JOB_ID_VAR

HOSTS = make_hostfile(["n1", "n2", "n3"], 2)


def _plan(launcher: str, *, head: HeadContext | None = None, environ: dict | None = None,
          run_dir: str = "/runs/job-1", main_port: int = 29511, extra_env: dict | None = None,
          **spec):  # fmt: skip
    values = dict(script="train.py", args=("--lr", "0.1", "two words"), launcher=launcher,
                  python="/opt/py/bin/python", workdir="/work/x",
                  env=tuple((extra_env or {}).items()))  # fmt: skip
    place = Placement(job_id="job-1", hostfile=HOSTS, run_dir=run_dir, main_port=main_port)
    head = head or HeadContext("pdsh", "/tmp/orch-job-1", sys.executable)
    environ = environ if environ is not None else {"NCCL_DEBUG": "INFO", "HOME": "/root"}
    return build_plan(LaunchSpec(**{**values, **spec}), place, replace(head, environ=environ))


def test_torchrun_plan_rendezvous_at_node0_with_the_job_id():
    plan = _plan("torchrun")
    cmd = plan.launch.node_command
    assert cmd[:3] == ("/opt/py/bin/python", "-m", "torch.distributed.run")
    assert "--nnodes=3" in cmd and "--nproc_per_node=2" in cmd
    assert "--rdzv_backend=c10d" in cmd
    assert "--rdzv_endpoint=n1:29511" in cmd and "--rdzv_id=job-1" in cmd
    assert cmd[-2:] == ("--no-python", "orch-rank")
    assert plan.job.rank_command == ("/opt/py/bin/python", "train.py", "--lr", "0.1", "two words")
    assert json.loads(plan.node_private)["rank_argv"] == list(plan.job.rank_command)
    assert plan.launch.head_command == ()
    assert plan.hosts == ("n1", "n2", "n3")


def test_job_env_carries_the_job_id_and_nccl_settings_not_the_rest():
    env = dict(_plan("torchrun", extra_env={"HF_TOKEN": "s3cret"}).job.env)
    assert env[JOB_ID_VAR] == "job-1"
    assert env["NCCL_DEBUG"] == "INFO"
    assert "HOME" not in env
    assert env["HF_TOKEN"] == "s3cret"


def test_pdsh_plan_runs_accelerate_on_the_head_with_its_files():
    plan = _plan("pdsh")
    assert plan.launch.head_command[:5] == (
        "/opt/py/bin/python", f"/runs/job-1/{HEAD_LAUNCHER_NAME}",
        f"/runs/job-1/{PDSH_SPEC_NAME}", "--config_file", f"/runs/job-1/{PDSH_CONFIG_NAME}",
    )  # fmt: skip
    assert plan.launch.head_command[-2:] == ("--no_python", "orch-rank")
    assert json.loads(plan.node_private)["rank_argv"][1:] == ["train.py", "--lr", "0.1",
                                                              "two words"]  # fmt: skip
    config = yaml.safe_load(rendered_pdsh_config(plan))
    assert config["num_machines"] == 3
    assert config["num_processes"] == 6
    assert config["deepspeed_config"]["deepspeed_multinode_launcher"] == "pdsh"
    assert config["deepspeed_config"]["deepspeed_hostfile"] == f"/runs/job-1/{HOSTFILE_NAME}"
    assert plan.file(HOSTFILE_NAME).content == "n1 slots=2\nn2 slots=2\nn3 slots=2\n"
    # The job's env reaches the nodes in node_private only, never in a spec or a file here.
    assert json.loads(plan.node_private)["env"][JOB_ID_VAR] == "job-1"
    assert plan.launch.agent_spec.env == ()


def test_pdsh_head_launcher_writes_the_config_the_dry_run_shows(tmp_path):
    plan = _plan("pdsh", run_dir=str(tmp_path))
    for planned in plan.files:
        if planned.run_dir:
            (tmp_path / planned.name).write_text(planned.content)
    launcher = plan.file(HEAD_LAUNCHER_NAME).content
    # It runs in the job's interpreter, where orch need not be installed.
    assert "import orchestrator" not in launcher and "from orchestrator" not in launcher
    namespace: dict = {"__name__": "head_launcher"}
    exec(compile(launcher, HEAD_LAUNCHER_NAME, "exec"), namespace)
    written = namespace["write_config"](str(tmp_path / PDSH_SPEC_NAME))
    assert written == str(tmp_path / PDSH_CONFIG_NAME)
    text = (tmp_path / PDSH_CONFIG_NAME).read_text()
    assert text == plan_summary(plan)["files"][PDSH_CONFIG_NAME]
    assert text.startswith("# accelerate config written by orch (pdsh launcher, 3 x 2)")
    loaded = load_config_from_file(written)
    assert loaded.num_machines == 3 and loaded.main_process_port == 29511
    assert loaded.deepspeed_config["deepspeed_hostfile"] == str(tmp_path / HOSTFILE_NAME)


@pytest.mark.process
def test_pdsh_head_launcher_without_arguments_prints_its_usage(tmp_path):
    path = tmp_path / HEAD_LAUNCHER_NAME
    path.write_text(_plan("pdsh").file(HEAD_LAUNCHER_NAME).content)
    done = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "usage: accelerate_head.py SPEC.json" in done.stderr


def test_standard_plan_ships_one_config_spec_per_machine_rank_and_the_program_that_writes_it(
    tmp_path,
):
    plan = _plan("standard")
    specs = [json.loads(plan.file(standard_spec_name(k)).content) for k in range(3)]
    assert [s["fields"]["machine_rank"] for s in specs] == [0, 1, 2]
    for spec in specs:
        spec["fields"].pop("machine_rank")
        assert spec["fields"] == specs[0]["fields"]
    assert all(plan.file(standard_spec_name(k)).ship for k in range(3))
    assert plan.file(HEAD_LAUNCHER_NAME).ship
    assert plan.launch.wait_for_main
    shell = plan.launch.node_command[2]
    assert '"$ORCH_NODE_DIR/accelerate-rank$ORCH_NODE_RANK.json"' in shell
    assert '--config_file "$ORCH_NODE_DIR/accelerate-rank$ORCH_NODE_RANK.yaml"' in shell
    assert shell.endswith("--no_python orch-rank")
    assert json.loads(plan.node_private)["rank_argv"][1:] == ["train.py", "--lr", "0.1",
                                                              "two words"]  # fmt: skip
    # What a node writes is what accelerate loads back, and what the dry run shows.
    for name in (HEAD_LAUNCHER_NAME, standard_spec_name(1)):
        (tmp_path / name).write_text(plan.file(name).content)
    namespace: dict = {"__name__": "head_launcher"}
    exec(compile(plan.file(HEAD_LAUNCHER_NAME).content, HEAD_LAUNCHER_NAME, "exec"), namespace)
    written = namespace["write_config"](str(tmp_path / standard_spec_name(1)))
    assert written == str(tmp_path / standard_config_name(1))
    loaded = load_config_from_file(written)
    assert loaded.machine_rank == 1 and loaded.num_machines == 3
    shown = plan_summary(plan)["files"][standard_config_name(1)]
    assert Path(written).read_text() == shown


def test_nproc_per_node_overrides_the_slots():
    plan = _plan("torchrun", nproc_per_node=1)
    assert "--nproc_per_node=1" in plan.launch.node_command
    assert plan_summary(plan)["world_size"] == 3


def test_dry_run_summary_redacts_secrets_everywhere():
    plan = _plan("pdsh", extra_env={"WANDB_API_KEY": "abcd1234"})
    text = str(plan_summary(plan))
    assert "abcd1234" not in text
    assert plan_summary(plan)["env"]["WANDB_API_KEY"] == "***"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"launcher": "mpirun"}, "unknown launcher"),
        ({"script": ""}, "no training script"),
        ({"main_port": 70000}, "out of range"),
    ],
)
def test_bad_options_are_usage_errors(change, message):
    with pytest.raises(UsageError, match=message):
        _plan(change.pop("launcher", "torchrun"), **change)


def test_plan_is_frozen():
    plan = _plan("torchrun")
    with pytest.raises(AttributeError):
        plan.job_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("launcher", ["pdsh", "standard", "torchrun"])
def test_every_launchers_agents_are_told_the_main_port_node_0_vouches_for(launcher):
    # Each launcher's rendezvous listens there on node 0: another's listener must not be it.
    assert _plan(launcher, main_port=29517).launch.agent_spec.main_port == 29517


# ----- the plan holds every command line ------------------------------------------------
HEAD = HeadContext(pdsh="/usr/bin/pdsh", private_dir="/tmp/orch-job-1", orch_python="/venv/py")


def _remote_spec(remote_command: str) -> AgentSpec:
    return decode(remote_command.split()[-3])  # ... run SPEC %h %n


@pytest.mark.parametrize("launcher", ["torchrun", "standard"])
def test_node_side_launchers_plan_the_exact_pdsh_argv_and_what_the_agent_runs(launcher):
    plan = _plan(launcher, head=HEAD)
    argv = plan.launch.head_process.argv
    assert argv[0] == "/usr/bin/pdsh" and argv[argv.index("-R") + 1] == "ssh"
    assert argv[argv.index("-w") + 1] == "n1,n2,n3"
    assert int(argv[argv.index("-f") + 1]) >= 3  # every node starts at once
    assert plan.launch.head_process.cwd == "/work/x"
    launch = plan.launch
    assert _remote_spec(argv[-1]) == launch.agent_spec
    assert launch.agent_spec.command == launch.node_command
    assert json.loads(plan.node_private)["env"] == dict(plan.job.env)
    assert launch.agent_spec.env == ()  # the job's env is in node_private only
    assert ("PDSH_RCMD_TYPE", "ssh") in plan.launch.head_process.set_env
    assert not any(f.where == Destination.PRIVATE for f in plan.files)


def test_pdsh_launcher_plans_the_head_process_its_environment_and_the_shim():
    plan = _plan("pdsh", head=HEAD, environ={"HOME": "/root", "AWS_SECRET_ACCESS_KEY": "x"})
    assert plan.launch.head_process.argv == plan.launch.head_command
    set_env = dict(plan.launch.head_process.set_env)
    # accelerate's copy of the head's environment goes nowhere: DeepSpeed exports no file.
    assert set_env["DS_ENV_FILE"] == "/dev/null"
    assert JOB_ID_VAR not in set_env
    assert plan.launch.head_process.drop_env == ("AWS_SECRET_ACCESS_KEY",)
    assert plan.launch.head_process.path_prepend == ("/tmp/orch-job-1/bin", "/opt/py/bin")
    shim = plan.file("bin/pdsh")
    assert shim.mode == 0o755 and shim.content.startswith("#!/venv/py\n")
    assert "/tmp/orch-job-1/bin/pdsh-shim.json" in shim.content
    config = json.loads(plan.file("bin/pdsh-shim.json").content)
    assert config["real_pdsh"] == "/usr/bin/pdsh"
    assert AgentSpec.from_dict(config["agent"]) == plan.launch.agent_spec


@pytest.mark.parametrize(
    ("python", "path_prepend"),
    [
        ("python3", ("/tmp/orch-job-1/bin",)),  # found on PATH: no "." before it
        ("venv/bin/python", ("/tmp/orch-job-1/bin", "/work/x/venv/bin")),
        ("./python", ("/tmp/orch-job-1/bin", "/work/x")),
    ],
)
def test_a_relative_interpreter_puts_no_relative_directory_on_the_head_launchers_path(
    python, path_prepend
):
    plan = _plan("pdsh", head=HEAD, python=python)
    assert plan.launch.head_process.path_prepend == path_prepend


def test_process_environment_drops_sets_and_puts_the_shim_first_on_path():
    plan = _plan("pdsh", head=HEAD, environ={"HF_TOKEN": "t", "PATH": "/usr/bin"})
    environ = {"HF_TOKEN": "t", "PATH": "/usr/bin", "LANG": "C"}
    env = process_environment(plan.launch.head_process, environ)
    assert "HF_TOKEN" not in env  # not forwarded by the job: never reaches accelerate
    assert env["LANG"] == "C"
    assert env["PATH"] == "/tmp/orch-job-1/bin:/opt/py/bin:/usr/bin"
    assert env["DS_ENV_FILE"] == "/dev/null"


def test_readable_dry_run_shows_pdsh_with_its_hosts_and_every_node_command():
    plan = _plan("torchrun", head=HEAD, extra_env={"HF_TOKEN": "hunter22"})
    text = plan_text(plan, "/dry/job-1")
    assert "hunter22" not in text
    # The head's pdsh line (the inline agent is tens of KiB) is written whole, to run as is.
    assert "  sh /dry/job-1/head.sh   (the command in full, " in text
    head, teardown = command_files(plan)
    assert (head.name, teardown.name) == ("head.sh", "teardown.sh")
    pdsh_line = head.text.splitlines()[-1]
    assert "-w n1,n2,n3" in pdsh_line and "PDSH_RCMD_TYPE=ssh" in pdsh_line
    assert "..." not in pdsh_line and "hunter22" not in head.text
    assert shlex.split(pdsh_line)[3:] == list(plan.launch.head_process.argv)
    for rank, node in enumerate(("n1", "n2", "n3")):
        line = next(line for line in text.splitlines() if line.startswith(f"  {node} "))
        assert f"(node rank {rank})" in line
        assert line.endswith("--no-python orch-rank")
    lines = text.splitlines()
    at = lines.index("and the launcher starts every rank through orch-rank, which runs exactly:")
    assert lines[at + 1] == "  " + shlex.join(plan.job.rank_command)
    # The JSON form's argv is the one that runs: no value of the job's env is in it at all.
    argv = plan_summary(plan)["head_process"]["argv"]
    assert argv == list(plan.launch.head_process.argv)
    assert _remote_spec(argv[-1]).env == () and "hunter22" not in json.dumps(argv)
    assert plan_summary(plan)["node_private"]["env"]["HF_TOKEN"] == "***"


def test_readable_dry_run_gives_each_standard_node_its_own_config():
    text = plan_text(_plan("standard", head=HEAD))
    for rank, node in enumerate(("n1", "n2", "n3")):
        # The node's uid is the node's own: the dry run names it as messages do.
        expected = f"/tmp/orch-<uid>/runs/job-1/{node}/{standard_config_name(rank)}"
        line = next(line for line in text.splitlines() if line.startswith(f"  {node} "))
        assert expected in line and "$ORCH" not in line


def test_private_files_are_written_only_for_their_owner_in_a_new_directory(tmp_path):
    private = tmp_path / "orch-1000" / "jobs" / "job-1"
    plan = _plan("pdsh", head=HeadContext("/usr/bin/pdsh", str(private), "/venv/py"))
    old = os.umask(0o002)
    try:
        write_private_files(plan)
    finally:
        os.umask(old)
    for level in (private.parent.parent, private.parent, private):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700
    assert stat.S_IMODE((private / "bin" / "pdsh-shim.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((private / "bin" / "pdsh").stat().st_mode) == 0o755
    with pytest.raises(OrchError, match="private directory"):
        write_private_files(plan)  # never into a directory that already exists


def test_the_heads_private_directory_is_in_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert head_private_dir("job-1") == f"{tmp_path}/orch-{os.getuid()}/jobs/job-1"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (tmp_path / f"orch-{os.getuid()}").symlink_to(theirs)  # claimed first, as a link
    plan = _plan("pdsh", head=HeadContext("/usr/bin/pdsh", head_private_dir("job-1"), "/py"))
    with pytest.raises(OrchError, match="symbolic link"):
        write_private_files(plan)
    assert list(theirs.iterdir()) == []


def test_the_heads_private_directory_goes_around_another_users(tmp_path, monkeypatch):
    from orchestrator.remote import owned

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "theirs").mkdir()
    (tmp_path / f"orch-{os.getuid()}").symlink_to(tmp_path / "theirs")
    monkeypatch.delenv(owned.RUNTIME_VAR, raising=False)
    with pytest.raises(OrchError) as refused:
        write_private_files(_plan("pdsh", head=HeadContext("pdsh", head_private_dir("j"), "/p")))
    assert "set TMPDIR to a directory of your own" in str(refused.value)
    runtime, linger = tmp_path / "run-user", tmp_path / "linger"
    runtime.mkdir(mode=0o700)
    linger.mkdir()
    (linger / pwd.getpwuid(os.getuid()).pw_name).touch()  # it outlives the user's sessions
    monkeypatch.setenv(owned.RUNTIME_VAR, str(runtime))
    monkeypatch.setattr(owned, "LINGER_DIR", str(linger))
    assert head_private_dir("job-1") == f"{runtime}/orch/jobs/job-1"
    write_private_files(_plan("pdsh", head=HeadContext("pdsh", head_private_dir("job-1"), "/p")))
    assert (runtime / "orch" / "jobs" / "job-1" / "bin" / "pdsh").is_file()
    assert list((tmp_path / "theirs").iterdir()) == []


def test_the_users_node_root_reaches_the_agent_and_the_dry_run():
    plan = _plan("standard", head=HEAD, environ={"ORCH_NODE_ROOT": "~/.orch-node"})
    assert plan.job.node_root == plan.launch.agent_spec.node_root == "~/.orch-node"
    argv = plan.launch.head_process.argv
    assert _remote_spec(argv[-1]).node_root == "~/.orch-node"  # what the nodes get
    assert "~/.orch-node/runs/job-1/n2/" in plan_text(plan)
    assert "node_root" not in _plan("standard", head=HEAD).launch.agent_spec.to_dict()


def test_the_shim_keeps_deepspeeds_launcher_words_and_drops_its_exports_of_the_head():
    words = [
        "export PATH=/usr/bin; export DATABASE_URL=postgres://u:pw@db; ",
        "cd /work;", "/opt/py/bin/python", "-u", "-m", "deepspeed.launcher.launch",
        "--world_info=e30=", "--node_rank=%n", "--master_addr=n1", "--master_port=29511",
        "--no_python", "--no_local_rank", "orch-rank",
    ]  # fmt: skip
    environ = {"ACCELERATE_MIXED_PRECISION": "no", "DATABASE_URL": "postgres://u:pw@db"}
    spec = node_launcher_spec(AgentSpec("j", workdir="/work"), words, environ)
    # The launcher as itself, its KILL wait given the stop's grace (NODE_LAUNCH_CODE).
    assert spec.command == ("/opt/py/bin/python", "-u", "-c", NODE_LAUNCH_CODE, *words[6:])
    assert spec.node_rank_word == "%n" and "--node_rank=2" in spec.node_argv("2")
    assert spec.env == (("ACCELERATE_MIXED_PRECISION", "no"),)
    assert spec.path_first == (("PYTHONPATH", "/work"),)
    assert "pw@db" not in json.dumps(spec.to_dict())


def test_nothing_under_plan_reads_the_heads_environment_itself():
    # The head's environment is passed in (prepare/job.py takes it), so a plan is a value
    # of its inputs alone.
    plan_dir = Path(__file__).resolve().parents[2] / "orchestrator" / "plan"
    readers = [p.name for p in plan_dir.rglob("*.py") if "os.environ" in p.read_text()]
    assert readers == []
