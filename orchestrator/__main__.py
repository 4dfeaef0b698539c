"""`python -m orchestrator`: the same as the `orch` command (the batch scripts of
`orch submit --sbatch` use it, so they need no console script on PATH)."""

from orchestrator.cli.main import main

main()
