"""A node's scan of the checkpoint directory, read: a good answer becomes values, and a
malformed or unsafe one (a path that leaves its entry above all) is refused naming the node
and the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from _checkpoint_scans import COPIES_DIR, PATH, copy_doc, dir_entry, pointer, scan_doc, sha
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.checkpoints.model import (
    CopyHeld,
    EntrySeen,
    FileCopy,
    FileSeen,
    NodeScan,
    part_size,
    signature,
)

NODE4_SHARD = "zero_pp_rank_3_mp_rank_00_optim_states.pt"
SHARDS = {"zero_pp_rank_0_mp_rank_00_optim_states.pt": 700, "mp_rank_00_model_states.pt": 300}


def _good() -> dict[str, Any]:
    return scan_doc(
        "node1",
        dir_entry("global_step20", SHARDS, mtime=5),
        pointer("global_step20"),
        copies=(copy_doc("global_step20", "node4", {NODE4_SHARD: 700}),),
    )


def test_a_good_scan_reads_into_values():
    read = NodeScan.from_dict(_good())

    assert (read.node, read.dir, read.copies_dir) == ("node1", PATH, COPIES_DIR)
    assert read.lists_everything
    assert read.entry("global_step20") == EntrySeen(
        "global_step20",
        "dir",
        (
            FileSeen("global_step20/zero_pp_rank_0_mp_rank_00_optim_states.pt", 700, 5),
            FileSeen("global_step20/mp_rank_00_model_states.pt", 300, 5),
        ),
        {},
    )
    assert read.entry("latest").text == {"latest": "global_step20"}
    path = "global_step20/zero_pp_rank_3_mp_rank_00_optim_states.pt"
    assert read.copy_of("global_step20", "node4") == CopyHeld(
        "global_step20", "node4", (FileCopy(path, 700, sha(f"{path}:700")),)
    )
    assert read.copy_of("global_step20", "node2") is None


def test_a_truncated_or_unreadable_listing_is_not_the_whole_directory():
    assert not NodeScan.from_dict({**_good(), "truncated": True}).lists_everything
    assert not NodeScan.from_dict({**_good(), "problem": "permission denied"}).lists_everything


def _broken(change: str) -> dict[str, Any]:
    doc = copy.deepcopy(_good())
    entry, files = doc["entries"][0], doc["entries"][0]["files"]
    held = doc["copies"][0]
    edits = {
        "no entries": lambda: doc.pop("entries"),
        "size as text": lambda: files[0].update(size="700"),
        "size as a boolean": lambda: files[0].update(size=True),
        "negative size": lambda: files[0].update(size=-1),
        "dot-dot path": lambda: files[0].update(path="global_step20/../../etc/passwd"),
        "absolute path": lambda: files[0].update(path="/etc/passwd"),
        "path of another entry": lambda: files[0].update(path="global_step10/x.pt"),
        "empty part in a path": lambda: files[0].update(path="global_step20//x.pt"),
        "slash in an entry name": lambda: entry.update(name="a/b"),
        "dot-dot entry": lambda: entry.update(name=".."),
        "unknown kind": lambda: entry.update(kind="link"),
        "file entry naming another file": lambda: doc["entries"][1]["files"][0].update(
            path="latest/x"),
        "text outside its entry": lambda: entry.update(text={"../latest": "x"}),
        "short sha256": lambda: held["files"][0].update(sha256="abc"),
        "copy path outside its entry": lambda: held["files"][0].update(path="other/x.pt"),
        "same entry twice": lambda: doc["entries"].append(copy.deepcopy(entry)),
        "same file twice": lambda: files.append(dict(files[0])),
        "entries not a list": lambda: doc.update(entries={"a": 1}),
        "flag as text": lambda: doc.update(truncated="no"),
    }
    edits[change]()
    return doc


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("no entries", "entries is missing"),
        ("size as text", "entries[0].files[0].size is a string, not a whole number"),
        ("size as a boolean", "entries[0].files[0].size is a boolean, not a whole number"),
        ("negative size", "entries[0].files[0].size is -1, below 0"),
        ("dot-dot path", "'global_step20/../../etc/passwd' is not a plain relative path"),
        ("absolute path", "'/etc/passwd' is absolute"),
        ("path of another entry", "is not under the entry's name 'global_step20'"),
        ("empty part in a path", "'global_step20//x.pt' is not a plain relative path"),
        ("slash in an entry name", "entries[0].name 'a/b' is not a name directly under"),
        ("dot-dot entry", "entries[0].name '..' is not a name directly under"),
        ("unknown kind", "entries[0].kind 'link' is neither 'file' nor 'dir'"),
        ("file entry naming another file", "entries[1].files of the file entry 'latest'"),
        ("text outside its entry", "entries[0].text key '../latest'"),
        ("short sha256", "copies[0].files[0].sha256 'abc' is not 64 lowercase hex digits"),
        ("copy path outside its entry", "copies[0].files[0].path 'other/x.pt' is not under"),
        ("same entry twice", "entries name 'global_step20' twice"),
        ("same file twice", "entries[0].files name"),
        ("entries not a list", "entries is an object, not a list"),
        ("flag as text", "truncated is a string, not true or false"),
    ],
)
def test_a_malformed_scan_is_refused_naming_the_node_and_the_field(change, says):
    with pytest.raises(ValueError, match="checkpoint scan from node node1: ") as raised:
        NodeScan.from_dict(_broken(change))
    assert says in str(raised.value)


def test_a_failed_scan_says_why():
    with pytest.raises(ValueError, match="node node3: the scan failed: python3 not found"):
        NodeScan.from_dict({"ok": False, "node": "node3", "error": "python3 not found"})


def test_an_answer_with_no_node_is_refused():
    with pytest.raises(ValueError, match="names no node"):
        NodeScan.from_dict({**_good(), "node": ""})
    with pytest.raises(ValueError, match="the answer is a list, not an object"):
        NodeScan.from_dict([])


_segment = st.text(alphabet="abcxyz019_-.", min_size=1, max_size=8).filter(
    lambda part: part not in (".", "..")
)


@given(inside=st.lists(_segment, min_size=1, max_size=4))
def test_any_plain_path_under_the_entry_is_kept(inside):
    path = "/".join(["checkpoint-500", *inside])
    doc = scan_doc("node1", {"name": "checkpoint-500", "kind": "dir", "text": {},
                             "files": [{"path": path, "size": 3, "mtime_ns": 7}]})  # fmt: skip
    assert NodeScan.from_dict(doc).entries[0].files == (FileSeen(path, 3, 7),)


@given(
    before=st.lists(_segment, max_size=3),
    after=st.lists(_segment, max_size=3),
    escape=st.sampled_from(["..", ".", ""]),
)
def test_any_path_with_a_dot_dot_or_empty_part_is_refused(before, after, escape):
    path = "/".join(["checkpoint-500", *before, escape, *after])
    doc = scan_doc("node1", {"name": "checkpoint-500", "kind": "dir", "text": {},
                             "files": [{"path": path, "size": 3, "mtime_ns": 7}]})  # fmt: skip
    with pytest.raises(ValueError, match="is not a plain relative path"):
        NodeScan.from_dict(doc)


def test_a_parts_signature_changes_with_any_file_and_not_with_the_listing_order():
    files = (FileSeen("c/a.pt", 10, 1), FileSeen("c/b.pt", 20, 1))
    assert signature(files) == signature(tuple(reversed(files)))
    assert signature(files) != signature((FileSeen("c/a.pt", 10, 2), files[1]))
    assert signature(files) != signature((FileSeen("c/a.pt", 11, 1), files[1]))
    assert signature(files) != signature(files[:1])
    assert part_size(files) == 30
