"""What `orch doctor` prints for a report, at 64 nodes: the environment table fits the
width, node names are folded into node sets, the most important difference comes first."""

from __future__ import annotations

import io
from dataclasses import replace

from _doctor_facts import PY, facts
from rich.console import Console

from orchestrator.checks.model import NodeProbe
from orchestrator.checks.report import build_report
from orchestrator.checks.request import PreflightRequest
from orchestrator.cli.nodes.doctor_cmds import print_report
from orchestrator.probe.facts import Environment
from orchestrator.specs.inventory import parse_hostfile

NAMES = [f"gpu{i:02d}" for i in range(1, 65)]
DISTS = {f"pkg{i:03d}": "1.0" for i in range(60)} | {"torch": "2.13.0", "transformers": "4.46.1"}
WIDTH = 160


def env(dists: dict[str, str], print_: str) -> Environment:
    return Environment(print_, "cpython", "3.11.7", "cpython-311-x86_64-linux-gnu", "debian 12",
                       "glibc 2.36", "x86_64", dists)  # fmt: skip


def test_64_nodes_differences_grouped_and_folded_within_the_width() -> None:
    head = env(DISTS, "a" * 16)
    older = env(DISTS | {"transformers": "4.46.0"}, "b" * 16)
    drifted = env({**DISTS, **{f"pkg{i:03d}": "2.0" for i in range(40)}}, "c" * 16)
    def which(name: str) -> Environment:
        return {"gpu07": older, "gpu08": older, "gpu33": drifted}.get(name, head)

    probes_ = [facts(n, environment=which(n), resolved={}) for n in NAMES]
    hostfile = parse_hostfile("".join(f"{n} slots=8\n" for n in NAMES))
    request = PreflightRequest(hostfile, python=PY, workdir="/work", env={})
    report = build_report(request, [NodeProbe(f.node, f) for f in probes_], head_environment=head)
    out = io.StringIO()
    print_report(report, Console(file=out, width=WIDTH, highlight=False, color_system=None))
    text = out.getvalue()
    assert all(len(line) <= WIDTH for line in text.splitlines())
    assert ("environment fingerprints (reference: the head): aaaaaaaa on the head, "
            "gpu[01-06,09-32,34-64]; bbbbbbbb on gpu[07-08]; cccccccc on gpu33") in text
    rows = [line for line in text.splitlines() if "elsewhere" in line]
    assert "4.46.0 on gpu[07-08]; 4.46.1 elsewhere" in rows[0]  # the launcher's package first
    # 40 packages that differ the same way on one node: one row
    assert "pkg000, pkg001, pkg002, pkg003, pkg004, pkg005 and 34 more" in rows[1]
    assert "2.0 on gpu33; 1.0 elsewhere" in rows[1] and len(rows) == 2
    doc = report.to_dict()["environment"]
    assert doc["reference"] == "the head" and len(doc["differences"]) == 41
    assert doc["fingerprints"]["gpu33"] == "c" * 16


def test_parity_rows_fold_the_nodes_of_each_value() -> None:
    hostfile = parse_hostfile("".join(f"{n} slots=8\n" for n in NAMES))
    cuda = {n: "12.1" for n in NAMES[40:]}
    probes_ = [NodeProbe(n, replace(facts(n, resolved={}), torch_cuda=cuda.get(n))) for n in NAMES]
    report = build_report(PreflightRequest(hostfile, python=PY, workdir="/work", env={}), probes_)
    out = io.StringIO()
    print_report(report, Console(file=out, width=WIDTH, highlight=False, color_system=None))
    assert "12.1 on gpu[41-64]" in out.getvalue()
