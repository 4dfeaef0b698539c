"""A prepared job run to its end: the attempts loop, the runner (launch.py), teardown and
`orch kill`, raw logs, stacks, the re-check between attempts, --sbatch, the state shown."""
