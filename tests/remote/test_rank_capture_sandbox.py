"""Every rank on its own output channel, through each launcher, on a 3-node x 2-slot sandbox.

One job per launcher (pdsh: accelerate + DeepSpeed through pdsh, standard: accelerate on
each node, torchrun) runs tests/jobs/rank_chatter.py: six ranks write a few hundred short
lines on stdout and stderr at the same time, each line in two unbuffered writes (text,
then "\\n"), with \\r progress bars on both streams. Then, per launcher:

- every line of every rank is in its node's head-side log exactly once, whole, under the
  rank's own `r<rank>/<local rank>` token, and no line holds text of two ranks;
- `orch logs JOB --rank R` prints exactly rank R's lines (`--raw`: its raw files);
- the raw per-rank files that come back hold exactly what the rank wrote;
- hostile script arguments and `--env` values reach every rank byte for byte, and no shell
  ran them;
- a head variable forwarded with `--env NAME` reaches the ranks, another one does not, and
  neither value is kept anywhere in the job's record or on the nodes, nor is it on any
  process's command line while the job runs.

Which node runs which rank is read from the agents' `orch rank` notes, not assumed.
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _logmodel import TS_LEN, expected_log, rank_tag, read_log
from launch_support import ORCH, REPO, job_ids, orch_env

from orchestrator.remote.agent_spec import runs_root
from orchestrator.run.plan_files import head_private_dir

pytestmark = pytest.mark.sandbox

CHATTER = str(REPO / "tests" / "jobs" / "rank_chatter.py")
LAUNCHERS = ("pdsh", "standard", "torchrun")
NODES, SLOTS = 2, 2
LINES = 200  # per stream and rank (rank_chatter.py's CHATTER_LINES)
BAR_EVERY, BAR_FRAMES = 25, 5  # as rank_chatter.py draws its bars
NODE_RUNS = Path(runs_root(os.getuid()))  # where the agents keep a job's node-local files
TAG = uuid.uuid4().hex[:8]  # makes this session's secrets unique to grep for
SECRET_A = f"orch-test-secret-{TAG}"  # in the head's environment, never forwarded
DATABASE_URL = f"postgres://user:pa55word{TAG}@db/x"  # forwarded with `--env DATABASE_URL`
SECRET_BYTES = (SECRET_A.encode(), DATABASE_URL.encode(), f"pa55word{TAG}".encode())


def hostile_args(tmp: Path) -> list[str]:
    return ["a b", "it's", 'say "hi"', f"$(touch {tmp}/pwned)", f"`touch {tmp}/pwned2`",
            "x;y", "*", "line1\nline2", "", "naïve ✓"]  # fmt: skip


def hostile_env(tmp: Path) -> str:
    return f"$(touch {tmp}/pwned3) \"q\" it's `touch {tmp}/pwned4`; echo 'x'"


@dataclass
class Job:
    launcher: str
    tmp: Path  # where the hostile words would create files if a shell ran them
    runs: Path
    job_id: str
    result: subprocess.CompletedProcess[bytes]
    cmdlines: dict[int, bytes] = field(default_factory=dict)  # pid -> last command line seen

    @property
    def run(self) -> Path:
        return self.runs / self.job_id

    def log(self, node: str) -> Path:
        return self.run / "logs" / f"{node}.log"

    def hosts(self) -> list[str]:
        return json.loads((self.run / "job.json").read_text())["hosts"]

    def succeeded(self) -> None:
        assert self.result.returncode == 0, self.result.stderr.decode(errors="replace")[-4000:]

    def placement(self) -> dict[int, tuple[str, int]]:
        """rank -> (node, local rank), from each agent's `orch rank` notes."""
        found: dict[int, tuple[str, int]] = {}
        for node in self.hosts():
            for tag, text in read_log(self.log(node)):
                if tag == b"orch" and text.startswith(b"rank "):
                    rank = int(re.search(rb"\brank=(\d+)", text).group(1))
                    local = int(re.search(rb"\blocal_rank=(\d+)", text).group(1))
                    assert b'node="%s"' % node.encode() in text, text
                    assert rank not in found, f"rank {rank} announced twice"
                    found[rank] = (node, local)
        return found


# ----- what each rank writes (rank_chatter.py), built here independently ---------------
def report_line(job: Job) -> bytes:
    report = {
        "argv": hostile_args(job.tmp),
        "env": {"HOSTILE": hostile_env(job.tmp)},
        "sha256": {
            "DATABASE_URL": hashlib.sha256(DATABASE_URL.encode()).hexdigest(),
            "ORCH_TEST_SECRET_A": None,  # not forwarded: the rank must not have it
        },
    }
    return json.dumps(report).encode()


def _bar(label: bytes, name: bytes) -> tuple[bytes, bytes]:
    """(the raw bytes of a bar, the line a terminal keeps of it)."""
    frames = [b"%s bar %s %d/%d" % (label, name, k, BAR_FRAMES) for k in range(BAR_FRAMES + 1)]
    return b"".join(b"\r" + f for f in frames) + b"\n", frames[-1]


def rank_output(rank: int, stream: bytes, report: bytes) -> tuple[bytes, list[bytes]]:
    """(the bytes rank `rank` writes to `stream`, the lines its head-side log must hold)."""
    label = b"@chat r%d %s" % (rank, stream)
    raw, lines = [], []
    if stream == b"out":
        raw.append(report + b"\n")
        lines.append(report)
    for i in range(LINES):
        raw.append(b"%s line %d\n" % (label, i))
        lines.append(b"%s line %d" % (label, i))
        if i % BAR_EVERY == BAR_EVERY - 1:
            data, final = _bar(label, b"%d" % (i // BAR_EVERY))
            raw.append(data)
            lines.append(final)
    data, final = _bar(label, b"end")
    raw.append(data)
    lines.append(final)
    return b"".join(raw), lines


# ----- the jobs: one per launcher, shared by the tests below ----------------------------
_BASE64_WORD = re.compile(rb"[A-Za-z0-9+/]{64,}={0,2}")


class CmdlineSampler:
    """Reads /proc/*/cmdline of every process on this machine, again and again, until stopped."""

    def __init__(self, interval: float = 0.25) -> None:
        self.seen: dict[int, bytes] = {}
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        with open(f"/proc/{entry}/cmdline", "rb") as handle:
                            data = handle.read()
                    except OSError:
                        continue
                    if data:
                        self.seen[int(entry)] = data
            self._stop.wait(self._interval)

    def stop(self) -> dict[int, bytes]:
        self._stop.set()
        self._thread.join(10)
        return self.seen


@pytest.fixture(scope="module")
def cluster(sandbox_factory):
    return sandbox_factory(NODES, SLOTS)


@pytest.fixture(scope="module", params=LAUNCHERS)
def job(request, cluster, tmp_path_factory) -> Job:
    launcher = request.param
    _box, state = cluster
    tmp = tmp_path_factory.mktemp(f"hostile-{launcher}")
    runs = tmp_path_factory.mktemp(f"runs-{launcher}")
    args = [
        "launch", "--hostfile", state.hostfile, "--launcher", launcher,
        "--nproc-per-node", str(SLOTS), "--no-doctor", "--keep-remote-logs",
        "--env", f"HOSTILE={hostile_env(tmp)}",
        "--env", "DATABASE_URL",  # no value: the head's
        "--env", "CHATTER_NAMES=HOSTILE",
        "--env", "CHATTER_SECRETS=DATABASE_URL,ORCH_TEST_SECRET_A",
        "--env", f"CHATTER_LINES={LINES}",
        "--env", "CHATTER_SLEEP=2",  # the ranks stay up a moment for the sampler
        CHATTER, "--", *hostile_args(tmp),
    ]  # fmt: skip
    env = {**orch_env(runs), "ORCH_TEST_SECRET_A": SECRET_A, "DATABASE_URL": DATABASE_URL}
    sampler = CmdlineSampler()
    try:
        result = subprocess.run([*ORCH, *args], cwd=REPO, env=env, capture_output=True,
                                timeout=600, check=False)  # fmt: skip
    finally:
        cmdlines = sampler.stop()
    ids = job_ids(runs)
    assert len(ids) == 1, result.stderr.decode(errors="replace")[-3000:]
    job_id = ids[0]
    yield Job(launcher, tmp, runs, job_id, result, cmdlines)
    shutil.rmtree(NODE_RUNS / job_id, ignore_errors=True)  # kept by --keep-remote-logs


# ----- the tests ----------------------------------------------------------------------
def test_each_node_announces_its_own_two_ranks(job: Job) -> None:
    job.succeeded()
    placement = job.placement()
    assert sorted(placement) == list(range(NODES * SLOTS))
    by_node = collections.defaultdict(list)
    for node, local in placement.values():
        by_node[node].append(local)
    assert {node: sorted(locals_) for node, locals_ in by_node.items()} == {
        node: list(range(SLOTS)) for node in job.hosts()
    }


def test_every_line_of_every_rank_arrives_once_whole_under_its_own_token(job: Job) -> None:
    job.succeeded()
    placement = job.placement()
    report = report_line(job)
    entries = {node: read_log(job.log(node)) for node in job.hosts()}  # also: no \r anywhere
    for rank, (node, local) in placement.items():
        for stream in (b"out", b"err"):
            _raw, want = rank_output(rank, stream, report)
            got = [text for tag, text in entries[node] if tag == rank_tag(rank, local, stream)]
            assert got == want, (job.launcher, rank, stream)
    # Nothing else carries a rank token (no `out+` pieces, no token on the wrong node)...
    for node, node_entries in entries.items():
        mine = {rank_tag(r, lr, s) for r, (n, lr) in placement.items() if n == node
                for s in (b"out", b"err")}  # fmt: skip
        ranked = {tag for tag, _text in node_entries if tag.startswith(b"r")}
        assert ranked <= mine, (node, ranked - mine)
    # ...no line holds text of two ranks, none of a rank's text is outside its own lines,
    # and every numbered line is there exactly once in all the logs together.
    counts: collections.Counter[bytes] = collections.Counter()
    for node, node_entries in entries.items():
        for tag, text in node_entries:
            owners = set(re.findall(rb"@chat r(\d+) ", text))
            if not tag.startswith(b"r"):
                assert b"@chat" not in text and b"sha256" not in text, (node, tag, text)
                continue
            if text == report:  # each rank's report, already checked above
                continue
            assert owners == {tag[1 : tag.index(b"/")]}, (node, tag, text)
            assert text.count(b"@chat") == 1, (node, tag, text)
            counts[text] += 1
    numbered = [b"@chat r%d %s line %d" % (r, s, i)
                for r in placement for s in (b"out", b"err") for i in range(LINES)]  # fmt: skip
    assert [line for line in numbered if counts[line] != 1] == []


def test_orch_logs_rank_prints_exactly_that_ranks_lines(job: Job) -> None:
    job.succeeded()
    placement = job.placement()
    base = [*ORCH, "logs", job.job_id, "--runs-dir", str(job.runs)]
    calls = {rank: subprocess.Popen([*base, "--rank", str(rank)], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE) for rank in placement}  # fmt: skip
    # --raw for the first rank and the last (a local rank 0 and a local rank 1, or so).
    raw_ranks = (min(placement), max(placement))
    raw_calls = {rank: subprocess.Popen([*base, "--rank", str(rank), "--raw"],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for rank in raw_ranks}  # fmt: skip
    for rank, (node, _local) in placement.items():
        out, err = calls[rank].communicate(timeout=120)
        assert calls[rank].returncode == 0, err.decode()
        token = b"r%d/" % rank
        lines = job.log(node).read_bytes().splitlines(keepends=True)
        assert out == b"".join(line for line in lines if line.startswith(token, TS_LEN + 1))
        assert out.count(b"\n") == 2 * LINES + 2 * (LINES // BAR_EVERY + 1) + 1  # + the report
    for rank in raw_ranks:
        node = placement[rank][0]
        out, err = raw_calls[rank].communicate(timeout=120)
        assert raw_calls[rank].returncode == 0, err.decode()
        files = job.run / "nodes" / node
        want = b"".join(
            b"==> %s/rank%d.%s.raw <==\n%s\n"
            % (node.encode(), rank, name.encode(), (files / f"rank{rank}.{name}.raw").read_bytes())
            for name in ("stdout", "stderr")
        )
        assert out == want


def test_raw_rank_files_hold_exactly_what_the_rank_wrote(job: Job) -> None:
    job.succeeded()
    report = report_line(job)
    for rank, (node, local) in job.placement().items():
        files = job.run / "nodes" / node
        entries = read_log(job.log(node))
        for stream, name in ((b"out", "stdout"), (b"err", "stderr")):
            raw = (files / f"rank{rank}.{name}.raw").read_bytes()
            assert raw == rank_output(rank, stream, report)[0], (job.launcher, rank, stream)
            # ...and the head-side log keeps of it what a terminal user would.
            got = [text for tag, text in entries if tag == rank_tag(rank, local, stream)]
            assert got == expected_log(raw)
        # The launcher's own output stays in its own files.
        assert b"@chat" not in (files / "stdout.raw").read_bytes()
        assert b"@chat" not in (files / "stderr.raw").read_bytes()


def test_hostile_arguments_and_env_values_reach_every_rank_unchanged(job: Job) -> None:
    job.succeeded()
    placement = job.placement()
    for rank, (node, _local) in placement.items():
        first = (job.run / "nodes" / node / f"rank{rank}.stdout.raw").read_bytes().split(b"\n")[0]
        report = json.loads(first)
        assert report["argv"] == hostile_args(job.tmp), rank
        assert report["env"] == {"HOSTILE": hostile_env(job.tmp)}, rank
    assert sorted(p.name for p in job.tmp.iterdir()) == []  # no shell ran a word of them


def test_forwarded_secret_reaches_the_ranks_and_is_kept_nowhere(job: Job) -> None:
    job.succeeded()
    want = {
        "DATABASE_URL": hashlib.sha256(DATABASE_URL.encode()).hexdigest(),
        "ORCH_TEST_SECRET_A": None,
    }
    for rank, (node, _local) in job.placement().items():
        first = (job.run / "nodes" / node / f"rank{rank}.stdout.raw").read_bytes().split(b"\n")[0]
        assert json.loads(first)["sha256"] == want, rank
    leaks = []
    node_local = NODE_RUNS / job.job_id
    assert node_local.is_dir()  # kept (--keep-remote-logs), so it can be searched
    for root in (job.run, node_local):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            data = path.read_bytes()
            leaks += [(str(path), s.decode()) for s in SECRET_BYTES if s in data]
    for name, data in (("orch stdout", job.result.stdout), ("orch stderr", job.result.stderr)):
        leaks += [(name, s.decode()) for s in SECRET_BYTES if s in data]
    assert leaks == []
    # The head's private directory of the job (its secrets, if any) is gone.
    assert not Path(head_private_dir(job.job_id)).exists()


def _cmdline_texts(cmdline: bytes) -> list[bytes]:
    """A command line, and whatever its long base64 words decode to (zlib-compressed or not)."""
    texts = [cmdline]
    for word in _BASE64_WORD.findall(cmdline):
        try:
            decoded = base64.b64decode(word + b"=" * (-len(word) % 4))
        except (binascii.Error, ValueError):
            continue
        with contextlib.suppress(zlib.error):
            decoded = zlib.decompress(decoded)
        texts.append(decoded)
    return texts


def test_no_process_command_line_holds_a_secret_while_the_job_runs(job: Job) -> None:
    job.succeeded()
    chatter = [CHATTER.encode()]  # python rank_chatter.py ...: a rank
    ranks = [pid for pid, cmd in job.cmdlines.items() if cmd.split(b"\0")[1:2] == chatter]
    assert len(ranks) >= NODES * SLOTS, "the ranks ran between two samples"  # sampled in time
    leaks = sorted({
        (pid, secret.decode())
        for pid, cmdline in job.cmdlines.items()
        for text in _cmdline_texts(cmdline)
        for secret in SECRET_BYTES
        if secret in text
    })  # fmt: skip
    where = {pid: job.cmdlines[pid][:300] for pid, _secret in leaks}
    assert leaks == [], where


def test_the_users_words_are_on_no_command_line_but_orchs_and_the_ranks_own(job: Job) -> None:
    """Arguments and --env values travel to the nodes in a file, not on ssh's, pdsh's or a
    launcher's command line: only orch (as the user typed it) and the ranks (their argv)."""
    job.succeeded()
    marker = str(job.tmp).encode()  # in four of the arguments and in HOSTILE's value
    others = {}
    for pid, cmdline in job.cmdlines.items():
        words = cmdline.split(b"\0")
        if words[1:3] == [ORCH[0].encode(), b"launch"]:
            continue  # orch itself
        if words[1:2] == [CHATTER.encode()]:  # a rank: exactly its own argv
            assert words[2:-1] == [a.encode() for a in hostile_args(job.tmp)], pid
            continue
        if any(marker in text for text in _cmdline_texts(cmdline)):
            others[pid] = cmdline[:300]
    assert others == {}


def test_the_command_line_search_sees_through_an_encoded_word() -> None:
    """What the test above relies on: a value shipped inside a zlib+base64 word (as orch
    ships programs and specs to the nodes) is found, as is a plain one."""
    spec = json.dumps({"env": {"DATABASE_URL": DATABASE_URL}, "pad": "x" * 100}).encode()
    word = base64.b64encode(zlib.compress(spec, 9))
    cmdline = b"python3\0-c\0exec(zlib.decompress(base64.b64decode('" + word + b"')))\0run\0"
    assert any(DATABASE_URL.encode() in text for text in _cmdline_texts(cmdline))
    assert any(SECRET_A.encode() in text for text in _cmdline_texts(b"x\0" + SECRET_A.encode()))
