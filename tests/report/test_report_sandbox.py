"""The page of real jobs on sandbox nodes, in headless Chromium: a job with a straggler
names it, a failed job shows its failing rank and error; every node and rank is on the
page, the pre-flight's table too, and the terminal summary gives the page's path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _chromium import CHROMIUM, chromium, png_pixels
from launch_support import REPO, free_port, job_ids, run_orch

from orchestrator.run.straggler_watch import FIRST_AFTER_S

STRAGGLER_JOB = str(REPO / "tests" / "jobs" / "straggler.py")
STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
SLOW_RANK = 3
FAIL_RANK = 1

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


@pytest.fixture(scope="module")
def cluster(sandbox_factory):
    return sandbox_factory(2, 2)


def _launch(cluster, runs: Path, *script_args: str, doctor: bool = True,
            job: str = STRAGGLER_JOB):  # fmt: skip
    _box, state = cluster
    args = [
        "launch", "--hostfile", state.hostfile, "--launcher", "torchrun", "--nproc-per-node",
        "2", "--main-port", str(free_port()), *([] if doctor else ["--no-doctor"]),
        job, "--", *script_args,
    ]  # fmt: skip
    done = run_orch(args, runs, timeout=300)
    (job,) = job_ids(runs)
    nodes = [node.name for node in state.nodes]
    return done, runs / job, nodes


def _page(done, run: Path) -> Path:
    """The page the summary names, and it is the job's own."""
    found = re.search(r"^report: (.+)$", done.stderr + done.stdout, re.M)
    assert found is not None, done.stderr
    page = Path(found.group(1))
    assert page == run / "report.html" and page.is_file()
    assert page.stat().st_mode & 0o777 == 0o600
    return page


def _present(dom: str, nodes: list[str], ranks: int) -> None:
    assert {int(r) for r in re.findall(r'data-rank="(\d+)"', dom)} == set(range(ranks))
    assert set(nodes) <= set(re.findall(r'data-node="([^"]+)"', dom))


def test_a_straggler_is_named_on_the_page(cluster, tmp_path):
    done, run, nodes = _launch(cluster, tmp_path / "runs", "--steps", "30", "--step", "0.1",
                               "--slow-rank", str(SLOW_RANK), "--slow-factor", "3")  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = _page(done, run)
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    _present(dom, nodes, 4)
    slowest = re.search(r'<p id="slowest"[^>]*>([^<]*)</p>', dom)
    assert slowest is not None, "no slowest rank on the page"
    assert slowest.group(1).startswith(f"slowest: rank {SLOW_RANK} on {nodes[1]}, "), slowest
    ratio = float(re.search(r", ([\d.]+)x the median", slowest.group(1)).group(1))
    assert 2.0 <= ratio <= 4.0  # 3x its peers' step time, give or take the machine's load
    parity = re.search(r'<section id="parity">(.*?)</section>', dom, re.S)
    assert parity is not None and all(f'data-node="{n}"' in parity.group(1) for n in nodes)
    assert len(re.findall(r'<polyline class="rank-line', dom)) == 4

    shot = tmp_path / "shot.png"
    chromium(tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,1600",
             page.as_uri())  # fmt: skip
    _width, _height, pixels = png_pixels(shot)
    assert len(set(pixels)) > 100  # text, bars and colours, not one background


# Synchronous training, as a new user meets it: every rank steps at the slowest's pace, so
# step times cannot tell the straggler; the profile orch takes as the job runs does.
SYNCHRONOUS = ("--pause", "0.05", "--sync-every", "10", "--print-every", "10",
               "--max-seconds", str(FIRST_AFTER_S + 12))  # fmt: skip


def _top_sentence(dom: str) -> re.Match[str]:
    found = re.search(r'<p id="slowest" class="([^"]*)" data-node="([^"]+)" data-rank="(\d+)">'
                      r"([^<]*)", dom)  # fmt: skip
    assert found is not None, "no sentence on the ranks' pace"
    return found


def test_in_synchronous_training_the_rank_the_others_wait_for_is_named(cluster, tmp_path):
    slow = ("--slow-rank", str(SLOW_RANK), "--slow-factor", "3")
    done, run, nodes = _launch(cluster, tmp_path / "runs", *SYNCHRONOUS, *slow, doctor=False,
                               job=STEPPING)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"profile: waited for: rank {SLOW_RANK} on {nodes[1]}" in done.stdout
    dom = chromium(tmp_path / "profile", "--dump-dom", _page(done, run).as_uri()).stdout
    top = _top_sentence(dom)
    assert (top.group(1), top.group(2), int(top.group(3))) == ("slowest apart", nodes[1],
                                                               SLOW_RANK)  # fmt: skip
    said = top.group(4)
    assert said.startswith(f"waited for: rank {SLOW_RANK} on {nodes[1]} (the other ranks wait ")
    assert "stepping.py" in said  # where it stands: its own code, not a collective
    assert "by orch, while the job ran" in dom


def test_in_synchronous_training_without_a_straggler_none_stands_apart(cluster, tmp_path):
    done, run, _nodes = _launch(cluster, tmp_path / "runs", *SYNCHRONOUS, doctor=False,
                                job=STEPPING)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "profile: no rank stands apart" in done.stdout
    dom = chromium(tmp_path / "profile", "--dump-dom", _page(done, run).as_uri()).stdout
    assert "waited for:" not in dom
    assert re.search(r'<section id="profile">.*no clear straggler', dom, re.S)


def test_a_failed_job_shows_its_failing_rank_and_error(cluster, tmp_path):
    done, run, nodes = _launch(cluster, tmp_path / "runs", "--steps", "200", "--step", "0.05",
                               "--fail-rank", str(FAIL_RANK), "--fail-at", "20",
                               doctor=False)  # fmt: skip
    assert done.returncode == 1, done.stderr
    page = _page(done, run)
    dom = chromium(tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    _present(dom, nodes, 4)
    error = f"RuntimeError: rank {FAIL_RANK} hit a bad batch at step 20"
    cause = re.search(r'<section id="cause" data-node="([^"]+)" data-rank="(\d+)"[^>]*>(.*?)'
                      r"</section>", dom, re.S)  # fmt: skip
    assert cause is not None
    assert (cause.group(1), int(cause.group(2))) == (nodes[0], FAIL_RANK)
    assert error in cause.group(3) and "Traceback (most recent call last)" in cause.group(3)
    lane = re.search(r'<details class="lane at-fault" data-node="([^"]+)"', dom)
    assert lane is not None and lane.group(1) == nodes[0]
    assert 'class="moment m-first-failure"' in dom and "teardown" in dom
