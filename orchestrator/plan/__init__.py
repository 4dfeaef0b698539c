"""A launch as a frozen value: every file, every command line, the agent's spec, decided
before anything runs. Pure: `--dry-run` prints it whole.
"""
