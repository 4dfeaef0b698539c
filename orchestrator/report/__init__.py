"""One page per job: runs/<job>/report.html, a pure function of the run directory's files.

`build_report` reads job.json, the teardown's stacks, the tail of each node's log and the
job's checkpoints into a frozen `ReportModel`; `render_html` draws it (jinja2 with
autoescaping, inline CSS and SVG, nothing fetched from anywhere); `write_report` puts it
beside the record.
"""

from __future__ import annotations

from orchestrator.report.model import ReportModel
from orchestrator.report.read import build_report
from orchestrator.report.render import render_html, write_report

__all__ = ["ReportModel", "build_report", "render_html", "write_report"]
