"""Which way orch reaches the nodes (SSH or Slurm), and a node command as a srun step: on
values."""

from __future__ import annotations

import pytest

from orchestrator.errors import UsageError
from orchestrator.nodes.srun import _started, commands_stderr, split_tasks
from orchestrator.nodes.transport import (
    NodeTransport,
    SrunTransport,
    SshTransport,
    choose_transport,
    reaching,
)
from orchestrator.pernode import failed, succeeded
from orchestrator.plan.srun_command import STEP_EXIT, STEP_STARTED, node_step_argv
from orchestrator.records.job import JobRecord

pytestmark = pytest.mark.fast


def test_a_node_command_is_its_own_step_beside_the_job_and_one_argv_element():
    command = "python3 -c 'print(1)' ; echo $HOME"
    argv = node_step_argv(["gpu07"], command, slurm_job="4242",
                          environ={"PATH": "/usr/bin", "SECRET": "x"})  # fmt: skip
    assert argv[:7] == ["srun", "--jobid=4242", "--overlap", "--nodes=1", "--ntasks=1",
                        "--ntasks-per-node=1", "--nodelist=gpu07"]  # fmt: skip
    assert "--export=PATH" in argv  # nothing else of the head's environment
    assert argv[-1] == command  # the head's shell never parses it
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["/bin/sh", "-c"]


def test_a_step_that_never_started_fails_the_node_in_slurms_words():
    said = b"srun: error: Unable to create step for job 7: Requested node configuration\n"
    result = _started("gpu07", 1, b"", said)
    assert not result.ok and result.kind == "unreachable"
    assert "gpu07: Slurm could not run a step there: srun: error: Unable to create step" in (
        result.problem or ""
    )


def test_a_started_step_gives_the_commands_own_output_and_code():
    stderr = f"{STEP_STARTED}\nTraceback: boom\n".encode()
    result = _started("gpu07", 3, b"out\n", stderr)
    assert result.ok and result.value is not None
    assert (result.value.exit_code, result.value.stdout) == (3, b"out\n")
    assert result.value.stderr == b"Traceback: boom\n"


def _never(node: str):
    raise AssertionError(f"SSH to {node} was tried")


def test_outside_an_allocation_it_is_ssh_and_slurm_is_refused():
    assert choose_transport(None, slurm_job="", first_node="a", say=print,
                            ssh_check=_never).kind == "ssh"  # fmt: skip
    with pytest.raises(UsageError, match="inside a Slurm allocation only"):
        choose_transport("slurm", slurm_job="", first_node="a", say=print)
    with pytest.raises(UsageError, match="not one of ssh, slurm"):
        choose_transport("rsh", slurm_job="1", first_node="a", say=print)


def test_asked_for_it_is_what_was_asked_without_trying_ssh():
    got = choose_transport("slurm", slurm_job="9", first_node="a", say=print, ssh_check=_never)
    assert got == SrunTransport(slurm_job="9")
    assert choose_transport("ssh", slurm_job="9", first_node="a", say=print,
                            ssh_check=_never).kind == "ssh"  # fmt: skip


@pytest.mark.parametrize("kind", ["auth", "refused", "resolve", "hostkey-unknown"])
def test_a_first_node_that_refuses_ssh_sends_everything_through_slurm_said_once(kind):
    said: list[str] = []
    refused = lambda node: failed(node, f"{node}: no", None, kind)  # noqa: E731
    got = choose_transport(None, slurm_job="9", first_node="gpu07", say=said.append,
                           ssh_check=refused)  # fmt: skip
    assert got.kind == "slurm" and got == SrunTransport("9")
    assert said == ["SSH to gpu07 is refused (gpu07: no): every node operation goes through "
                    "Slurm job 9 (srun)"]  # fmt: skip


@pytest.mark.parametrize("kind", ["timeout", "hostkey-changed", "other"])
def test_a_slow_node_or_a_changed_host_key_is_not_taken_for_a_refusal(kind):
    said: list[str] = []
    got = choose_transport(None, slurm_job="9", first_node="gpu07", say=said.append,
                           ssh_check=lambda node: failed(node, "x", None, kind))  # fmt: skip
    assert got.kind == "ssh" and said == []


def test_ssh_that_works_stays_ssh():
    got = choose_transport(None, slurm_job="9", first_node="a", say=print,
                           ssh_check=lambda node: succeeded(node, None))  # fmt: skip
    assert got.kind == "ssh"


def _record(**fields: str) -> JobRecord:
    return JobRecord.from_json({"id": "j", "state": "running", **fields})


def _reaching(record: JobRecord) -> NodeTransport:
    return reaching(record.transport, record.slurm_job_id)


def test_a_jobs_record_says_how_its_nodes_are_reached():
    assert _reaching(_record(transport="slurm", slurm_job_id="5")) == SrunTransport("5")
    assert _reaching(_record(slurm_job_id="5")).kind == "ssh"  # records from before
    assert _reaching(_record(transport="slurm")).kind == "ssh"  # no allocation: no srun
    assert _reaching(_record(transport="ssh", slurm_job_id="5")) == SshTransport()


def test_each_transport_says_its_kind_and_how_a_user_reaches_a_node_by_hand():
    ways: list[NodeTransport] = [SshTransport(), SrunTransport("42")]
    assert [way.kind for way in ways] == ["ssh", "slurm"]
    assert [way.by_hand("n1", "'true'") for way in ways] == [
        "ssh n1 'true'", "srun --jobid=42 --overlap -N1 -n1 -w n1 sh -c 'true'"]
    asked = choose_transport("ssh", slurm_job="", first_node="a", say=print,
                             accept_new_host_keys=True)  # fmt: skip
    assert asked == SshTransport(accept_new_host_keys=True)


def test_srun_and_slurmstepd_lines_about_the_step_are_not_the_commands():
    stderr = (f"{STEP_STARTED}\n".encode() + b"pyenv: cannot rehash\n"
              b"slurmstepd-node1: error: *** STEP 1.2 ON node1 CANCELLED AT 2026-11-25 ***\n"
              b"srun: error: node1: task 0: Exited with exit code 137\n"
              b"srun: error: the user's own line\n")  # fmt: skip
    assert commands_stderr(stderr) == b"pyenv: cannot rehash\nsrun: error: the user's own line\n"


def test_one_step_for_many_nodes_labels_each_task_and_names_its_node():
    argv = node_step_argv(["gpu07", "gpu08", "gpu10"], "probe", slurm_job="4242",
                           environ={"PATH": "/usr/bin"})  # fmt: skip
    assert "--nodes=3" in argv and "--ntasks-per-node=1" in argv and "--label" in argv
    assert "--nodelist=gpu[07-08,10]" in argv and argv[-1] == "probe"


def test_a_labelled_steps_output_is_each_nodes_own_with_its_code():
    def od(text: bytes) -> str:  # as `od -An -v -tx1` writes bytes
        return " " + " ".join(f"{byte:02x}" for byte in text)

    first, second, third = b'{"node": 1}', b"line of b" + bytes([10]), b"\nmore of a\n"
    stdout = f"0: {od(first)}\n1: {od(second)}\n 0: {od(third)}\n".encode()
    stderr = (f"0: {STEP_STARTED} gpu08\n1: {STEP_STARTED} gpu07\n1: warn\n".encode()
              + f"0: {STEP_EXIT} 0\nsrun: error: gpu07: task 1: Exited with exit code 2\n"
              f"1: {STEP_EXIT} 2\n".encode())  # fmt: skip
    tasks = split_tasks(stdout, stderr)
    assert tasks["gpu08"].stdout == b'{"node": 1}\nmore of a\n' and tasks["gpu08"].exit_code == 0
    assert (tasks["gpu07"].stdout, tasks["gpu07"].stderr, tasks["gpu07"].exit_code) == (
        b"line of b\n", b"warn\n", 2)


def test_a_task_that_never_said_its_end_did_not_finish():
    tasks = split_tasks(b"0: 70 61\n", f"0: {STEP_STARTED} gpu07\n".encode())
    assert tasks["gpu07"].exit_code == -1
    assert split_tasks(b"", b"srun: error: Unable to create step\n") == {}
