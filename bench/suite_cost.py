"""Where the test suite's time goes: the CPU and wall time of every test, with everything it
started (sandbox nodes, ranks, Slurm daemons, orch commands) counted, not only the test's
own process.

A pytest plugin: each pytest process (each xdist worker) moves itself into a cpuacct
cgroup of its own (cgroup v1, root only), which every process it starts inherits, however
far it is re-parented; a test's CPU is that cgroup's usage over the test's setup, call and
teardown. Daemons a module keeps between tests are counted against the test that runs
while they work. One JSON line per test goes to $ORCH_SUITE_COST (default
bench/results/suite-cost.jsonl); `python bench/suite_cost.py FILE` sums them per module.

    ORCH_SUITE_COST=/tmp/cost.jsonl bash scripts/test.sh -p bench.suite_cost
    .venv/bin/python bench/suite_cost.py /tmp/cost.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

_CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "suite-cost.jsonl"


def _usage_s(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e9


def _own_group() -> Path | None:
    if os.geteuid() != 0 or not (_CPUACCT / "cgroup.procs").exists():
        return None
    group = _CPUACCT / f"orch-suite-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    return group


_GROUP: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _GROUP
    # Under xdist the controller starts no test: only the workers measure.
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None):
        _GROUP = _own_group()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if _GROUP is None:
        yield
        return
    wall, cpu = time.monotonic(), _usage_s(_GROUP)
    yield
    line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 3),
            "cpu_s": round(_usage_s(_GROUP) - cpu, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}  # fmt: skip
    out = Path(os.environ.get("ORCH_SUITE_COST", _DEFAULT_OUT))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as stream:  # one short line per write: workers append safely
        stream.write(json.dumps(line) + "\n")


def summary(lines: list[dict[str, object]], top: int = 40) -> str:
    """Per module: CPU and wall seconds, most CPU first, with the totals."""
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for line in lines:
        module = str(line["test"]).split("::")[0]
        cpu[module] += float(line["cpu_s"])  # type: ignore[arg-type]
        wall[module] += float(line["wall_s"])  # type: ignore[arg-type]
        count[module] += 1
    rows = sorted(cpu, key=lambda m: -cpu[m])
    out = [f"{'CPU s':>8} {'wall s':>8} {'tests':>5}  module"]
    out += [f"{cpu[m]:8.0f} {wall[m]:8.0f} {count[m]:5d}  {m}" for m in rows[:top]]
    out.append(f"{sum(cpu.values()):8.0f} {sum(wall.values()):8.0f} "
               f"{sum(count.values()):5d}  all {len(rows)} modules")  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else _DEFAULT_OUT
    print(summary([json.loads(text) for text in path.read_text().splitlines() if text]))
