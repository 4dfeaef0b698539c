"""YAML read with the line of every key, so a problem in a file (a recipe) names its line:
`load_yaml_with_lines` gives the data and each key path's 1-based line. Pure."""

from __future__ import annotations

from typing import Any

import yaml

from orchestrator.errors import InputFileError


def line_for(loc: tuple, lines: dict[tuple, int]) -> int | None:
    """The line of the longest prefix of `loc` present in the file."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def load_yaml_with_lines(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """Parse YAML and map each key path (('accelerate', 'zero_stage')) to its 1-based line."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        raise InputFileError(source, f"not valid YAML: {err.problem}", line=line) from None
    except yaml.YAMLError as err:
        raise InputFileError(source, f"not valid YAML: {err}") from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _record_lines(node, (), lines, source, set())
    return data, lines


def _record_lines(
    node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str, seen: set[int]
) -> None:
    if id(node) in seen:  # an alias of a node already walked (or a recursive one)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _scalar_key(key_node)
            here = (*path, key)
            if here in lines:
                raise InputFileError(
                    source,
                    f"duplicate key {'.'.join(map(str, here))!r} (first on line {lines[here]})",
                    line=key_node.start_mark.line + 1,
                )
            lines[here] = key_node.start_mark.line + 1
            _record_lines(value_node, here, lines, source, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _record_lines(item, (*path, index), lines, source, seen)


def _scalar_key(node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        # Same value safe_load gives the key (so 3 and '3' stay apart like in the data).
        return _construct(node)
    return repr(node.value)


def _construct(node: yaml.ScalarNode) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node)
    except yaml.YAMLError:  # e.g. the '<<' merge key
        return node.value
    finally:
        loader.dispose()
