"""`orch env push` on values, on local directories and over fake nodes: the delta, the
refusals, the head's manifest, and what is decided of each node after its look (the node
side's build-and-swap and relay are tested in tests/remote/)."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import pytest
from _envpush_stream import environment

from orchestrator.envpush.push import (
    EnvSource,
    NodePush,
    delta,
    environment_source,
    push_environment,
    refusal,
)
from orchestrator.errors import UsageError
from orchestrator.nodes.fake import FakeCall, FakeNode, FakeTransport, Reply
from orchestrator.probe.facts import Environment
from orchestrator.remote import envpush as envpush_node
from orchestrator.remote import envpush_manifest
from orchestrator.remote.owned import owner_name

HEAD = Environment("f" * 16, "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu", "debian 12",
                   "glibc 2.36", "x86_64", {})  # fmt: skip
SOURCE = EnvSource("/opt/envs/train", "venv", "/opt/envs/train/bin/python", "/usr/bin/python3.11")
SEEN = {"interpreter": {"version": "3.11.7", "abi": "cpython-311-x86_64-linux-gnu"},
        "platform": {"libc": "glibc 2.36", "machine": "x86_64"}, "free_bytes": 10 << 30,
        "running": []}  # fmt: skip


def test_delta_sends_what_differs_and_removes_what_the_head_has_not() -> None:
    head = {"bin": ["d", 0, "", 0o755], "bin/python": ["l", 0, "python3.11", 0],
            "a.py": ["f", 10, "aa", 0o644], "b.py": ["f", 20, "bb", 0o644]}  # fmt: skip
    node = {"bin/python": ["l", 0, "python3.11", 0], "a.py": ["f", 10, "aa", 0o644],
            "b.py": ["f", 20, "old", 0o644], "stale.py": ["f", 5, "ss", 0o644]}  # fmt: skip
    change = delta(head, node)
    assert dict(change.send) == {"b.py": ["f", 20, "bb", 0o644]}
    assert change.remove == ("stale.py",) and dict(change.dirs) == {"bin": 0o755}
    assert change.send_bytes == 20
    assert delta(head, head).send == {} and delta(head, head).remove == ()


@pytest.mark.parametrize(
    ("seen", "needs", "text"),
    [
        ({**SEEN, "interpreter": {"version": "3.11.2"}}, 0, "is Python 3.11.2, the head's"),
        ({**SEEN, "platform": {"libc": "musl 1.2", "machine": "x86_64"}}, 0, "binary wheels"),
        ({**SEEN, "running": [[4242, None]]}, 0, "processes (pids 4242) run from /opt/envs/train"),
        ({**SEEN, "running": [[4242, "j-20261125-1"], [4243, "j-20261125-1"]]}, 0,
         "orch job j-20261125-1 (pids 4242, 4243) run from"),
        ({**SEEN, "mount_point": True, "real_root": "/opt/envs/train"}, 0,
         "/opt/envs/train is a mount point"),
        (SEEN, 11 << 30, "11.0 GiB to receive, 10.0 GiB free"),
    ],
)
def test_a_node_that_cannot_take_the_environment_is_refused(seen, needs, text) -> None:
    found = refusal("n2", SOURCE, HEAD, seen, needs, force=False)
    assert found is not None and text in found[0] and found[0].startswith("n2: ")
    assert refusal("n2", SOURCE, HEAD, SEEN, 0, force=False) is None


def test_only_an_environment_is_pushed(tmp_path: Path) -> None:
    venv = tmp_path / "train"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    source = environment_source(str(venv / "bin" / "python"))
    assert source.kind == "venv" and source.root == str(venv)
    assert source.runner == "/usr/bin/" + Path("/usr/bin/python3").resolve().name
    with pytest.raises(UsageError, match="not in a virtual or conda environment"):
        environment_source("/usr/bin/python3")


def test_the_heads_manifest_reads_only_files_changed_since_the_last_push(tmp_path, monkeypatch):
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "env"
    root.mkdir()
    weights = root / "weights.bin"
    weights.write_bytes(b"a" * 100)
    first = envpush.head_manifest(str(root))["weights.bin"][2]
    stamp = weights.stat().st_mtime_ns
    weights.write_bytes(b"b" * 100)  # same size, and the mtime put back: taken as unchanged
    os.utime(weights, ns=(stamp, stamp))
    assert envpush.head_manifest(str(root))["weights.bin"][2] == first
    weights.write_bytes(b"b" * 101)
    assert envpush.head_manifest(str(root))["weights.bin"][2] != first



def test_an_environment_made_at_another_path_is_refused_naming_it(tmp_path: Path) -> None:
    """A venv copied or moved from where it was made: its scripts name the old path's
    interpreter, which the nodes would not have once it is pushed to the new one."""
    made, moved = tmp_path / "made", tmp_path / "moved"
    for root in (made, moved):
        (root / "bin").mkdir(parents=True)
        (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (root / "bin" / "python").symlink_to("/usr/bin/python3")
        (root / "bin" / "torchrun").write_text(f"#!{made}/bin/python\nimport sys\n")
        (root / "bin" / "helper").write_text("#!/usr/bin/env python3\n")  # names no path
    assert environment_source(str(made / "bin" / "python")).root == str(made)
    with pytest.raises(UsageError) as refused:
        environment_source(str(moved / "bin" / "python"))
    assert f"{moved} was made at another path" in str(refused.value)
    assert f"bin/torchrun) run {made}/bin/python" in str(refused.value)
    assert f"--python {made}/bin/python" in (refused.value.hint or "")


def test_manifests_of_environments_not_pushed_for_a_month_are_forgotten(tmp_path, monkeypatch):
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = environment(tmp_path / "env", {"a.py": "a\n"})
    envpush.head_manifest(str(root))
    kept = tmp_path / "tmp" / f"orch-{os.getuid()}" / "env-manifests"
    [own] = list(kept.iterdir())
    old, recent = kept / "old", kept / "recent"
    for path in (old, recent, own):
        path.touch()
    month_ago = time.time() - envpush.MANIFEST_KEPT_S - 60
    for path in (old, own):  # the environment pushed now keeps its own, however old
        os.utime(path, (month_ago, month_ago))
    envpush.head_manifest(str(root))
    assert sorted(p.name for p in kept.iterdir()) == sorted([own.name, "recent"])


# ----- the look and what is decided of each node, over fake nodes ---------------------------
def _looked_at(seen: dict) -> dict[str, Reply]:
    """A node whose look answers `seen` (its manifest packed as a node packs it)."""
    return {" look ": Reply(stdout=json.dumps(seen))}


def _sharing(call: FakeCall) -> Reply:
    """A node that sees the head's own directory: the node side's look, run here."""
    return Reply(stdout=json.dumps(envpush_node.look(json.loads(shlex.split(call.command)[-1]))))


def _push_cluster(root: Path) -> FakeTransport:
    has_it = {**SEEN, "manifest": envpush_manifest.pack(envpush_manifest.manifest(str(root)))}
    return FakeTransport([
        FakeNode("n1", _sharing),
        FakeNode("n2", _looked_at(has_it)),
        FakeNode("n3", _looked_at({**SEEN, "manifest": None})),
        FakeNode("n4", _looked_at({**SEEN, "interpreter": {"version": "3.11.2"}})),
        FakeNode("n5", {"": Reply(3, stderr="orch-no-interpreter /usr/bin/python3.11\n")}),
        FakeNode("n6").unreachable(),
    ])  # fmt: skip


@pytest.fixture
def pushed_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EnvSource:
    from orchestrator.envpush import push as envpush

    monkeypatch.setattr(envpush.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    root = environment(tmp_path / "train", {"a.py": "a\n", "pkg/b.py": "bb\n"})
    return EnvSource(str(root), "venv", f"{root}/bin/python", "/usr/bin/python3.11")


def test_each_node_is_looked_at_once_and_what_it_needs_is_decided(pushed_root) -> None:
    fake = _push_cluster(Path(pushed_root.root))
    heard: list[str] = []
    report = push_environment([f"n{i}" for i in range(1, 7)], pushed_root, HEAD,
                              transport=fake, dry_run=True,
                              on_node=lambda r: heard.append(r.node))  # fmt: skip
    shared, has_it, lacks, older, bare, gone = report.nodes
    assert shared.value == NodePush("n1", shared=True, dry_run=True)
    assert has_it.value == NodePush("n2", dry_run=True)
    assert lacks.value == NodePush("n3", sent_files=2, sent_bytes=5, dry_run=True)
    assert (older.kind, bare.kind) == ("refused", "refused")
    assert (older.problem or "").startswith("n4: the base interpreter /usr/bin/python3.11 is "
                                             "Python 3.11.2")  # fmt: skip
    assert bare.problem == ("n5: the base interpreter /usr/bin/python3.11 that the environment "
                            "points to is not on n5")  # fmt: skip
    assert (gone.kind, gone.problem) == ("unreachable", "n6: unreachable")
    assert sorted(heard) == [f"n{i}" for i in range(1, 7)]
    assert [len(fake.commands(f"n{i}")) for i in range(1, 7)] == [1] * 6
    assert all(" look " in c.command for c in fake.calls) and fake.started == []
    # the shared-filesystem check leaves no marker behind
    assert not list(Path(pushed_root.root).glob(f"{envpush_manifest.MARKER_PREFIX}*"))


def test_nodes_that_need_nothing_are_sent_nothing(pushed_root) -> None:
    fake = _push_cluster(Path(pushed_root.root))
    sends: list[int] = []
    report = push_environment(["n1", "n2", "n4"], pushed_root, HEAD, transport=fake,
                              on_send=sends.append)  # fmt: skip
    shared, has_it, older = report.nodes
    assert shared.value == NodePush("n1", shared=True)
    assert has_it.value == NodePush("n2", fingerprint=HEAD.fingerprint)
    assert not older.ok and report.head_sent_bytes == 0
    assert fake.started == [] and sends == [] and len(fake.calls) == 3


def test_a_node_whose_root_others_can_write_is_refused_in_its_own_words(
    pushed_root, tmp_path: Path
) -> None:
    theirs = environment(tmp_path / "n2" / "train", {"a.py": "a\n"})
    os.chmod(theirs, 0o775)  # made under umask 002, another of the group may plant in it
    seen = envpush_node.look({"root": str(theirs), "marker": ".orch-push-marker-x"})
    fake = FakeTransport([FakeNode("n2", _looked_at({**SEEN, **seen, "running": []}))])
    (refused,) = push_environment(["n2"], pushed_root, HEAD, transport=fake).nodes
    assert refused.kind == "refused" and fake.started == []
    assert refused.problem == (f"n2: {theirs} (owner {owner_name(os.getuid())}, mode 0775) is "
                               "writable by others")  # fmt: skip
    assert refused.hint == f"chmod go-w -- {theirs}, and run again"
