"""Where the copies of complete checkpoints go: ring order after each part's writer, a copy
already there counted, a stale copy replaced, a node short of room passed over (and the
shortfall said), and copies of what the writer deleted removed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from _checkpoint_scans import COPIES_DIR, copy_doc, scan, scans
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.checkpoints.complete import Checkpoint
from orchestrator.checkpoints.model import FileSeen
from orchestrator.checkpoints.placement import (
    CopyOrder,
    copy_orders,
    prune_orders,
    ring_after,
)

NODES = ("node1", "node2", "node3", "node4")
MARGIN = 1000
SHARD = 4000
NODE1_SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _checkpoint(name: str, parts: Mapping[str, Mapping[str, int]], complete_at: float | None = 10,
                gone: bool = False) -> Checkpoint:  # fmt: skip
    return Checkpoint(
        name=name,
        kind="dir",
        parts={node: tuple(FileSeen(f"{name}/{path}", size, 1) for path, size in files.items())
               for node, files in parts.items()},
        first_seen=0,
        changed_at=0,
        complete=complete_at is not None and not gone,
        complete_at=None if gone else complete_at,
        gone=gone,
    )


def _zero(step: int, nodes: tuple[str, ...] = NODES) -> Checkpoint:
    return _checkpoint(f"global_step{step}", {
        node: {f"zero_pp_rank_{index}_mp_rank_00_optim_states.pt": SHARD}
        for index, node in enumerate(nodes)
    })  # fmt: skip


def _moves(orders: tuple[CopyOrder, ...]) -> list[tuple[str, str, str]]:
    return [(order.entry, order.source, order.destination) for order in orders]


EVERYONE = scans(*(scan(node) for node in NODES))


def test_each_nodes_part_goes_to_the_next_node_in_the_ring():
    plan = copy_orders([_zero(20)], EVERYONE, NODES, copies=1, margin_bytes=MARGIN)

    assert _moves(plan.orders) == [
        ("global_step20", "node1", "node2"), ("global_step20", "node2", "node3"),
        ("global_step20", "node3", "node4"), ("global_step20", "node4", "node1"),
    ]  # fmt: skip
    assert all(order.writer == order.source for order in plan.orders)
    assert plan.orders[2].files == _zero(20).parts["node3"]
    assert plan.shortfalls == ()


def test_two_copies_go_to_the_next_two_nodes():
    plan = copy_orders([_zero(20)], EVERYONE, NODES, copies=2, margin_bytes=MARGIN)
    assert [(o.writer, o.destination) for o in plan.orders if o.writer in ("node1", "node4")] == [
        ("node1", "node2"), ("node1", "node3"), ("node4", "node1"), ("node4", "node2"),
    ]  # fmt: skip


def test_more_copies_than_other_nodes_is_a_shortfall_saying_so():
    plan = copy_orders([_zero(20)], EVERYONE, NODES, copies=5, margin_bytes=MARGIN)
    assert len(plan.orders) == 12
    assert plan.shortfalls[0].message == (
        "global_step20: the part written by node1 has 3 of 5 copies (the job has 3 other nodes)"
    )


def test_a_node_holding_the_part_as_it_is_now_gets_no_copy():
    held = copy_doc("global_step20", "node1", {NODE1_SHARD: SHARD})
    holding = {**EVERYONE, "node2": scan("node2", copies=(held,))}
    plan = copy_orders([_zero(20)], holding, NODES, copies=1, margin_bytes=MARGIN)
    assert [order.writer for order in plan.orders] == ["node2", "node3", "node4"]


def test_a_stale_copy_of_an_older_version_of_the_part_is_replaced():
    older = copy_doc("global_step20", "node1", {NODE1_SHARD: 100})
    stale = {**EVERYONE, "node2": scan("node2", copies=(older,))}
    plan = copy_orders([_zero(20)], stale, NODES, copies=1, margin_bytes=MARGIN)
    first = plan.orders[0]
    assert (first.writer, first.destination, first.replaces_stale) == ("node1", "node2", True)
    assert not plan.orders[1].replaces_stale


def test_a_node_with_too_little_room_is_passed_over_for_the_next_in_the_ring():
    full = {**EVERYONE, "node2": scan("node2", copies_free=SHARD + MARGIN - 1)}
    plan = copy_orders([_zero(20)], full, NODES, copies=1, margin_bytes=MARGIN)
    assert [(o.writer, o.destination) for o in plan.orders] == [
        ("node1", "node3"), ("node2", "node3"), ("node3", "node4"), ("node4", "node1"),
    ]  # fmt: skip
    assert plan.shortfalls == ()


def test_with_no_room_anywhere_else_the_shortfall_names_the_node_and_the_room():
    two = ("node1", "node2")
    found = scans(scan("node1"), scan("node2", copies_free=1024))
    plan = copy_orders([_zero(20, two)], found, two, copies=1, margin_bytes=MARGIN)

    assert [(o.writer, o.destination) for o in plan.orders] == [("node2", "node1")]
    assert [s.message for s in plan.shortfalls] == [
        "global_step20: the part written by node1 has 0 of 1 copies (node2 has 1.0 KiB free "
        f"in {COPIES_DIR}, needs 4.9 KiB (a 1000 B margin included))"
    ]


def test_room_taken_by_an_earlier_order_counts():
    newer, older = replace(_zero(30), complete_at=20), _zero(20)
    tight = {**EVERYONE, "node2": scan("node2", copies_free=SHARD + SHARD // 2 + MARGIN)}
    plan = copy_orders([older, newer], tight, NODES, copies=1, margin_bytes=MARGIN)
    from_node1 = [(o.entry, o.destination) for o in plan.orders if o.writer == "node1"]
    assert from_node1 == [("global_step30", "node2"), ("global_step20", "node3")]


def test_a_silent_writer_or_destination_is_waited_for_or_passed_over():
    found = {node: one for node, one in EVERYONE.items() if node != "node3"}
    plan = copy_orders([_zero(20)], found, NODES, copies=1, margin_bytes=MARGIN)
    assert [(o.writer, o.destination) for o in plan.orders] == [
        ("node1", "node2"), ("node2", "node4"), ("node4", "node1"),
    ]  # fmt: skip


def test_incomplete_or_deleted_checkpoints_get_no_copies():
    writing = _checkpoint("checkpoint-600", {"node1": {"model.pt": 9}}, complete_at=None)
    deleted = _checkpoint("checkpoint-100", {}, gone=True)
    assert copy_orders([writing, deleted], EVERYONE, NODES, 1, MARGIN).orders == ()


def test_copies_of_a_checkpoint_the_writer_deleted_are_removed_everywhere():
    held = scans(
        scan("node1"),
        scan("node2", copies=(copy_doc("checkpoint-100", "node1", {"model.pt": 9}),
                              copy_doc("checkpoint-200", "node1", {"model.pt": 9}))),
        scan("node3", copies=(copy_doc("checkpoint-100", "node2", {"rng_state_1.pth": 9}),)),
        scan("node4", copies=(copy_doc("checkpoint-200", "node3", {"rng_state_2.pth": 9}),)),
    )  # fmt: skip
    deleted = _checkpoint("checkpoint-100", {}, gone=True)
    kept = _checkpoint("checkpoint-200", {"node1": {"model.pt": 9}})

    assert prune_orders([deleted, kept], held) == {
        "node2": ("checkpoint-200",),
        "node3": (),
    }


def test_the_ring_starts_after_the_writer():
    assert ring_after("node3", NODES) == ("node4", "node1", "node2")
    assert ring_after("gone", NODES) == NODES


@given(
    count=st.integers(min_value=1, max_value=5),
    copies=st.integers(min_value=0, max_value=5),
    roomy=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_orders_never_go_to_the_writer_or_twice_to_a_node_and_shortfalls_add_up(count, copies,
                                                                                roomy):  # fmt: skip
    nodes = NODES[:count] if count <= 4 else (*NODES, "node5")
    found = scans(*(scan(node, copies_free=10**9 if room else 0)
                    for node, room in zip(nodes, roomy, strict=False)))  # fmt: skip
    plan = copy_orders([_zero(20, nodes)], found, nodes, copies=copies, margin_bytes=MARGIN)

    for writer in nodes:
        destinations = [o.destination for o in plan.orders if o.writer == writer]
        assert writer not in destinations
        assert len(set(destinations)) == len(destinations)
        able = sum(roomy[i] for i, node in enumerate(nodes) if node != writer)
        assert len(destinations) == min(copies, able)
        short = [s for s in plan.shortfalls if s.writer == writer]
        assert bool(short) == (len(destinations) < copies)
