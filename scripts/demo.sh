#!/usr/bin/env bash
# One command from a fresh machine: install what orch needs, bring up a 4-node
# loopback cluster of real sshd nodes, check it with `orch doctor`, then run the
# cpu-smoke recipe on it (real accelerate + DeepSpeed training on CPU, pdsh launcher).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
hostfile=$(orch sandbox up --nodes 4 --slots 2)
echo "== sandbox hostfile: $hostfile"
cat "$hostfile"
echo "== orch doctor --hostfile $hostfile"
orch doctor --hostfile "$hostfile" --script recipes/scripts/cpu_smoke.py
echo "== orch submit recipes/cpu-smoke.yaml --hostfile $hostfile"
set +e
orch submit recipes/cpu-smoke.yaml --hostfile "$hostfile"
code=$?
set -e
echo "== job exit code: $code (records under ./runs; the sandbox stays up: orch sandbox down)"
exit "$code"
