"""What a restart puts back: the newest checkpoint whose every part a surviving node holds
(a checkpoint a dead node's part of was not copied yet is skipped, saying so), whole, with
DeepSpeed's `latest` written back, and where each node's missing files come from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from _checkpoint_scans import copy_doc, dir_entry, scan, scans, sha

from orchestrator.checkpoints.complete import Watched, observe
from orchestrator.checkpoints.model import FileCopy, NodeScan
from orchestrator.checkpoints.staging import (
    Fetch,
    Holder,
    KnownCheckpoint,
    StagedFile,
    choose_restore,
    sources,
)

NODES = ("node1", "node2", "node3", "node4")
NEXT = {"node1": "node2", "node2": "node3", "node3": "node4", "node4": "node1"}


def _known(name: str, parts: Mapping[str, Mapping[str, int]], complete_at: float,
           named_by: tuple[str, ...] = ()) -> KnownCheckpoint:  # fmt: skip
    """As the head records it; the hashes are those copy_doc gives the same files."""
    return KnownCheckpoint(
        name=name,
        kind="dir",
        complete_at=complete_at,
        parts={writer: tuple(FileCopy(f"{name}/{path}", size, sha(f"{name}/{path}:{size}"))
                             for path, size in files.items())
               for writer, files in parts.items()},
        named_by=named_by,
    )


def _trainer_parts(step: int) -> dict[str, dict[str, int]]:
    parts = {node: {f"rng_state_{index}.pth": 14000 + step} for index, node in enumerate(NODES)}
    parts["node1"] |= {"model.safetensors": 90000, "trainer_state.json": 900 + step}
    return parts


def _alive(
    parts_by_entry: Mapping[str, Mapping[str, Mapping[str, int]]],
    copied: Mapping[str, tuple[str, ...]],
    nodes: tuple[str, ...],
) -> dict[str, NodeScan]:
    """Each alive writer's PATH with its parts, and the ring's copies of the writers listed in
    `copied` (entry -> writers whose part was copied to the next node)."""
    found = []
    for node in nodes:
        entries = [dir_entry(name, parts[node]) for name, parts in parts_by_entry.items()
                   if node in parts]  # fmt: skip
        copies = tuple(copy_doc(name, writer, parts_by_entry[name][writer])
                       for name, writers in copied.items() for writer in writers
                       if NEXT[writer] == node)  # fmt: skip
        found.append(scan(node, *entries, copies=copies))
    return scans(*found)


def test_a_checkpoint_whose_dead_nodes_part_was_not_copied_yet_is_skipped_for_the_one_before():
    parts = {"checkpoint-20": _trainer_parts(20), "checkpoint-40": _trainer_parts(40)}
    known = [_known("checkpoint-20", parts["checkpoint-20"], 200),
             _known("checkpoint-40", parts["checkpoint-40"], 400)]  # fmt: skip
    # node3 died while its part of checkpoint-40 was being copied to node4.
    alive = _alive(parts, {"checkpoint-20": NODES, "checkpoint-40": ("node1", "node2", "node4")},
                   ("node1", "node2", "node4"))  # fmt: skip

    restore = choose_restore(known, alive)

    assert restore.chosen == "checkpoint-20"
    assert restore.skipped == ("checkpoint-40: the part written by node3 is held by no node alive",)
    assert restore.holders["node3"] == (Holder("node4", "copy"),)
    assert restore.holders["node1"] == (Holder("node1", "dir"), Holder("node2", "copy"))
    assert [staged.path for staged in restore.files] == [
        "checkpoint-20/model.safetensors", "checkpoint-20/rng_state_0.pth",
        "checkpoint-20/rng_state_1.pth", "checkpoint-20/rng_state_2.pth",
        "checkpoint-20/rng_state_3.pth", "checkpoint-20/trainer_state.json",
    ]  # fmt: skip
    node3s = "checkpoint-20/rng_state_2.pth"
    assert restore.files[3] == StagedFile(node3s, 14020, sha(f"{node3s}:14020"), "node3")
    assert restore.pointers == {}


def test_a_checkpoint_still_being_written_when_a_node_dies_is_never_known_nor_staged():
    def round_(rng: int) -> dict[str, NodeScan]:
        return scans(*(scan(node, dir_entry("checkpoint-20", _trainer_parts(20)[node]),
                            dir_entry("checkpoint-40", {f"rng_state_{index}.pth": rng}))
                       for index, node in enumerate(NODES)))  # fmt: skip

    state = Watched()
    for now, rng in ((0, 10), (5, 20), (10, 30)):
        state = observe(state, round_(rng), now, settle_s=30)
    known = [_known(ck.name, {node: {f.path.split("/", 1)[1]: f.size for f in files}
                              for node, files in ck.parts.items()}, ck.complete_at or 0)
             for ck in state.complete()]  # fmt: skip

    assert [ck.name for ck in known] == ["checkpoint-20"]
    alive = _alive({"checkpoint-20": _trainer_parts(20)}, {"checkpoint-20": NODES}, NODES[:3])
    assert choose_restore(known, alive).chosen == "checkpoint-20"


def _deepspeed_parts() -> dict[str, dict[str, int]]:
    parts = {node: {f"zero_pp_rank_{index}_mp_rank_00_optim_states.pt": 4000}
             for index, node in enumerate(NODES)}  # fmt: skip
    parts["node1"]["mp_rank_00_model_states.pt"] = 2000
    return parts


def test_deepspeed_zero_shards_come_back_whole_with_latest_naming_the_tag():
    parts = _deepspeed_parts()
    known = [_known("global_step20", parts, 100, named_by=("latest",))]
    alive = _alive({"global_step20": parts}, {"global_step20": NODES}, ("node1", "node3", "node4"))

    restore = choose_restore(known, alive)

    assert restore.chosen == "global_step20"
    assert restore.pointers == {"latest": "global_step20"}
    assert len(restore.files) == 5
    assert restore.size == 4 * 4000 + 2000
    assert restore.holders["node2"] == (Holder("node3", "copy"),)
    assert restore.conflicts == ()


def test_a_file_every_node_wrote_alike_is_staged_once_and_a_differing_one_is_said():
    parts = {node: {"config.json": 700, f"rng_state_{index}.pth": 14000}
             for index, node in enumerate(NODES)}  # fmt: skip
    alike = _known("checkpoint-500", parts, 10)
    differing = KnownCheckpoint("checkpoint-500", "dir", 10, {
        **alike.parts, "node3": (FileCopy("checkpoint-500/config.json", 701, sha("other")),),
    })  # fmt: skip
    alive = scans(*(scan(node, dir_entry("checkpoint-500", parts[node])) for node in NODES))
    alive["node3"] = scan("node3", dir_entry("checkpoint-500", {"config.json": 701}))

    same = choose_restore([alike], scans(*(scan(n, dir_entry("checkpoint-500", parts[n]))
                                           for n in NODES)))  # fmt: skip
    other = choose_restore([differing], alive)

    assert [f.path for f in same.files].count("checkpoint-500/config.json") == 1
    assert same.conflicts == ()
    assert other.conflicts == (
        "checkpoint-500/config.json differs between node1 and node3: node1's is staged",
    )
    assert next(f for f in other.files if f.path.endswith("config.json")).writer == "node1"


def test_a_copy_with_another_hash_or_a_writers_file_of_another_size_holds_nothing():
    parts = {"node1": {"model.pt": 900}, "node2": {"rng.pth": 10}}
    known = [_known("checkpoint-9", parts, 10)]
    alive = scans(
        scan("node1", dir_entry("checkpoint-9", {"model.pt": 899})),  # rewritten since
        scan("node3", copies=(copy_doc("checkpoint-9", "node2", {"rng.pth": 10}, tag="v2"),)),
    )
    restore = choose_restore(known, alive)
    assert restore.chosen is None
    assert restore.skipped == (
        "checkpoint-9: the parts written by node1, node2 are held by no node alive",
    )


def test_a_dead_nodes_empty_part_does_not_keep_a_checkpoint_from_being_restored():
    parts = {"node1": {"model.pt": 900}, "node2": {}}
    alive = scans(scan("node1", dir_entry("checkpoint-9", parts["node1"])))
    restore = choose_restore([_known("checkpoint-9", parts, 10)], alive)
    assert (restore.chosen, [f.path for f in restore.files]) == (
        "checkpoint-9", ["checkpoint-9/model.pt"],
    )  # fmt: skip


def test_a_checkpoint_a_restart_staged_survives_the_death_of_the_node_that_held_its_copy():
    # node1 wrote it and died; node2 held the only copy and staged it on node2..node4; now
    # node2 dies too: node3 and node4 have it whole in their PATH.
    parts = {"node1": {"model.pt": 900}}
    staged = scans(*(scan(node, dir_entry("checkpoint-9", parts["node1"]))
                     for node in ("node3", "node4")))  # fmt: skip
    known = _known("checkpoint-9", parts, 10)
    assert choose_restore([known], staged).chosen is None  # not known as staged: lost
    restore = choose_restore([replace(known, staged_on=("node2", "node3", "node4"))], staged)
    assert restore.chosen == "checkpoint-9"
    assert restore.holders["node1"] == (Holder("node3", "dir"), Holder("node4", "dir"))


def test_nothing_to_restore_when_nothing_is_known():
    assert choose_restore([], scans(scan("node1"))).chosen is None


# ----- where the missing files come from -------------------------------------------------
def _two_holders(sizes: Mapping[str, int]) -> tuple[KnownCheckpoint, dict[str, NodeScan]]:
    known = _known("checkpoint-7", {"node1": sizes}, 10)
    alive = scans(
        scan("node1", dir_entry("checkpoint-7", sizes)),
        scan("node2", copies=(copy_doc("checkpoint-7", "node1", sizes),)),
        scan("node3"),
    )
    return known, alive


def test_missing_files_are_spread_across_the_holders_by_bytes():
    known, alive = _two_holders({"a.pt": 100, "b.pt": 60, "c.pt": 50})
    restore = choose_restore([known], alive)

    plan = sources(restore, {"node3": ["checkpoint-7/c.pt", "checkpoint-7/a.pt",
                                       "checkpoint-7/b.pt"]}, alive)  # fmt: skip

    assert plan == {"node3": {
        "node1": (Fetch("checkpoint-7/a.pt", "dir", "node1"),),
        "node2": (Fetch("checkpoint-7/b.pt", "copy", "node1"),
                  Fetch("checkpoint-7/c.pt", "copy", "node1")),
    }}  # fmt: skip


def test_a_node_gets_its_missing_files_from_another_node_before_its_own_copy():
    known, alive = _two_holders({"a.pt": 100})
    restore = choose_restore([known], alive)
    assert sources(restore, {"node2": ["checkpoint-7/a.pt"]}, alive) == {
        "node2": {"node1": (Fetch("checkpoint-7/a.pt", "dir", "node1"),)}
    }
    without_node1 = {node: one for node, one in alive.items() if node != "node1"}
    assert sources(restore, {"node2": ["checkpoint-7/a.pt"]}, without_node1) == {
        "node2": {"node2": (Fetch("checkpoint-7/a.pt", "copy", "node1"),)}
    }


def test_a_node_missing_nothing_fetches_nothing():
    known, alive = _two_holders({"a.pt": 100})
    assert sources(choose_restore([known], alive), {"node1": []}, alive) == {"node1": {}}


def test_a_path_not_in_the_restored_checkpoint_is_refused_naming_the_node():
    known, alive = _two_holders({"a.pt": 100})
    with pytest.raises(ValueError, match=r"node3 misses checkpoint-7/z\.pt, which is not"):
        sources(choose_restore([known], alive), {"node3": ["checkpoint-7/z.pt"]}, alive)

