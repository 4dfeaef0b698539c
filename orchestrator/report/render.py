"""The report as one self-contained HTML file: jinja2 with autoescaping (every log line,
command and frame is the job's own text, and may hold markup), inline CSS and SVG, no
script and nothing fetched from anywhere, so that it reads the same offline years later."""

from __future__ import annotations

import os
from pathlib import Path

import jinja2

from orchestrator.errors import OrchError
from orchestrator.outcome.states import JobState
from orchestrator.records.job import REPORT_FILE
from orchestrator.report.charts import progress_chart
from orchestrator.report.clock import since
from orchestrator.report.model import ReportModel, how
from orchestrator.report.read import build_report
from orchestrator.report.timeline import timeline
from orchestrator.specs.units import format_bytes

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("orchestrator.report", "templates"),
    autoescape=True,  # the template is HTML whatever its name: escape everything put in
    undefined=jinja2.StrictUndefined,  # a misspelt field fails the tests, not the page
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.globals.update(since=since, how=how, format_bytes=format_bytes)


def render_html(model: ReportModel) -> str:
    try:
        return _ENV.get_template("report.html.j2").render(
            m=model, t=timeline(model), p=progress_chart(model)
        )
    except jinja2.TemplateError as err:
        raise OrchError(f"the report of job {model.job_id} could not be drawn ({err})") from err


def write_report(run_dir: Path, state: JobState | None = None) -> Path:
    """runs/<job>/report.html, replaced whole (a reader never sees half a page), as private
    as the rest of the job's directory; `state` as build_report takes it."""
    path = Path(run_dir) / REPORT_FILE
    html = render_html(build_report(Path(run_dir), state))
    tmp = path.with_name(f".{REPORT_FILE}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(html)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    return path
