"""`orch env push`'s chain as the head runs it, over fake nodes: what each node is told on its
stdin (each link's secrets to its two ends alone)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from _envpush_stream import environment

from orchestrator.envpush.relay import Stream, relay_round
from orchestrator.nodes.fake import FakeNode, FakeStarted, FakeTransport, Reply
from orchestrator.remote.envpush_manifest import manifest

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
        assert set(told[node][0]) == {"root", "manifest_sha256", "listen"}
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
