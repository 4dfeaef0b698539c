"""Raw node logs pulled back over SFTP from real sandbox nodes, verified, cleaned up; and
the same over fake nodes, in process. The sandbox tests are marked so by their fixtures."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.nodes.fake import FakeCall, FakeNode, FakeTransport, Reply
from orchestrator.remote.agent_spec import node_dir, node_dir_shown, runs_root
from orchestrator.run.collect import collect_logs, collect_node
from orchestrator.ssh import run_on_nodes


def new_job_id() -> str:
    return f"logtest-{uuid.uuid4().hex[:10]}"


def write_on_node(node: str, job_id: str, files: dict[str, bytes]) -> None:
    """Write the files on the node itself (through ssh), the way the agent would."""
    directory = node_dir(job_id, node, os.getuid())
    for name, data in files.items():
        command = f"mkdir -p {directory} && base64 -d > {directory}/{name}"
        outcome = run_on_nodes([node], command, timeout=30, stdin=base64.b64encode(data))[node]
        assert outcome.value is not None and outcome.value.exit_code == 0, outcome


@pytest.fixture
def job_ids():
    made: list[str] = []

    def make() -> str:
        made.append(new_job_id())
        return made[-1]

    yield make
    for job in made:
        shutil.rmtree(f"{runs_root(os.getuid())}/{job}", ignore_errors=True)


def test_raw_logs_come_back_byte_for_byte_and_remote_copy_is_removed(
    sandbox, tmp_path: Path, job_ids
) -> None:
    _, state = sandbox
    nodes = [n.name for n in state.nodes[:3]]
    job = job_ids()
    expected: dict[str, dict[str, bytes]] = {}
    for index, node in enumerate(nodes):
        files = {
            "stdout.raw": os.urandom(200_000 + index) + b"\r\x00\xff no newline",
            "stderr.raw": b"".join(b"\rstep %d" % i for i in range(5000)) + b"\n",
            "rank3.stderr.raw": b"",  # a rank that wrote nothing there: made, not fetched
        }
        write_on_node(node, job, files)
        expected[node] = files

    report = collect_logs(nodes, job, tmp_path / "nodes")

    assert report.ok, report.failed
    for result, node in zip(report, nodes, strict=True):
        pulled = result.value
        assert result.node == node and pulled is not None and pulled.remote_removed
        assert sorted(f.name for f in pulled.files) == [
            "rank3.stderr.raw", "stderr.raw", "stdout.raw",
        ]  # fmt: skip
        for name, data in expected[node].items():
            assert (tmp_path / "nodes" / node / name).read_bytes() == data
        assert not list((tmp_path / "nodes" / node).glob("*.partial"))
        assert not Path(node_dir(job, node, os.getuid())).exists()
    assert not Path(f"{runs_root(os.getuid())}/{job}").exists()


def test_keep_remote_leaves_the_node_copy(sandbox, tmp_path: Path, job_ids) -> None:
    node = sandbox[1].nodes[0].name
    job = job_ids()
    write_on_node(node, job, {"stdout.raw": b"hello\n"})
    result = collect_node(node, job, tmp_path, keep_remote=True)
    assert result.value is not None and not result.value.remote_removed
    assert (tmp_path / node / "stdout.raw").read_bytes() == b"hello\n"
    assert Path(node_dir(job, node, os.getuid()), "stdout.raw").read_bytes() == b"hello\n"


def test_node_without_logs_is_reported(sandbox, tmp_path: Path, job_ids) -> None:
    node = sandbox[1].nodes[1].name
    result = collect_node(node, job_ids(), tmp_path)
    assert not result.ok
    assert "no raw logs" in result.problem and node in result.problem


def test_file_still_growing_is_not_verified_and_stays_on_the_node(
    sandbox, tmp_path: Path, job_ids
) -> None:
    node = sandbox[1].nodes[2].name
    job = job_ids()
    write_on_node(node, job, {"stdout.raw": b"start\n"})
    # A shared filesystem, as on a cluster.
    target = Path(node_dir(job, node, os.getuid()), "stdout.raw")
    stop = threading.Event()

    def keep_writing() -> None:
        with target.open("ab") as handle:
            while not stop.is_set():
                handle.write(b"more output\n")
                handle.flush()
                time.sleep(0.002)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        result = collect_node(node, job, tmp_path)
    finally:
        stop.set()
        writer.join()
    assert not result.ok
    assert "did not arrive whole" in result.problem
    assert "fetch it by hand: ssh " in result.hint and "| tar -xf -" in result.hint
    assert target.exists()


def test_dead_node_is_named_and_others_still_collected(sandbox_factory, tmp_path: Path) -> None:
    box, state = sandbox_factory(2, 1)
    alive, frozen = state.nodes[0].name, state.nodes[1].name
    job = new_job_id()
    try:
        for node in (alive, frozen):
            write_on_node(node, job, {"stdout.raw": b"line from " + node.encode() + b"\n"})
        box.freeze(frozen)
        started = time.monotonic()
        try:
            report = collect_logs([frozen, alive], job, tmp_path, connect_timeout=3)
        finally:
            box.thaw(frozen)
        assert time.monotonic() - started < 3 + 30  # no hang: the connect timeout holds
        dead, good = report
        assert good.ok and (tmp_path / alive / "stdout.raw").read_bytes().startswith(b"line")
        assert not dead.ok and dead.node == frozen
        assert frozen in dead.problem
        assert node_dir_shown(job, frozen) in dead.hint
        assert Path(node_dir(job, frozen, os.getuid()), "stdout.raw").exists()
    finally:
        shutil.rmtree(f"{runs_root(os.getuid())}/{job}", ignore_errors=True)


# ----- over fake nodes: what is asked of each node, and one bad node hides no other --------
def _on_node(job: str, node: str) -> str:
    return node_dir(job, node, 1000)


def _node_side(job: str, lie: bool = False):
    """A node's answers to collect's listing and removal, from its files (the listing of a
    node that `lie`s names a hash its file does not have)."""

    def answer(call: FakeCall) -> Reply:
        where = _on_node(job, call.node)
        mine = {p.rsplit("/", 1)[1]: p for p in call.files if p.startswith(where + "/")}
        if "sha256sum" in call.command:
            if not mine:
                return Reply(3)
            lines = [f"dir {where}"] + [
                f"{len(call.files[p])} {hashlib.sha256(call.files[p] + b'x' * lie).hexdigest()}"
                f"  {name}" for name, p in sorted(mine.items())]  # fmt: skip
            return Reply(stdout="\n".join(lines) + "\n")
        if call.command.startswith("rm -rf"):
            for path in mine.values():
                del call.files[path]
            return Reply()
        return Reply(127)

    return answer


def _with_logs(name: str, job: str, files: dict[str, bytes], lie: bool = False) -> FakeNode:
    where = _on_node(job, name)
    return FakeNode(name, _node_side(job, lie), files={f"{where}/{n}": d for n, d in files.items()})


def test_raw_logs_come_back_verified_and_only_then_leave_the_node(tmp_path: Path) -> None:
    logs = {"stdout.raw": b"step 1\r\x00\xff", "rank1.stderr.raw": b""}
    fake = FakeTransport([_with_logs("n1", "job-1", logs)])
    result = collect_node("n1", "job-1", tmp_path, transport=fake)
    assert result.value is not None and result.value.remote_removed
    assert [(f.name, f.size) for f in result.value.files] == [("rank1.stderr.raw", 0),
                                                             ("stdout.raw", 9)]  # fmt: skip
    assert {p.name: p.read_bytes() for p in (tmp_path / "n1").iterdir()} == logs
    listed, again, removed = fake.commands("n1")  # listed, listed again once copied, removed
    assert "sha256sum" in listed and listed == again
    assert removed.startswith(f"rm -rf -- {_on_node('job-1', 'n1')} ")
    assert fake.node("n1").files == {}


def test_one_bad_node_never_hides_the_others(tmp_path: Path) -> None:
    fake = FakeTransport([
        _with_logs("n1", "job-1", {"stdout.raw": b"n1\n"}, lie=True),
        _with_logs("n2", "job-1", {"stdout.raw": b"n2\n"}).refuse(),
        _with_logs("n3", "job-1", {}),
        _with_logs("n4", "job-1", {"stdout.raw": b"n4\n"}),
    ])  # fmt: skip
    lied, refused, empty, good = collect_logs(["n1", "n2", "n3", "n4"], "job-1", tmp_path,
                                              transport=fake)  # fmt: skip
    assert good.ok and (tmp_path / "n4" / "stdout.raw").read_bytes() == b"n4\n"
    assert lied.problem is not None and "n1: raw logs did not arrive whole" in lied.problem
    assert "fetch it by hand: ssh n1 " in (lied.hint or "") and fake.node("n1").files
    assert (refused.problem, refused.kind) == ("n2: connection refused", "refused")
    assert node_dir_shown("job-1", "n2") in (refused.hint or "") and fake.commands("n2") == []
    assert empty.problem == f"n3: no raw logs at {node_dir_shown('job-1', 'n3')}"


def test_through_slurm_a_node_whose_step_fails_keeps_its_logs_and_says_how_to_fetch(
    tmp_path: Path,
) -> None:
    fake = FakeTransport([_with_logs("n1", "job-1", {"stdout.raw": b"x"}, lie=True),
                          FakeNode("n2").unreachable()], slurm_job="7")  # fmt: skip
    lied, gone = collect_logs(["n1", "n2"], "job-1", tmp_path, transport=fake)
    assert "srun --jobid=7 --overlap -N1 -n1 -w n1 sh -c " in (lied.hint or "")
    assert (gone.problem, gone.kind) == ("n2: unreachable", "unreachable")
    assert node_dir_shown("job-1", "n2") in (gone.hint or "")
