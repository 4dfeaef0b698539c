"""The fake node transport that tests hand to orch's node operations: on values."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.nodes.fake import NOT_SCRIPTED, FakeCall, FakeNode, FakeTransport, Reply
from orchestrator.nodes.srun import StepError
from orchestrator.nodes.transport import NodeTransport
from orchestrator.ssh import SSHError


def _cluster() -> FakeTransport:
    return FakeTransport([
        FakeNode("n1", {"hostname": Reply(stdout="n1\n"), "": Reply(1, stderr="no\n")}),
        FakeNode("n2", lambda call: Reply(stdout=call.stdin[::-1])),
        FakeNode("n3").refuse(),
    ])  # fmt: skip


def test_a_table_answers_by_the_first_key_the_command_holds_and_a_callable_by_the_call():
    fake: NodeTransport = _cluster()
    [n1, n2] = fake.run(["n1", "n2"], "hostname -s", stdin=b"abc")
    assert n1.value is not None and (n1.value.exit_code, n1.value.stdout) == (0, b"n1\n")
    assert n2.value is not None and n2.value.stdout == b"cba"
    [other] = fake.run(["n1"], "uptime")
    assert other.value is not None and (other.value.exit_code, other.value.stderr) == (1, b"no\n")
    [bare] = FakeTransport([FakeNode("n9")]).run(["n9"], "true")
    assert bare.value is not None and bare.value.exit_code == NOT_SCRIPTED


def test_every_command_is_recorded_in_order_answered_or_not():
    fake = _cluster()
    heard: list[str] = []
    results = fake.run(["n3", "n1", "n7"], lambda node: f"echo {node}",
                       on_result=lambda r: heard.append(r.node))  # fmt: skip
    assert heard == ["n3", "n1", "n7"] and results.nodes == ("n3", "n1", "n7")
    assert [(c.node, c.command, c.answered) for c in fake.calls] == [
        ("n3", "echo n3", False), ("n1", "echo n1", True), ("n7", "echo n7", False)]
    assert fake.commands("n1") == ["echo n1"]


@pytest.mark.parametrize(
    ("make_down", "kind", "said"),
    [
        (FakeNode.refuse, "refused", "n1: connection refused"),
        (FakeNode.unreachable, "unreachable", "n1: unreachable"),
        (FakeNode.time_out, "timeout", "n1: no answer within 5s"),
    ],
)
def test_a_node_that_is_down_fails_named_with_its_kind(make_down, kind, said):
    fake = FakeTransport([make_down(FakeNode("n1", {"": Reply()}))])
    [result] = fake.run(["n1"], "true", connect_timeout=5.0)
    assert (result.ok, result.kind, result.problem) == (False, kind, said)
    assert not fake.start("n1", "true", timeout=5.0).ok
    with pytest.raises(SSHError, match=said):
        fake.session("n1", timeout=5.0)
    with pytest.raises(StepError, match=said):  # standing for srun, it fails as srun's
        FakeTransport([make_down(FakeNode("n1"))], slurm_job="7").session("n1", timeout=5.0)


def test_an_unknown_node_does_not_resolve_and_a_hanging_reply_times_out():
    fake = FakeTransport([FakeNode("n1", {"sleep": Reply(hangs=True)})])
    [unknown, hung] = fake.run(["nx", "n1"], "sleep 99", timeout=3.0)
    assert (unknown.kind, unknown.problem) == ("resolve", "nx: no such host")
    assert (hung.kind, hung.problem) == ("timeout", "n1: command did not finish within 3s")


def test_a_timed_shell_says_its_start_up_over_ssh_only():
    node = FakeNode("n1", {"": Reply()})
    [ssh] = FakeTransport([node]).run(["n1"], "true", time_shell=True)
    [srun] = FakeTransport([node], slurm_job="7").run(["n1"], "true", time_shell=True)
    assert ssh.value is not None and ssh.value.shell is not None
    assert srun.value is not None and srun.value.shell is None


def test_a_session_runs_commands_and_copies_the_nodes_files(tmp_path: Path):
    seen: list[FakeCall] = []

    def answer(call: FakeCall) -> Reply:
        seen.append(call)
        return Reply(stdout="\n".join(sorted(call.files)))

    fake = FakeTransport([FakeNode("n1", answer, files={"/r/a.log": b"alpha"})])
    with fake.session("n1", timeout=5.0) as session:
        session.download("/r/a.log", tmp_path / "a.log", 5.0)
        (tmp_path / "b.log").write_bytes(b"beta")
        session.upload(tmp_path / "b.log", "/r/b.log")
        listing = session.run("ls /r", 5.0)
        with pytest.raises(OSError, match="n1: cat: /r/none: No such file"):
            session.download("/r/none", tmp_path / "none", 5.0)
    assert (tmp_path / "a.log").read_bytes() == b"alpha"
    assert listing.stdout == b"/r/a.log\n/r/b.log" and seen[0].how == "session"
    assert fake.node("n1").files["/r/b.log"] == b"beta" and fake.opened == ["n1"]


def test_a_started_command_is_read_line_by_line_and_keeps_what_it_was_sent():
    fake = FakeTransport([FakeNode("n1", {"serve": Reply(3, "one\ntwo\nrest\n", "err\n")})])
    started = fake.start("n1", "serve", timeout=5.0).value
    assert started is not None
    assert [started.read_line(1.0), started.read_line(1.0)] == [b"one\n", b"two\n"]
    started.send(b"done\n")
    result = started.wait(5.0)
    assert result.value is not None
    assert (result.value.exit_code, result.value.stdout, result.value.stderr) == (
        3, b"rest\n", b"err\n")  # fmt: skip
    assert started.read_line(1.0) is None and fake.started[0].sent == b"done\n"
    started.close()
    with pytest.raises(OSError):
        started.send(b"more")


def test_it_stands_for_ssh_or_for_srun_in_an_allocation():
    assert FakeTransport().kind == "ssh" and FakeTransport(slurm_job="7").kind == "slurm"
    assert FakeTransport().by_hand("n1", "'ls'") == "ssh n1 'ls'"
    assert FakeTransport(slurm_job="7").by_hand("n1", "'ls'").startswith("srun --jobid=7 ")
