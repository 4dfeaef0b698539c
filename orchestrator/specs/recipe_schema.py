"""The JSON Schema of a recipe, generated from the recipe model (specs/recipe.py), for
editors: `scripts/recipe_schema.py` writes it to docs/reference/recipe.schema.json, and a
test holds that copy current. orch itself validates with the model, whose messages name
the line and the likely spelling. Pure."""

from __future__ import annotations

import json
from typing import Any

from orchestrator.specs.recipe import Recipe

SCHEMA_PATH = "docs/reference/recipe.schema.json"  # in the repository
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def recipe_schema() -> dict[str, Any]:
    """The schema of a recipe file, as a JSON-able document."""
    schema = Recipe.model_json_schema(mode="validation")
    # The model's docstring is for its readers; an editor shows the file's own description.
    schema["description"] = (
        "An orch recipe: the script, its arguments, the launcher and its options, the "
        "environment and the hosts of one training launch (orch submit RECIPE.yaml). "
        "${NAME} in a value is the head's environment variable, ${RECIPE_DIR} the "
        "recipe's directory."
    )
    return {"$schema": DIALECT, **schema}


def schema_text() -> str:
    """The schema as the committed file holds it."""
    return json.dumps(recipe_schema(), indent=2, sort_keys=True) + "\n"
