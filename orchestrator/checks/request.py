"""What a pre-flight is asked to check: the nodes, and the job as it would run there.

One value for both halves: the head gathers the facts for it (prepare/preflight.py's
run_preflight) and the pure report judges those facts against it (checks/report.py's
build_report). Pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from orchestrator.checks.environment import PushFix
from orchestrator.checks.model import Finding
from orchestrator.specs.constants import DEFAULT_MAIN_PORT

if TYPE_CHECKING:
    from orchestrator.specs.inventory import Hostfile


@dataclass(frozen=True)
class PreflightRequest:
    """The fields left None are the head's own until `on_head` fills them in (run_preflight
    does); build_report takes them as they are (a None workdir is not looked for)."""

    hostfile: Hostfile
    python: str  # the job's interpreter on every node ("": the head's own)
    workdir: str | None = None  # the job's working directory (None: the head's current one)
    script: str | None = None  # the training script to look for, relative to workdir
    main_port: int | None = None  # the rendezvous port node 0 holds open (None: the default)
    main_port_chosen: bool = False  # picked by orch as free on node 0 (none was given)
    main_address: str | None = None  # where the nodes reach node 0 (None: its name)
    env: Mapping[str, str] | None = None  # the job's environment (None: the head's)
    push: PushFix | None = None  # how the head's environment could reach the nodes, for fixes
    extra_findings: tuple[Finding, ...] = ()  # found on the head, reported with the rest

    def on_head(
        self, *, python: str, cwd: str, environ: Mapping[str, str]
    ) -> PreflightRequest:
        """The request with what it leaves open taken from the head (its interpreter,
        working directory and environment), node 0's name and orch's default port, and the
        script made absolute: the job runs in workdir on every node."""
        workdir = self.workdir or cwd
        script = self.script
        if script and not os.path.isabs(script):
            script = os.path.join(workdir, script)
        address = self.main_address or self.hostfile.names[0]
        port = DEFAULT_MAIN_PORT if self.main_port is None else self.main_port
        env = environ if self.env is None else self.env
        return replace(self, python=self.python or python, workdir=workdir, script=script,
                       main_port=port, main_address=address, env=env)  # fmt: skip
