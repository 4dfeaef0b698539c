"""Write docs/reference/recipe.schema.json, the JSON Schema of a recipe for editors, from the
recipe model (orchestrator/specs/recipe_schema.py); a test fails when the two disagree."""

from __future__ import annotations

from pathlib import Path

from orchestrator.specs.recipe_schema import SCHEMA_PATH, schema_text

SCHEMA = Path(__file__).resolve().parents[1] / SCHEMA_PATH

if __name__ == "__main__":
    SCHEMA.write_text(schema_text(), encoding="utf-8")
    print(SCHEMA)
