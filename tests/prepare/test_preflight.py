"""The pre-flight: the head's side of environment parity (what the script imports, by
distribution), and the probe of every node over a fake transport."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from orchestrator.checks.model import DoctorReport
from orchestrator.checks.request import PreflightRequest
from orchestrator.nodes.fake import FakeCall, FakeNode, FakeTransport, Reply
from orchestrator.prepare.preflight import run_preflight, script_packages
from orchestrator.specs.inventory import Hostfile, HostSlots

PY = "/opt/venv/bin/python"  # not on the head: its environment is not read


def test_the_scripts_imports_are_named_by_their_distributions(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os, torch\nfrom accelerate import Accelerator\nimport yaml\n")
    assert script_packages(str(script)) == {"torch", "accelerate", "pyyaml"}
    assert script_packages(str(tmp_path / "missing.py")) == frozenset()


# ----- the pre-flight over a fake transport: what is sent where, and who is named ----------
def _request(call: FakeCall) -> dict[str, Any]:
    """The probe's request, the command's last word (probe/commands.py)."""
    return json.loads(shlex.split(call.command)[-1])


def _probe(call: FakeCall) -> Reply:
    """A healthy node's probe: node 0 says it holds the main port first, then its facts."""
    main = _request(call)["main"] or {}
    facts: dict[str, Any] = {
        "probe_version": 1, "hostname": call.node, "os": "Debian 12", "kernel": "6.1",
        "python": {"requested": PY, "found": True, "executable": PY, "version": "3.11.7"},
        "workdir": {"path": "/work", "exists": True},
        "resolve": {name: [f"10.0.0.{name[-1]}"] for name in ("n1", "n2", "n3")},
    }  # fmt: skip
    first = ""
    if main.get("role") == "listen":
        first = json.dumps({"listening": True}) + "\n"
        facts["main_listen"] = {"port": main["port"], "free": True, "peers": []}
    elif main.get("role") == "connect":
        facts["main_connect"] = {"ok": True}
    return Reply(stdout=first + json.dumps(facts) + "\n")


def _preflight(fake: FakeTransport) -> DoctorReport:
    hosts = Hostfile(tuple(HostSlots(name, 1) for name in fake.nodes))
    request = PreflightRequest(hosts, python=PY, workdir="/work", env={})
    return run_preflight(request, timeout=5.0, probe_timeout=5.0, transport=fake)


def test_a_node_that_does_not_answer_is_named_and_the_others_are_still_checked() -> None:
    fake = FakeTransport([FakeNode("n1", _probe), FakeNode("n2", _probe).refuse(),
                          FakeNode("n3", _probe)])  # fmt: skip
    report = _preflight(fake)
    assert {n.node: n.reachable for n in report.nodes} == {"n1": True, "n2": False, "n3": True}
    assert [f.problem for f in report.errors if f.node == "n2"] == ["n2: connection refused"]
    assert {n.node for n in report.nodes if n.facts is not None} == {"n1", "n3"}
    # node 0 held the port until told the others were done; they were sent to it
    assert [(s.node, s.sent) for s in fake.started] == [("n1", b"done\n")]
    assert [_request(c)["main"]["role"] for c in fake.calls] == ["listen", "connect", "connect"]
    assert {_request(c)["main"]["address"] for c in fake.calls[1:]} == {"n1"}
    assert [c.answered for c in fake.calls] == [True, False, True]


def test_without_node_0_the_others_are_probed_without_the_network_check() -> None:
    fake = FakeTransport([FakeNode("n1", _probe).time_out(), FakeNode("n2", _probe),
                          FakeNode("n3", _probe)])  # fmt: skip
    report = _preflight(fake)
    assert {n.node for n in report.nodes if n.facts is not None} == {"n2", "n3"}
    assert [f.problem for f in report.errors if f.node == "n1"] == ["n1: no answer within 5s"]
    assert fake.started == [] and [_request(c)["main"] for c in fake.calls[1:]] == [None, None]
