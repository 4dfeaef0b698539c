"""The job's page on values: what the model holds for a failed job, and what the HTML says."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from _report_job import CAUSE_NODE, CAUSE_RANK, EXCEPTION, HOSTILE, failed_job

from orchestrator.errors import OrchError
from orchestrator.records.job import AttemptRecord, log_file_name
from orchestrator.report import build_report, render_html, write_report
from orchestrator.report.model import FOLD_RANKS_ABOVE
from orchestrator.report.read import duration, shape, tail_lines
from orchestrator.report.timeline import timeline


@pytest.fixture
def run(tmp_path):
    return failed_job(tmp_path / "runs")


def test_the_model_names_the_cause_and_its_consequences(run):
    model = build_report(run.path)
    assert model.cause is not None
    assert (model.cause.node, model.cause.rank) == (CAUSE_NODE, CAUSE_RANK)
    assert model.cause.exception == EXCEPTION
    assert model.cause.then == "then 6 ranks failed after losing rank 5"
    assert [r.rank for r in model.consequences] == [1, 2, 3, 4, 6, 7]
    assert model.consequence_groups == (
        ("n1", "1-3", "killed by SIGTERM"), ("n2", "4,6-7", "killed by SIGTERM"),
    )  # fmt: skip
    assert [n.node for n in model.nodes if n.is_cause] == [CAUSE_NODE]
    assert model.verdict.startswith("Failed: rank 5 on n2: exited with code 1")
    assert (model.shape, model.duration, model.exit_code) == ("2 nodes × 4 ranks", "16s", 1)


def test_the_stacks_are_read_back_folded(run):
    stacks = build_report(run.path).stacks
    assert stacks is not None and stacks.problems == ()
    assert [(g.ranks, g.majority) for g in stacks.groups] == [("0", False), ("1-4,6-7", True)]
    assert stacks.groups[1].threads[0][1][0] == "torch/distributed/c10d.py:2501 all_reduce"


def test_the_html_shows_the_cause_and_every_node_and_rank(run):
    model = build_report(run.path)
    html = render_html(model)
    assert EXCEPTION in html and "then 6 ranks failed after losing rank 5" in html
    assert "ranks 4,6-7 on n2: killed by SIGTERM" in html
    for node in model.nodes:
        assert f'data-node="{node.node}"' in html
        assert f'href="logs/{node.node}.log"' in html
    for rank in model.ranks:
        assert f'data-rank="{rank.rank}"' in html
    assert re.search(r'<section id="cause" data-node="n2" data-rank="5"', html)


def test_nothing_in_the_page_leaves_the_file(run):
    html = render_html(build_report(run.path))
    assert "http://" not in html and "https://" not in html
    assert "<script" not in html.replace("&lt;script", "")  # no script, and none let in
    assert not re.search(r"""(src|href)=["'](?!logs/)""", html)
    assert "@import" not in html and "url(" not in html


def test_a_hostile_log_line_is_escaped(run):
    html = render_html(build_report(run.path))
    assert HOSTILE not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_many_ranks_fold_into_one_strip_per_node(tmp_path):
    per_node = FOLD_RANKS_ABOVE // 2 + 1
    model = build_report(failed_job(tmp_path, nodes=3, per_node=per_node).path)
    assert model.folded
    drawn = timeline(model)
    assert drawn is not None
    strips = [row for row in drawn.rows if row.css == "strip"]
    assert [row.node for row in strips] == ["n1", "n2", "n3"]
    assert [row for row in drawn.rows if row.rank is not None] == []  # no row per rank
    assert sorted(c.rank for row in strips for c in row.cells) == list(range(3 * per_node))
    html = render_html(model)
    assert all(f'data-rank="{rank}"' in html for rank in range(3 * per_node))


def test_the_timeline_marks_the_cause_row_and_the_first_failure(run):
    model = build_report(run.path)
    drawn = timeline(model)
    assert drawn is not None
    at_fault = [(row.node, row.rank) for row in drawn.rows if row.at_fault]
    assert at_fault == [(CAUSE_NODE, None), (CAUSE_NODE, CAUSE_RANK)]
    cause_row = next(row for row in drawn.rows if row.rank == CAUSE_RANK)
    failure = drawn.line("first-failure")
    assert failure is not None and "rank 5 on n2" in failure.title
    assert failure.x == pytest.approx(cause_row.bar[0] + cause_row.bar[1], abs=0.2)


def test_a_job_without_stacks_or_logs_still_has_a_page(tmp_path):
    run = failed_job(tmp_path, stacks=False)
    for log in run.logs.iterdir():
        log.unlink()
    model = build_report(run.path)
    assert model.stacks is None and all(n.log_href is None for n in model.nodes)
    assert "No output." in render_html(model)


def test_unreadable_stacks_are_named_not_fatal(run):
    (run.path / "stacks" / "teardown.json").write_text("{not json")
    stacks = build_report(run.path).stacks
    assert stacks is not None and stacks.groups == ()
    assert "unreadable" in stacks.problems[0]


def test_stacks_outside_the_job_directory_are_not_read(run):
    doc = json.loads(run.job_file.read_text())
    doc["teardown_stacks"] = "../../elsewhere.json"
    run.job_file.write_text(json.dumps(doc))
    stacks = build_report(run.path).stacks
    assert stacks is not None and "outside the job's directory" in stacks.problems[0]


def test_no_record_no_page(tmp_path):
    with pytest.raises(OrchError, match="no job record"):
        build_report(tmp_path)


def test_write_report_replaces_the_page_privately(run):
    path = write_report(run.path)
    assert path == run.path / "report.html"
    assert path.stat().st_mode & 0o777 == 0o600
    assert "rank 5" in path.read_text()


def test_a_log_tail_is_its_last_lines_read_from_its_end(tmp_path):
    log = tmp_path / "n1.log"
    log.write_bytes(b"".join(b"line %d " % i + b"x" * 200 + b"\n" for i in range(2000)))
    lines = tail_lines(log, count=3)
    assert [line.split()[1] for line in lines] == ["1997", "1998", "1999"]
    assert tail_lines(tmp_path / "missing.log") == ()


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(0.0, 16.4, "16s"), (0.0, 125.0, "2m 05s"), (0.0, 3725.0, "1h 02m 05s"), (None, 3.0, None)],
)
def test_duration_in_words(start, end, expected):
    assert duration(start, end) == expected


def test_shape_of_uneven_nodes_gives_the_totals(run):
    ranks = build_report(run.path).ranks
    assert shape(2, ranks) == "2 nodes × 4 ranks"
    assert shape(3, ranks) == "3 nodes, 8 ranks"
    assert shape(1, ()) == "1 node"


def test_a_job_of_several_attempts_lists_them_and_why_each_ended(run):
    lost = AttemptRecord(number=1, nodes=("n1", "n2", "n3"), started="t0", ended="t1",
                         exit_code=1, excluded=("n3",),
                         cause={"class": "node-lost", "message": "node lost: n3 (<gone>)",
                                "decision": "node-lost: a node was lost; restarting"})  # fmt: skip
    last = AttemptRecord(number=2, nodes=("n1", "n2"), started="t1", ended="t2", exit_code=0)
    run.save(replace(run.load(), attempts=(lost, last)))
    page = render_html(build_report(run.path))
    assert "The job ran 2 times under one id" in page
    assert '<tr data-attempt="1"><td>1</td><td>n1, n2, n3</td>' in page
    assert "node lost: n3 (&lt;gone&gt;): node-lost: a node was lost; restarting" in page
    assert "<td>n3</td></tr>" in page
    run.save(replace(run.load(), attempts=(last,)))
    assert 'id="attempts"' not in render_html(build_report(run.path))  # one attempt: no table


def test_the_page_says_which_environment_each_node_ran(run):
    from orchestrator.records.job import EnvironmentRecord

    record = run.load()
    env = EnvironmentRecord(reference="a" * 16, nodes={"n1": "a" * 16, "n2": "b" * 16},
                            pushed=("n1",), pushed_bytes=3 << 20)  # fmt: skip
    run.save(replace(record, environment=env))
    html = render_html(build_report(run.path))
    assert re.search(r'data-node="n1">.*<code>aaaaaaaaaaaa</code> \(pushed\)</td>', html)
    differs = r'data-node="n2">.*class="fingerprint st-error"><code>bbbbbbbbbbbb</code>'
    assert re.search(differs, html)
    assert "the head's environment was pushed to n1 first (3.0 MiB sent)" in html
    run.save(replace(record, environment=None))  # no pre-flight looked: no column, no line
    assert 'id="environment"' not in render_html(build_report(run.path))


def test_a_node_named_unlike_a_file_shows_its_log_as_the_writer_named_it(tmp_path):
    """Node names are made safe for a path when their log is written (`user@gpu1` ->
    `user_gpu1.log`); the page reads and links the file by that same name."""
    run = failed_job(tmp_path)
    record = run.load()
    odd = "user@n1"
    (run.logs / "n1.log").rename(run.logs / log_file_name(odd))
    run.save(replace(record, hosts=(odd, *record.hosts[1:]),
                     node_exit_codes={odd: 143, **record.node_exit_codes}))  # fmt: skip
    [row] = [row for row in build_report(run.path).nodes if row.node == odd]
    assert row.log_href == f"logs/{log_file_name(odd)}" == "logs/user_n1.log"
    assert row.last_lines and row.last_lines[-1].endswith("step 7 on n1")


def test_the_page_says_which_hang_threshold_held_and_what_quiet_work_was_seen(run):
    assert 'id="hang-watch">not looked for<' in render_html(build_report(run.path))
    watch = {"seconds": 184.5, "source": "quiet work seen",
             "quiet_work": ["rank 0 computing in evaluate (train.py:88); 7 ranks in barrier"]}
    record = replace(run.load(), hang_watch=watch)
    run.save(record)
    html = render_html(build_report(run.path))
    assert ('id="hang-watch">looked for after 184 s quiet (quiet work seen); quiet, but '
            "working: rank 0 computing in evaluate (train.py:88); 7 ranks in barrier<") in html
