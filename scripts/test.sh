#!/usr/bin/env bash
# Install what the suite needs (scripts/setup.sh), then run lint and every test,
# integration tests on real loopback sshd nodes included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check orchestrator tests bench scripts
# The documentation site, warnings as errors (a broken link or page fails here).
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
exec .venv/bin/python -m pytest "$@"
