"""When an entry of the checkpoint directory is a complete checkpoint, judged over rounds of
scans: DeepSpeed's `latest`, a Trainer's trainer_state.json, a torch distributed
checkpoint's .metadata, accelerate's inner `latest`, and quiet for the settle time
otherwise; temporary names; nodes that do not answer; a writer that deletes."""

from __future__ import annotations

from typing import Any

import pytest
from _checkpoint_scans import dir_entry, file_entry, pointer, scan, scans
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.checkpoints.complete import (
    AT_THE_END,
    Checkpoint,
    Watched,
    at_the_end,
    is_checkpoint_name,
    natural_key,
    newest_first,
    observe,
    without_lost_parts,
)
from orchestrator.checkpoints.model import NodeScan

NODES = ("node1", "node2", "node3", "node4")
LONG = 600.0  # a settle time no test reaches: only a framework's word makes it complete
SETTLE = 30.0


def _zero_shards(index: int) -> dict[str, int]:
    """DeepSpeed ZeRO: each node's rank writes its optimizer shard; rank 0 the model too."""
    shards = {f"zero_pp_rank_{index}_mp_rank_00_optim_states.pt": 4000}
    if index == 0:
        shards["mp_rank_00_model_states.pt"] = 2000
    return shards


def _deepspeed(*steps: int, latest: int | None = None, mtime: int = 1,
               answering: tuple[str, ...] = NODES) -> dict[str, NodeScan]:  # fmt: skip
    found = []
    for index, node in enumerate(NODES):
        if node not in answering:
            continue
        entries: list[dict[str, Any]] = [
            dir_entry(f"global_step{step}", _zero_shards(index), mtime=mtime) for step in steps
        ]
        if index == 0 and latest is not None:
            entries += [pointer(f"global_step{latest}"), file_entry("zero_to_fp32.py", 20000)]
        found.append(scan(node, *entries))
    return scans(*found)


def _rounds(*rounds: tuple[float, dict[str, NodeScan]], settle_s: float = LONG) -> Watched:
    state = Watched()
    for now, found in rounds:
        state = observe(state, found, now, settle_s)
    return state


# ----- DeepSpeed -----------------------------------------------------------------------
def test_deepspeed_zero_shards_on_four_nodes_are_complete_once_latest_names_the_tag():
    before = _rounds((0, _deepspeed(20)))
    after = _rounds((0, _deepspeed(20)), (5, _deepspeed(20, latest=20)))

    assert not before.checkpoints["global_step20"].complete
    step20 = after.checkpoints["global_step20"]
    assert (step20.complete, step20.how, step20.complete_at) == (
        True, "DeepSpeed's latest names it", 5,
    )  # fmt: skip
    shard = "global_step20/zero_pp_rank_2_mp_rank_00_optim_states.pt"
    assert step20.parts["node3"][0].path == shard
    assert set(step20.parts) == set(NODES)
    assert step20.named_by == ("latest",)
    # The pointer and the conversion script are DeepSpeed's companions, not checkpoints.
    assert set(after.checkpoints) == {"global_step20"}


def test_a_tag_rewritten_in_place_is_not_complete_until_a_scan_finds_it_unchanged():
    state = _rounds(
        (0, _deepspeed(20, latest=20)),
        (5, _deepspeed(20, latest=20, mtime=2)),  # saved again under the same tag
    )
    rewriting = state.checkpoints["global_step20"]
    state = observe(state, _deepspeed(20, latest=20, mtime=2), 10, LONG)

    assert not rewriting.complete
    assert rewriting.how == (
        "DeepSpeed's latest names it but it changed since; "
        "complete once a scan finds every part unchanged"
    )
    assert state.checkpoints["global_step20"].complete
    assert state.checkpoints["global_step20"].complete_at == 10


def test_watching_a_directory_deepspeed_already_wrote_to_older_tags_count_once_unchanged():
    first = _rounds((0, _deepspeed(10, 20, latest=20)))
    second = _rounds((0, _deepspeed(10, 20, latest=20)), (5, _deepspeed(10, 20, latest=20)))

    assert first.checkpoints["global_step20"].complete
    assert not first.checkpoints["global_step10"].complete
    step10 = second.checkpoints["global_step10"]
    assert step10.complete
    assert step10.how == "older than global_step20, which DeepSpeed's latest names, and unchanged"
    assert [ck.name for ck in second.complete()] == ["global_step10", "global_step20"]


# ----- a framework's marker inside the checkpoint ----------------------------------------
def _trainer(step: int, rng_size: int = 14000,
             extra: dict[str, int] | None = None) -> dict[str, NodeScan]:  # fmt: skip
    """transformers Trainer: rank 0 writes the model, optimizer and trainer_state.json;
    every node's ranks their rng_state_K.pth."""
    name = f"checkpoint-{step}"
    found = []
    for index, node in enumerate(NODES):
        files = {f"rng_state_{index}.pth": rng_size}
        if index == 0:
            files |= {"model.safetensors": 90000, "optimizer.pt": 180000,
                      "trainer_state.json": 900, **(extra or {})}  # fmt: skip
        found.append(scan(node, dir_entry(name, files)))
    return scans(*found)


def test_a_trainer_checkpoint_is_complete_at_the_second_scan_that_shows_trainer_state():
    first = _rounds((0, _trainer(500)))
    second = _rounds((0, _trainer(500)), (5, _trainer(500)))

    assert not first.checkpoints["checkpoint-500"].complete
    assert first.checkpoints["checkpoint-500"].how == (
        "trainer_state.json is there; complete once a scan finds every part unchanged"
    )
    checkpoint = second.checkpoints["checkpoint-500"]
    assert (checkpoint.complete, checkpoint.complete_at) == (True, 5)
    assert checkpoint.how == "trainer_state.json (transformers Trainer) is written"
    assert {node: len(files) for node, files in checkpoint.parts.items()} == {
        "node1": 4, "node2": 1, "node3": 1, "node4": 1,
    }  # fmt: skip


def test_a_trainer_checkpoint_a_node_still_writes_is_not_complete():
    state = _rounds((0, _trainer(500, rng_size=100)), (5, _trainer(500, rng_size=14000)))
    assert not state.checkpoints["checkpoint-500"].complete


def test_a_file_with_a_temporary_name_inside_keeps_a_checkpoint_incomplete():
    writing = _trainer(500, extra={"optimizer.pt.partial": 10})
    state = _rounds((0, writing), (5, writing), (700, writing))

    checkpoint = state.checkpoints["checkpoint-500"]
    assert not checkpoint.complete
    assert checkpoint.how == (
        "checkpoint-500/optimizer.pt.partial on node1 has a temporary name: still being written"
    )


def test_a_torch_distributed_checkpoint_is_complete_once_metadata_is_there_twice():
    def dcp(with_metadata: bool) -> dict[str, NodeScan]:
        found = []
        for index, node in enumerate(NODES):
            files = {f"__{index}_0.distcp": 5000}
            if index == 0 and with_metadata:
                files[".metadata"] = 300
            found.append(scan(node, dir_entry("step_100", files)))
        return scans(*found)

    writing = _rounds((0, dcp(False)), (5, dcp(False)))
    done = _rounds((0, dcp(False)), (5, dcp(True)), (10, dcp(True)))

    assert not writing.checkpoints["step_100"].complete
    assert not _rounds((0, dcp(False)), (5, dcp(True))).checkpoints["step_100"].complete
    assert done.checkpoints["step_100"].complete
    assert done.checkpoints["step_100"].how == ".metadata (torch distributed checkpoint) is written"


def test_accelerate_save_state_with_deepspeed_is_complete_by_its_inner_latest():
    def saved() -> dict[str, NodeScan]:
        return scans(*(
            scan(node, dir_entry("checkpoint_3", {
                f"pytorch_model/zero_pp_rank_{index}_mp_rank_00_optim_states.pt": 4000,
                **({"latest": 12} if index == 0 else {}),
            }, text={"latest": "pytorch_model"} if index == 0 else None))
            for index, node in enumerate(NODES)
        ))  # fmt: skip

    state = _rounds((0, saved()), (5, saved()))
    assert state.checkpoints["checkpoint_3"].complete
    assert state.checkpoints["checkpoint_3"].how == (
        "latest (DeepSpeed's, saved by accelerate) is written"
    )


# ----- quiet for the settle time -------------------------------------------------------
def test_a_model_renamed_into_place_after_its_last_write_is_complete_when_first_seen():
    seen = scans(scan("node1", file_entry("model.pt", 900, mtime=5, ctime=9)), scan("node2"))
    first = observe(_rounds(), seen, 0, SETTLE).checkpoints["model.pt"]
    assert (first.complete, first.how) == (True, "renamed into place after its last write")
    rewritten = scans(scan("node1", file_entry("model.pt", 950, mtime=12)), scan("node2"))
    again = observe(observe(_rounds(), seen, 0, SETTLE), rewritten, 10, SETTLE)
    assert not again.checkpoints["model.pt"].complete  # written in place since: not yet


def test_a_model_written_in_place_is_complete_once_quiet_for_the_settle_time():
    def node1(*entries: dict[str, Any]) -> dict[str, NodeScan]:
        return scans(scan("node1", *entries), scan("node2"))

    partial = _rounds((0, node1(file_entry("model.pt.partial", 500))), settle_s=SETTLE)
    moments = {}
    state = partial
    for now in (1, 20, 31):
        state = observe(state, node1(file_entry("model.pt", 900)), now, SETTLE)
        moments[now] = state.checkpoints["model.pt"]

    assert partial.checkpoints == {}
    assert not moments[1].complete
    assert moments[20].how == "changed 19 s ago; complete once quiet for 30 s on every node"
    assert not moments[20].complete
    assert (moments[31].complete, moments[31].how) == (True, "quiet for 30 s on every node")
    assert moments[31].parts == {"node1": state.checkpoints["model.pt"].parts["node1"]}


def test_when_the_job_succeeds_what_it_wrote_just_before_the_end_is_complete():
    """No later scan finds the last checkpoint unchanged: the job's success says it is as
    its writer left it. A file with a temporary name still is not whole."""
    early = scans(scan("node1", file_entry("model.pt", 900, mtime=1, ctime=9),
                       file_entry("state.pt", 40, mtime=1)))  # fmt: skip
    late = scans(scan("node1", file_entry("model.pt", 950, mtime=12),
                      file_entry("state.pt", 40, mtime=1),
                      dir_entry("step-2", {"shard.pt.tmp": 7}, mtime=12)))  # fmt: skip
    running = _rounds((0, early), (5, early), (12, late), settle_s=SETTLE)
    assert not running.checkpoints["model.pt"].complete  # rewritten in place at 12

    ended = at_the_end(running, 13).checkpoints
    assert (ended["model.pt"].complete, ended["model.pt"].how) == (True, AT_THE_END)
    assert ended["model.pt"].complete_at == 13
    assert not ended["step-2"].complete
    assert ended["state.pt"].how == AT_THE_END  # quiet for less than the settle time
    assert at_the_end(at_the_end(running, 13), 20).checkpoints == ended  # complete stays so


def test_with_no_settle_time_an_entry_still_needs_a_second_scan_that_finds_it_unchanged():
    seen = scans(scan("node1", file_entry("model.pt", 900)))
    first = _rounds((0, seen), settle_s=0)
    second = _rounds((0, seen), (0.5, seen), settle_s=0)
    assert not first.checkpoints["model.pt"].complete
    assert second.checkpoints["model.pt"].how == "quiet for 0 s on every node"


@pytest.mark.parametrize(
    "name",
    ["model.pt.tmp", "ckpt.part", "weights.partial", "shard.incomplete", "ckpt.lock", ".hidden",
     "tmp-checkpoint-500", "tmpa1b2c3d4", "TMP_save", "latest", "latest_universal",
     "zero_to_fp32.py"],
)  # fmt: skip
def test_temporary_names_and_deepspeed_companions_are_never_checkpoints(name):
    quiet = scans(scan("node1", file_entry(name, 10)))
    state = _rounds((0, quiet), (100, quiet), settle_s=SETTLE)
    assert not is_checkpoint_name(name)
    assert state.checkpoints == {}


@pytest.mark.parametrize("name", ["checkpoint-500", "global_step20", "model.pt", "step_100"])
def test_ordinary_names_can_be_checkpoints(name):
    assert is_checkpoint_name(name)


def test_a_complete_checkpoint_that_changes_again_is_incomplete_until_judged_again():
    state = _rounds((0, _trainer(500)), (5, _trainer(500)))
    changed = observe(state, _trainer(500, rng_size=15000), 10, LONG)
    again = observe(changed, _trainer(500, rng_size=15000), 15, LONG)

    assert state.checkpoints["checkpoint-500"].complete
    assert not changed.checkpoints["checkpoint-500"].complete
    assert changed.checkpoints["checkpoint-500"].complete_at is None
    assert again.checkpoints["checkpoint-500"].complete_at == 15


def test_a_complete_checkpoint_stays_complete_since_when_it_became_so():
    state = _rounds(*((now, _trainer(500)) for now in (0, 5, 10, 15)))
    assert state.checkpoints["checkpoint-500"].complete_at == 5


def test_a_different_kind_on_two_nodes_is_never_complete():
    found = scans(scan("node1", file_entry("model.pt", 9)),
                  scan("node2", dir_entry("model.pt", {"a": 1})))  # fmt: skip
    state = _rounds((0, found), (100, found), settle_s=SETTLE)
    assert not state.checkpoints["model.pt"].complete
    assert state.checkpoints["model.pt"].how == "a file on node1 but a directory on node2"


# ----- nodes that do not answer, a writer that deletes --------------------------------
def test_a_node_that_does_not_answer_keeps_its_part_as_last_seen():
    node4_silent = _deepspeed(20, latest=20, answering=NODES[:3])
    state = _rounds((0, _deepspeed(20, latest=20)), (5, node4_silent))
    step20 = state.checkpoints["global_step20"]
    assert set(step20.parts) == set(NODES)
    assert step20.complete


def test_a_node_that_answers_without_its_part_has_none_and_the_rest_is_not_complete():
    without_node4 = _deepspeed(20, latest=20)
    without_node4["node4"] = scan("node4")
    state = _rounds((0, _deepspeed(20, latest=20)), (5, without_node4), (9, without_node4))

    step20 = state.checkpoints["global_step20"]
    assert set(step20.parts) == {"node1", "node2", "node3"}
    assert not step20.gone


def test_a_truncated_listing_does_not_delete_what_it_did_not_list():
    truncated = _deepspeed(20, latest=20)
    truncated["node4"] = scan("node4", truncated=True)
    state = _rounds((0, _deepspeed(20, latest=20)), (5, truncated))
    assert set(state.checkpoints["global_step20"].parts) == set(NODES)
    assert state.checkpoints["global_step20"].complete


def test_a_checkpoint_its_writers_delete_is_gone():
    state = _rounds(
        (0, _trainer(500)), (5, _trainer(500)),
        (10, scans(*(scan(node) for node in NODES))),
    )  # fmt: skip
    checkpoint = state.checkpoints["checkpoint-500"]
    assert (checkpoint.gone, checkpoint.complete, checkpoint.parts) == (True, False, {})
    assert checkpoint.how == "deleted from the checkpoint directory by its writer"
    assert state.complete() == ()


def test_a_checkpoint_is_not_gone_while_a_silent_node_may_still_have_its_part():
    deleted_but_node4 = scans(*(scan(node) for node in NODES[:3]))
    state = _rounds((0, _trainer(500)), (5, _trainer(500)), (10, deleted_but_node4))
    assert not state.checkpoints["checkpoint-500"].gone
    assert set(state.checkpoints["checkpoint-500"].parts) == {"node4"}


def test_a_name_written_again_after_it_was_deleted_is_a_new_checkpoint():
    empty = scans(*(scan(node) for node in NODES))
    state = _rounds((0, _trainer(500)), (5, _trainer(500)), (10, empty), (20, _trainer(500)))
    checkpoint = state.checkpoints["checkpoint-500"]
    assert (checkpoint.gone, checkpoint.complete, checkpoint.first_seen) == (False, False, 20)


def test_a_checkpoint_being_written_when_its_node_died_is_lost_with_it_at_the_restart():
    # global_step40 was being written (no latest names it) when node2 died; node1, node3
    # and node4 go on, and the restart sets their parts of it aside.
    writing = _deepspeed(20, 40, latest=20)
    state = _rounds((0, writing), (5, _deepspeed(20, 40, latest=20, answering=("node1",))))
    state = without_lost_parts(state, ("node1", "node3", "node4"))
    step40, step20 = state.checkpoints["global_step40"], state.checkpoints["global_step20"]
    assert set(step40.parts) == {"node1", "node3", "node4"} and not step40.complete
    assert set(step20.parts) == set(NODES) and step20.complete  # its copies are elsewhere
    set_aside = _deepspeed(20, latest=20, answering=("node1", "node3", "node4"))
    state = observe(state, set_aside, 10, LONG)
    assert state.checkpoints["global_step40"].gone
    # The next attempt writes global_step40 again: a new checkpoint, none of node2's in it.
    again = observe(state, _deepspeed(20, 40, latest=40, answering=("node1", "node3", "node4")),
                    20, LONG)  # fmt: skip
    step40 = again.checkpoints["global_step40"]
    assert (set(step40.parts), step40.first_seen) == ({"node1", "node3", "node4"}, 20)


def test_a_checkpoint_only_lost_nodes_had_is_gone_and_says_so():
    state = _rounds((0, _deepspeed(40, answering=("node2",))))
    state = without_lost_parts(state, ("node1", "node3"))
    step40 = state.checkpoints["global_step40"]
    assert (step40.gone, step40.parts, step40.how) == (True, {}, "lost with node2")
    assert observe(state, _deepspeed(answering=("node1",)), 5, LONG).checkpoints[
        "global_step40"].how == "lost with node2"  # fmt: skip


# ----- newest first --------------------------------------------------------------------
def _complete(name: str, at: float | None) -> Checkpoint:
    return Checkpoint(name, "dir", {}, 0, 0, complete=at is not None, complete_at=at)


def test_newest_first_is_by_when_complete_then_by_number():
    ordered = newest_first([
        _complete("checkpoint-9", 50), _complete("checkpoint-10", 50),
        _complete("checkpoint-100", 10), _complete("checkpoint-200", None),
        _complete("checkpoint-8", 60),
    ])  # fmt: skip
    assert [ck.name for ck in ordered] == ["checkpoint-8", "checkpoint-10", "checkpoint-9",
                                           "checkpoint-100"]  # fmt: skip


@given(st.lists(st.text(alphabet="ab-_19", max_size=6), max_size=8))
def test_any_names_sort_with_numbers_as_numbers(names):
    ordered = sorted(names, key=natural_key)
    assert sorted(ordered, key=natural_key) == ordered
    assert sorted(["step-9", "step-10", "step-1"], key=natural_key) == [
        "step-1", "step-9", "step-10"]  # fmt: skip


# ----- the settle rule as a property ---------------------------------------------------
_round = st.tuples(
    st.floats(min_value=0, max_value=20),  # seconds since the previous round
    st.lists(st.sampled_from(["silent", "same", "touched"]), min_size=3, max_size=3),
)


@given(st.lists(_round, min_size=1, max_size=12))
def test_without_a_marker_complete_means_unchanged_on_every_node_for_the_settle_time(rounds):
    state, now, mtimes = Watched(), 0.0, [1, 1, 1]
    last_change, quiet_rounds = 0.0, 0
    for step, (gap, acts) in enumerate(rounds):
        now += gap
        found = {}
        for index, act in enumerate(acts):
            if act == "silent" and step > 0:
                continue
            mtimes[index] += act == "touched"
            found[f"node{index}"] = scan(f"node{index}", file_entry("model.pt", 8, mtimes[index]))
        changed = step == 0 or any(act == "touched" for act in acts)
        last_change, quiet_rounds = (now, 0) if changed else (last_change, quiet_rounds + 1)
        state = observe(state, found, now, SETTLE)

        checkpoint = state.checkpoints["model.pt"]
        assert checkpoint.changed_at == last_change
        assert checkpoint.complete == (quiet_rounds >= 1 and now - last_change >= SETTLE)


def test_a_checkpoint_on_every_node_after_a_restore_counts_its_bytes_once():
    whole = file_entry("model.pt", 900)
    state = _rounds((0, scans(scan("node1", whole), scan("node2", whole), scan("node3"))))
    assert state.checkpoints["model.pt"].size == 900
    shards = _rounds((0, scans(scan("node1", dir_entry("step", {"a.pt": 5})),
                               scan("node2", dir_entry("step", {"b.pt": 7})))))  # fmt: skip
    assert shards.checkpoints["step"].size == 12
