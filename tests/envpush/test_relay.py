"""`orch env push`'s chain as the head runs it, over fake nodes: what each node is told on its
stdin (each link's secrets to its two ends alone), and a node that refuses its swap because
a job started from the environment since the look."""

from __future__ import annotations

import io
import itertools
import json
import tarfile
from pathlib import Path

from _envpush_stream import environment

from orchestrator.envpush.push import EnvSource, push_environment
from orchestrator.envpush.relay import Stream, relay_round, write_stream
from orchestrator.nodes.fake import FakeNode, FakeStarted, FakeTransport, Reply
from orchestrator.probe.facts import Environment
from orchestrator.remote.envpush_manifest import STREAM_CACHES, manifest, unpack

HEAD = Environment("f" * 16, "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu", "debian 12",
                   "glibc 2.36", "x86_64", {})  # fmt: skip
SEEN = {"interpreter": {"version": "3.11.7", "abi": "cpython-311-x86_64-linux-gnu"},
        "platform": {"libc": "glibc 2.36", "machine": "x86_64"}, "free_bytes": 10 << 30,
        "running": [], "manifest": None}  # fmt: skip
DONE = {"ok": True, "received": 1, "received_bytes": 2, "relayed_bytes": 1 << 30}


def _receiving(port: int, answer: dict) -> Reply:
    """A node's receive step: ready (with its port), then its answer after the stream."""
    return Reply(stdout=json.dumps({"ready": True, "port": port}) + "\n" + json.dumps(answer))


def _told(started: FakeStarted) -> tuple[dict, dict]:
    """The request and the route a node was sent on its stdin (the stream follows)."""
    request, route = started.sent.split(b"\n", 2)[:2]
    return json.loads(request), json.loads(route)


def _words(doc: object) -> set[str]:
    """Every string in a JSON document."""
    if isinstance(doc, dict):
        return set().union(*map(_words, doc.values())) if doc else set()
    if isinstance(doc, list):
        return set().union(*map(_words, doc)) if doc else set()
    return {doc} if isinstance(doc, str) else set()


def test_each_link_has_secrets_of_its_own_told_to_its_two_ends_alone(tmp_path: Path) -> None:
    """A node whose receive ended early lets another user take its port: what the node
    before tells them, or what a node hears on its own links, must not feed any other
    node. Each link's two secrets go to its two nodes (sender and receiver) and no other;
    none is in the request every node gets alike."""
    root = environment(tmp_path / "env", {"a.py": "a\n"})
    names = ["n1", "n2", "n3", "n4"]
    fake = FakeTransport([FakeNode(n, {"receive": _receiving(7000 + i, DONE)})
                          for i, n in enumerate(names)])  # fmt: skip
    stream = Stream(str(root), manifest(str(root)), ("a.py",))
    results, again, _ = relay_round(names, stream, "receive", transport=fake, timeout=5.0,
                                    on_bytes=None)  # fmt: skip
    assert all(r.ok for r in results) and again == []
    told = {s.node: _told(s) for s in fake.started}
    for node in names:  # what every node is sent alike holds no secret
        assert set(told[node][0]) == {"root", "manifest_sha256", "listen", "force", "node_root"}
    for before, after in itertools.pairwise(names):
        forward = told[before][1]["forward"]
        assert (forward["host"], forward["port"]) == (after, 7000 + names.index(after))
        assert forward["hop"] == told[after][1]["hop"]  # both ends of the link, alike
        assert set(forward["hop"]) == {"sender", "receiver"}
    links = [told[n][1]["forward"]["hop"] for n in names[:-1]]  # n1 -> n2, n2 -> n3, ...
    assert len(_words(links)) == 2 * len(links)  # no secret serves two links
    for i, node in enumerate(names):
        own = [links[j] for j in (i - 1, i) if 0 <= j < len(links)]
        secrets = _words(told[node][1]) - set(names) - {"stdin", "tcp"}
        assert secrets == _words(own), node  # its own links' secrets, nothing more
        assert not _words(told[node][0]) & _words(links)  # the request carries none


def test_a_node_that_refuses_its_swap_is_refused_with_why_and_the_fix(tmp_path, monkeypatch):
    """A job started from the environment after the look: the node keeps the environment
    it had and says so; the head reports the node refused, in the node's words, with the
    fix, and does not send it again."""
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = environment(tmp_path / "train", {"a.py": "a\n"})
    source = EnvSource(str(root), "venv", f"{root}/bin/python", "/usr/bin/python3.11")
    refused = {"ok": False, "refused": True, "running": [[4242, "j-1"]],
               "error": f"orch job j-1 (pids 4242) started from {root} since the push looked",
               "fix": "wait for the job to end (or `orch kill j-1`) and push again"}  # fmt: skip
    fake = FakeTransport([
        FakeNode("n1", {" look ": Reply(stdout=json.dumps(SEEN)),
                        " receive": _receiving(0, refused)}),
    ])  # fmt: skip
    report = push_environment(["n1"], source, HEAD, transport=fake)
    [node] = report.nodes
    assert (node.ok, node.kind) == (False, "refused")
    assert node.problem == f"n1: orch job j-1 (pids 4242) started from {root} since the push looked"
    assert node.hint == "wait for the job to end (or `orch kill j-1`) and push again"
    assert len(fake.started) == 1  # not sent again
    assert json.loads(fake.started[0].sent.split(b"\n", 1)[0])["force"] is False


def test_a_cache_rewritten_after_it_was_listed_is_left_out_of_a_stream_still_whole(
    tmp_path: Path,
) -> None:
    """The stream lists the head's bytecode with its hashes before the files go; a cache
    written meanwhile (a process on the head compiling) is not sent, and every member after
    it still reads whole."""
    head = environment(tmp_path / "head", {
        "a.py": "a\n", "b.py": "b\n", "__pycache__/a.cpython-311.pyc": "old a",
        "__pycache__/b.cpython-311.pyc": "b bytecode",
    })  # fmt: skip
    stream = Stream(str(head), manifest(str(head)), ("a.py", "b.py"))
    listed = unpack(stream.manifest_bytes().decode())[STREAM_CACHES][2]
    assert sorted(listed) == ["__pycache__/a.cpython-311.pyc", "__pycache__/b.cpython-311.pyc"]
    (head / "__pycache__/a.cpython-311.pyc").write_text("new a, longer than it was")
    out = io.BytesIO()
    write_stream(stream, stream.manifest_bytes(), out)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r|") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    assert members["__pycache__/b.cpython-311.pyc"] == b"b bytecode"
    assert "__pycache__/a.cpython-311.pyc" not in members
    assert members["a.py"] == b"a\n" and members["b.py"] == b"b\n"
