"""The job commands: launch, submit, status, logs, stop, kill, stacks, checkpoints, report."""
