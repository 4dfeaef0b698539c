"""The recipe's JSON Schema (for editors): the committed copy is the one the model gives,
every shipped recipe validates against it, and a misspelled key does not. jsonschema is not
a dependency: `_problems` checks the keywords pydantic's schemas use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.specs.recipe_schema import SCHEMA_PATH, recipe_schema, schema_text

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}  # fmt: skip


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False  # YAML's true is no number
    return isinstance(value, _TYPES[kind])


def _problems(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str) -> list[str]:
    """Where `value` breaks `schema` (its $ref, anyOf, type, enum, bounds, properties)."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema and all(_problems(value, s, root, at) for s in schema["anyOf"]):
        return [f"{at}: {value!r} matches none of {schema['anyOf']}"]
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    if kinds and not any(_is(value, kind) for kind in kinds):
        return [f"{at}: {value!r} is not {kinds}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{at}: {value!r} not in {schema['enum']}"]
    if _is(value, "number") and (value < schema.get("minimum", value)
                                 or value > schema.get("maximum", value)):  # fmt: skip
        return [f"{at}: {value!r} out of bounds"]
    if isinstance(value, dict):
        return _object_problems(value, schema, root, at)
    if isinstance(value, list) and "items" in schema:
        return [p for i, item in enumerate(value)
                for p in _problems(item, schema["items"], root, f"{at}.{i}")]  # fmt: skip
    return []


def _object_problems(value: dict, schema: dict[str, Any], root: dict[str, Any],
                     at: str) -> list[str]:  # fmt: skip
    found = [f"{at}: missing {key!r}" for key in schema.get("required", ()) if key not in value]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            found += _problems(item, properties[key], root, f"{at}.{key}")
        elif extra is False:
            found.append(f"{at}: unknown key {key!r}")
        elif isinstance(extra, dict):
            found += _problems(item, extra, root, f"{at}.{key}")
    return found


def test_the_committed_schema_is_the_models() -> None:
    committed = (ROOT / SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == schema_text(), "run: python scripts/recipe_schema.py"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_validates_against_the_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    schema = recipe_schema()
    assert _problems(data, schema, schema, path.stem) == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"name": "r", "script": "t.py", "launcer": "pdsh"}, "unknown key 'launcer'"),
        ({"name": "r", "script": "t.py", "accelerate": {"zero_stage": 5}}, "not in [0, 1, 2, 3]"),
        ({"name": "r"}, "missing 'script'"),
        ({"name": "r", "script": "t.py", "env": {"FLAG": True}}, "True is not"),
        ({"name": "r", "script": "t.py", "source": "x"}, "unknown key 'source'"),
    ],
)
def test_a_recipe_orch_refuses_breaks_the_schema(data: dict, problem: str) -> None:
    schema = recipe_schema()
    assert any(problem in p for p in _problems(data, schema, schema, "r")), data


def test_the_schema_is_json_of_the_2020_12_dialect() -> None:
    schema = json.loads(schema_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False and schema["required"] == ["name", "script"]
