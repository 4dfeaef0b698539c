"""Command-line interface: the only part of orch that prints or exits."""
