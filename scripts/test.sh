#!/usr/bin/env bash
# Install what the suite needs (scripts/setup.sh), then run lint and every test,
# integration tests on real loopback sshd nodes included.
#
# The tests run in ORCH_TEST_WORKERS processes (pytest-xdist; 4 by default, 0 for none):
# most of a sandbox test's time is spent waiting on nodes, jobs and timeouts, not on the
# CPU. Each module runs whole in one worker (--dist loadfile), so its sandbox is brought
# up once; each worker has its own temporary home (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check orchestrator tests bench scripts
# The documentation site, warnings as errors (a broken link or page fails here).
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
exec .venv/bin/python -m pytest -n "${ORCH_TEST_WORKERS:-4}" --dist loadfile "$@"
