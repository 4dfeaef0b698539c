"""CLI commands (placeholder module, filled by its area)."""
