"""Hostfiles and node sets, checked against DeepSpeed's own hostfile parser."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from deepspeed.launcher.runner import (
    _parse_hostfile,
    fetch_hostfile,
    parse_inclusion_exclusion,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import InputFileError, OrchError, UsageError
from orchestrator.specs.inventory import (
    Hostfile,
    HostSlots,
    expand_nodeset,
    filter_hosts,
    fold_nodeset,
    make_hostfile,
    nodes_text,
    parse_hostfile,
    read_hostfile,
    render_hostfile,
)

HOST_CHARS = string.ascii_letters + string.digits + "._-"
host_names = st.text(alphabet=HOST_CHARS, min_size=1, max_size=20).filter(
    lambda name: name[0] not in "-."
)
hostfiles = st.lists(
    st.tuples(host_names, st.integers(min_value=1, max_value=4096)),
    min_size=1,
    max_size=12,
    unique_by=lambda pair: pair[0],
).map(lambda pairs: Hostfile(tuple(HostSlots(h, s) for h, s in pairs)))


def test_parses_comments_blank_lines_and_trailing_comments() -> None:
    text = "# cluster\n\ngpu01 slots=8\n  gpu02   slots=4  # half a node\r\n"
    hostfile = parse_hostfile(text, source="hf")
    assert hostfile.hosts == (HostSlots("gpu01", 8), HostSlots("gpu02", 4))
    assert hostfile.names == ("gpu01", "gpu02")
    assert hostfile.total_slots == 12
    assert hostfile.source == "hf"


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a slots=8\nb slots=2\na slots=8\n", 3, "duplicate host 'a' (first listed on line 1)"),
        ("a slots=8\nb slots=0\n", 2, "slots=0"),
        ("a slots=8\n\nb\n", 3, "expected 'HOST slots=N'"),
        ("a slots=eight\n", 1, "expected 'slots=N'"),
        ("a slots=8 extra\n", 1, "expected 'HOST slots=N'"),
        ("a;reboot slots=8\n", 1, "not allowed"),
        ("$(id) slots=8\n", 1, "not allowed"),
        ("-oProxyCommand=x slots=1\n", 1, "not allowed"),
    ],
)
def test_bad_lines_name_file_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(InputFileError) as info:
        parse_hostfile(text, source="cluster.txt")
    assert info.value.line == line
    assert info.value.message.startswith(f"cluster.txt:{line}: ")
    assert words in info.value.message
    assert info.value.exit_code == 2


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_hostfile_is_an_error_not_a_one_node_run(text: str) -> None:
    with pytest.raises(InputFileError, match="hf: hostfile lists no hosts"):
        parse_hostfile(text, source="hf")


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(InputFileError) as info:
        read_hostfile(missing)
    assert str(missing) in info.value.message
    assert "not found" in info.value.message
    assert info.value.hint


def test_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match="directory"):
        read_hostfile(tmp_path)


def test_written_hostfile_reads_the_same_in_deepspeed(tmp_path: Path) -> None:
    hostfile = make_hostfile(expand_nodeset("gpu[01-04],10.0.0.7"), 8)
    path = tmp_path / "hostfile"
    path.write_text(render_hostfile(hostfile))
    pool = fetch_hostfile(str(path))
    assert list(pool.items()) == [(h.host, h.slots) for h in hostfile.hosts]
    assert read_hostfile(path) == hostfile


@pytest.mark.parametrize("text", ["*", "gpu*", "gpu0?", "a,n*"])
def test_a_wildcard_is_no_host_name_and_asks_no_group_source(text: str) -> None:
    # ClusterShell would expand it with its group sources' shell commands (in a fast test:
    # a child process, which fails it) into whatever hosts they list.
    with pytest.raises(UsageError, match="characters that are not allowed"):
        expand_nodeset(text)


def test_render_refuses_bad_values() -> None:
    with pytest.raises(UsageError):
        render_hostfile(Hostfile((HostSlots("a b", 1),)))
    with pytest.raises(UsageError):
        render_hostfile(Hostfile((HostSlots("a", 0),)))
    with pytest.raises(UsageError):
        render_hostfile(Hostfile(()))


@settings(max_examples=200)
@given(hostfiles)
def test_parse_of_render_is_identity_and_deepspeed_agrees(hostfile: Hostfile) -> None:
    text = render_hostfile(hostfile)
    assert parse_hostfile(text) == hostfile
    pool = _parse_hostfile(text.splitlines(keepends=True))
    assert list(pool.items()) == [(h.host, h.slots) for h in hostfile.hosts]


@settings(max_examples=300)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_project_errors(text: str) -> None:
    try:
        parsed = parse_hostfile(text)
    except InputFileError as err:
        assert err.message.startswith("<hostfile>")
        return
    # Whatever we accept, DeepSpeed reads the same way.
    pool = _parse_hostfile(text.split("\n"))
    assert list(pool.items()) == [(h.host, h.slots) for h in parsed.hosts]


@settings(max_examples=300)
@given(st.text(alphabet=HOST_CHARS + "[],-!&^@: ", max_size=40))
def test_arbitrary_nodeset_text_raises_only_project_errors(expr: str) -> None:
    try:
        names = expand_nodeset(expr)
    except UsageError:
        return
    assert names
    assert len(set(names)) == len(names)


@settings(max_examples=200)
@given(st.lists(host_names, min_size=1, max_size=30, unique=True))
def test_expand_of_fold_gives_the_same_names(names: list[str]) -> None:
    assert set(expand_nodeset(fold_nodeset(names))) == set(names)


def test_expand_keeps_written_order_and_drops_duplicates() -> None:
    assert expand_nodeset("gpu[01-03]") == ["gpu01", "gpu02", "gpu03"]
    assert expand_nodeset("c,a,b,a") == ["c", "a", "b"]
    assert expand_nodeset("z[1-2],a[3,5]") == ["z1", "z2", "a3", "a5"]
    assert expand_nodeset("gpu[01-04]!gpu02") == ["gpu01", "gpu03", "gpu04"]
    assert fold_nodeset(["gpu01", "gpu02", "gpu03", "x"]) == "gpu[01-03],x"


def test_node_names_for_reading_fold_and_keep_what_is_no_host_name() -> None:
    assert nodes_text(["gpu03", "gpu01", "gpu02", "x"]) == "gpu[01-03],x"
    assert nodes_text(["the head", "n2", "n1"]) == "the head, n[1-2]"
    assert nodes_text(["the head"]) == "the head"
    assert nodes_text([]) == ""
    assert nodes_text(["a;b", "n1"]) == "a;b,n1"  # no host name: shown, not refused


@pytest.mark.parametrize("expr", ["", "a[", "a[3-1]", "a,,b", "@gpus", "a[1-99999]", "a;b"])
def test_bad_nodesets_are_usage_errors(expr: str) -> None:
    with pytest.raises(UsageError) as info:
        expand_nodeset(expr)
    assert info.value.exit_code == 2


def _deepspeed_slots(hostfile: Hostfile, include: str = "", exclude: str = "") -> dict:
    pool = {h.host: h.slots for h in hostfile.hosts}
    return parse_inclusion_exclusion(pool, include, exclude)


def _deepspeed_filter(hostfile: Hostfile, include: str = "", exclude: str = "") -> dict:
    active = _deepspeed_slots(hostfile, include, exclude)
    return {host: len(slots) for host, slots in active.items()}


HF = make_hostfile(["node1", "node2", "node3"], 4)


@pytest.mark.parametrize(
    ("include", "exclude"),
    [
        ("node1:0,1@node2", None),
        ("node3@node1", None),
        ("node2:0", None),
        (None, "node2"),
        (None, "node1:3@node3:2,3"),
        (None, "node1:0,1,2,3"),
    ],
)
def test_filters_match_deepspeed(include: str | None, exclude: str | None) -> None:
    ours = filter_hosts(HF, include=include, exclude=exclude)
    theirs = _deepspeed_filter(HF, include or "", exclude or "")
    assert {h.host: h.slots for h in ours.hosts} == theirs


def test_filters_accept_node_sets() -> None:
    ours = filter_hosts(HF, include="node[1-2]")
    assert ours.names == ("node1", "node2")
    assert filter_hosts(HF, exclude="node[1,3]").names == ("node2",)


@pytest.mark.parametrize(
    ("include", "exclude", "words"),
    [
        ("node9", None, "'node9' is not in"),
        ("node1:4", None, "has no slot 4"),
        ("node1:x", None, "not a list of numbers"),
        (None, "node[1-3]", "leaves no hosts"),
        ("node1", "node2", "cannot be used together"),
        ("node1@@node2", None, "empty NODE"),
        ("node2:3", None, "keeps slots 3 of node2: orch runs a node's ranks on its first slots"),
        (None, "node1:0", "keeps slots 1,2,3 of node1"),
    ],
)
def test_bad_filters_are_usage_errors(include: str | None, exclude: str | None, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        filter_hosts(HF, include=include, exclude=exclude)


def test_no_filter_is_identity() -> None:
    assert filter_hosts(HF) is HF


def test_errors_are_orch_errors() -> None:
    assert issubclass(InputFileError, OrchError)


@st.composite
def filter_cases(draw: st.DrawFn) -> tuple[Hostfile, str]:
    count = draw(st.integers(1, 4))
    hostfile = make_hostfile(
        [f"h{i}" for i in range(count)], [draw(st.integers(1, 4)) for _ in range(count)]
    )
    chosen = draw(st.lists(st.sampled_from(hostfile.hosts), min_size=1, unique=True))
    specs = []
    for entry in chosen:
        slots = draw(st.lists(st.integers(0, entry.slots - 1), unique=True, max_size=entry.slots))
        specs.append(entry.host + (":" + ",".join(map(str, slots)) if slots else ""))
    return hostfile, "@".join(specs)


@settings(max_examples=150)
@given(filter_cases(), st.booleans())
def test_filters_agree_with_deepspeed_on_any_spec(
    case: tuple[Hostfile, str], include: bool
) -> None:
    hostfile, spec = case
    slots = _deepspeed_slots(hostfile, *((spec, "") if include else ("", spec)))
    theirs = {host: len(ids) for host, ids in slots.items() if ids}
    # DeepSpeed's ranks would run on exactly these GPUs; orch's on a node's first ones.
    elsewhere = any(list(ids) != list(range(len(ids))) for ids in slots.values())
    try:
        ours = filter_hosts(hostfile, **({"include": spec} if include else {"exclude": spec}))
    except UsageError as refused:
        # refused only when nothing is left, or when the slots kept are not a node's first
        assert not theirs or (elsewhere and "keeps slots" in str(refused))
        return
    assert not elsewhere
    assert {h.host: h.slots for h in ours.hosts} == theirs


SHIPPED_HOSTFILES = sorted((Path(__file__).resolve().parents[2] / "hostfiles").iterdir())


@pytest.mark.parametrize("path", SHIPPED_HOSTFILES, ids=lambda p: p.name)
def test_shipped_example_hostfiles_read_the_same_in_deepspeed(path: Path) -> None:
    ours = read_hostfile(path)
    assert list(fetch_hostfile(str(path)).items()) == [(h.host, h.slots) for h in ours.hosts]
