"""orch as ordinary users of a shared cluster: two accounts (a victim and an attacker who
share a group, whose login umask is 002) on the same sandbox nodes and the same head. Each
runs doctor and jobs as itself; the attacker tries what a user of a shared machine can try
against the other's jobs.

Run as root, which creates the accounts (and removes them after); skipped otherwise. The
accounts run this venv's packages through an interpreter they can reach (the venv's own
may sit in root's home)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_support import ALLREDUCE, REPO, free_port, wait_for

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.skipif(os.geteuid() != 0, reason="creates two test accounts: needs root"),
]

# Names of this run's own: another session on the machine (its own run of this module)
# deletes and recreates its accounts, and plants links in their /tmp/orch-<uid>.
_RUN = uuid.uuid4().hex[:6]
VICTIM, ATTACKER, GROUP = f"orchv{_RUN}", f"orcha{_RUN}", f"orchg{_RUN}"
STEPPING = str(REPO / "tests" / "jobs" / "stepping.py")
VENV = Path(sys.executable).parent.parent


def _run(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


# ----- an interpreter other accounts can run, with this venv's packages -----------------
def _reachable_python() -> str | None:
    """A Python of this venv's version that the `nobody` account can start."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/python{version}"):
        probe = _run(["runuser", "-u", "nobody", "--", candidate, "-c",
                      f"import sys; assert sys.version.startswith('{version}')"])  # fmt: skip
        if probe.returncode == 0:
            return candidate
    return None


def _shared_venv(base: str, where: Path) -> Path:
    """A venv on `base` that sees this venv's site-packages, with its console scripts."""
    created = _run([base, "-m", "venv", "--without-pip", str(where)], timeout=120)
    assert created.returncode == 0, created.stderr
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    ours = VENV / "lib" / version / "site-packages"
    (where / "lib" / version / "site-packages" / "orch-shared.pth").write_text(
        f"import site; site.addsitedir({str(ours)!r})\n"
    )
    shebang = f"#!{VENV}/bin/python"
    for script in (VENV / "bin").iterdir():
        target = where / "bin" / script.name
        if target.exists() or not script.is_file():
            continue
        try:
            text = script.read_text()
        except UnicodeDecodeError:
            continue
        if text.startswith(shebang + "\n"):
            target.write_text(f"#!{where}/bin/python\n" + text.split("\n", 1)[1])
            target.chmod(0o755)
    return where / "bin"


@pytest.fixture(scope="module")
def user_bin() -> Iterator[Path]:
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs useradd and runuser")
    base = _reachable_python()
    if base is None:
        pytest.skip("no Python of this venv's version that other accounts can start")
    where = Path(tempfile.mkdtemp(prefix="orch-users-venv-", dir="/var/tmp"))
    where.chmod(0o755)
    try:
        yield _shared_venv(base, where)
    finally:
        shutil.rmtree(where, ignore_errors=True)


# ----- the accounts ---------------------------------------------------------------
def _remove_accounts() -> None:
    for user in (VICTIM, ATTACKER):
        _run(["pkill", "-KILL", "-u", user])
        _run(["userdel", "-r", "-f", user])
    _run(["groupdel", GROUP])


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    _remove_accounts()
    assert _run(["groupadd", GROUP]).returncode == 0
    for user in (VICTIM, ATTACKER):
        made = _run(["useradd", "-m", "-G", GROUP, "-s", "/bin/bash", user])
        assert made.returncode == 0, made.stderr
        # No password, but not locked: sshd refuses a locked account even its keys.
        assert _run(["usermod", "-p", "*", user]).returncode == 0
        # What an account gone before left under the uid this one got.
        shutil.rmtree(f"/tmp/orch-{pwd_uid(user)}", ignore_errors=True)
        home = Path(pwd.getpwnam(user).pw_dir)
        # Per-project groups often come with a login umask of 002: everything a shell on
        # the node makes is then group-writable unless orch says otherwise.
        bashrc = home / ".bashrc"
        bashrc.write_text("umask 002\n" + (bashrc.read_text() if bashrc.exists() else ""))
        keygen = _run(["runuser", "-u", user, "--", "ssh-keygen", "-q", "-t", "ed25519", "-N",
                       "", "-f", str(home / ".ssh" / "id_ed25519")])  # fmt: skip
        assert keygen.returncode == 0, keygen.stderr
    uids = [pwd_uid(user) for user in (VICTIM, ATTACKER)]  # read now: gone with the accounts
    try:
        yield {user: pwd.getpwnam(user) for user in (VICTIM, ATTACKER)}
    finally:
        _remove_accounts()
        for uid in uids:
            shutil.rmtree(f"/tmp/orch-{uid}", ignore_errors=True)


def pwd_uid(user: str) -> int | str:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return "gone"


@pytest.fixture(scope="module")
def shared_nodes(sandbox_factory, accounts) -> dict[str, Path]:
    """A 2-node sandbox both accounts log into with their own keys; each one's hostfile."""
    _box, state = sandbox_factory(2, 2, guests=(VICTIM, ATTACKER))
    return {user: Path(account.pw_dir) / ".ssh" / f"orch-sandbox-{state.sandbox_id}"
            / "hostfile" for user, account in accounts.items()}  # fmt: skip


class User:
    """One account's view: orch as that user, from its home, with its own runs directory."""

    def __init__(self, name: str, bin_dir: Path, hostfile: Path) -> None:
        self.name = name
        self.account = pwd.getpwnam(name)
        self.home = Path(self.account.pw_dir)
        self.bin = bin_dir
        self.hostfile = hostfile
        self.runs = self.home / "runs"

    def argv(self, *command: str, env: dict[str, str] | None = None) -> list[str]:
        # PYTHONPATH: the orch of this tree, the one under test, not the venv's install.
        env = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
               "PATH": f"{self.bin}:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(REPO),
               "ORCH_RUNS_DIR": str(self.runs), **(env or {})}  # fmt: skip
        return ["runuser", "-u", self.name, "--", "env", "-i",
                *(f"{k}={v}" for k, v in env.items()), *command]  # fmt: skip

    def orch(self, *args: str, timeout: float = 300,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(self.argv("orch", *args, env=env), cwd=self.home,
                              capture_output=True, text=True, timeout=timeout,
                              check=False)  # fmt: skip

    def start(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen(self.argv("orch", *args), cwd=self.home, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        return _run(self.argv("sh", "-c", script))

    # torchrun where the launcher is not the subject: the pdsh path (accelerate, DeepSpeed's
    # runner and per-node launcher) costs a job 6-8 CPU-s more, and two tests below run it.
    def launch_args(self, *script_args: str, launcher: str = "torchrun",
                    options: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
        return ["launch", "--hostfile", str(self.hostfile), "--launcher", launcher,
                "--nproc-per-node", "1", "--main-port", str(free_port()), "--no-doctor",
                *options, ALLREDUCE, "--", *script_args]  # fmt: skip

    def jobs(self) -> list[str]:
        return sorted(p.name for p in self.runs.iterdir()) if self.runs.exists() else []

    def record(self, job_id: str) -> dict:
        return json.loads((self.runs / job_id / "job.json").read_text())


@pytest.fixture(scope="module")
def victim(user_bin, shared_nodes) -> User:
    return User(VICTIM, user_bin, shared_nodes[VICTIM])


@pytest.fixture(scope="module")
def attacker(user_bin, shared_nodes) -> User:
    return User(ATTACKER, user_bin, shared_nodes[ATTACKER])


def _private(path: Path) -> bool:
    return stat.S_IMODE(path.lstat().st_mode) & 0o077 == 0


def _own_dir(user: User) -> Path:
    return Path(f"/tmp/orch-{user.account.pw_uid}")


# ----- as an ordinary user ----------------------------------------------------------------
def test_doctor_and_a_job_as_an_ordinary_user_after_root_ran_one(victim, shared_nodes):
    doctor = victim.orch("doctor", "--hostfile", str(victim.hostfile))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    result = victim.orch(*victim.launch_args("--steps", "3", launcher="pdsh"))
    assert result.returncode == 0, result.stderr[-3000:]
    [job_id] = victim.jobs()
    record = victim.record(job_id)
    assert record["state"] == "succeeded"
    assert all(why == "ok" for why in record["node_logs"].values()), record["node_logs"]
    # Everything the job left is the user's alone, whatever the login umask.
    run_dir = victim.runs / job_id
    assert _private(victim.runs) and _private(run_dir) and _private(run_dir / "job.json")
    own = _own_dir(victim)
    assert own.stat().st_uid == victim.account.pw_uid and _private(own)


def test_a_crash_as_an_ordinary_user_names_the_rank_and_its_code(victim, tmp_path):
    before = set(victim.jobs())
    result = victim.orch(*victim.launch_args("--steps", "2", "--fail-rank", "1"))
    assert result.returncode == 7, result.stderr[-3000:]
    assert "rank 1: exited with code 7" in result.stderr
    [job_id] = set(victim.jobs()) - before
    assert victim.record(job_id)["first_failure"]["rank"] == 1


def test_a_hang_as_an_ordinary_user_keeps_every_ranks_stack(victim):
    before = set(victim.jobs())
    args = ["launch", "--hostfile", str(victim.hostfile), "--nproc-per-node", "1",
            "--main-port", str(free_port()), "--no-doctor", "--hang-timeout", "10", STEPPING,
            "--", "--compute", "0", "--lead-pause", "0.05", "--stall-rank", "1",
            "--stall-after", "3", "--max-seconds", "120"]  # fmt: skip
    result = victim.orch(*args)
    assert result.returncode == 124, result.stderr[-3000:]
    [job_id] = set(victim.jobs()) - before
    record = victim.record(job_id)
    kept = json.loads((victim.runs / job_id / record["teardown_stacks"]).read_text())
    first = record["first_failure"]
    assert first["kind"] == "hang" and first["rank"] == 1, (first, kept["nodes"], kept["stacks"])
    ranks = sorted(r for block in kept["stacks"]["blocks"] for r in block["ranks"])
    assert ranks == [0, 1]


def test_two_users_share_the_nodes_and_killing_one_job_leaves_the_other(victim, attacker,
                                                                         tmp_path):
    mine, theirs = set(victim.jobs()), set(attacker.jobs())
    first = victim.start(*victim.launch_args("--steps", "2", "--sleep", "25"),
                         log=tmp_path / "victim.out")  # fmt: skip
    second = attacker.start(*attacker.launch_args("--steps", "2", "--sleep", "600"),
                            log=tmp_path / "attacker.out")  # fmt: skip
    try:
        assert wait_for(lambda: set(attacker.jobs()) - theirs, 60)
        [job_id] = set(attacker.jobs()) - theirs
        assert wait_for(lambda: "rank 1 step 1" in _logs(attacker, job_id), 120)
        # The attacker can neither read nor stop the victim's job.
        [victims_job] = set(victim.jobs()) - mine
        refused = attacker.orch("kill", victims_job, "--runs-dir", str(victim.runs))
        assert refused.returncode != 0
        said = refused.stdout + refused.stderr
        assert "Invalid value for '--runs-dir'" in said and "Traceback" not in said, said
        killed = attacker.orch("kill", job_id)
        assert killed.returncode == 0, killed.stderr
        assert second.wait(120) != 0
        assert first.wait(240) == 0, (tmp_path / "victim.out").read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()


def _logs(user: User, job_id: str) -> str:
    logs = user.runs / job_id / "logs"
    return "".join(p.read_text(errors="replace") for p in logs.glob("*.log")) if logs.exists() \
        else ""


# ----- what the other account tries ----------------------------------------------------------
def test_a_directory_planted_in_the_victims_place_is_refused_naming_it(victim, attacker):
    """The attacker makes the victim's /tmp/orch-<uid> first (a link to its own directory,
    or a group-writable directory): doctor and launch refuse it, naming the path and owner;
    nothing is written through it."""
    own = _own_dir(victim)
    shutil.rmtree(own, ignore_errors=True)
    bait = attacker.home / "bait"
    planted = attacker.shell(f"umask 002; mkdir -p {bait} && ln -s {bait} {own}")
    assert planted.returncode == 0, planted.stderr
    try:
        doctor = victim.orch("doctor", "--hostfile", str(victim.hostfile))
        assert doctor.returncode == 1
        said = doctor.stdout + doctor.stderr
        assert str(own) in said and ATTACKER in said, said
        result = victim.orch(*victim.launch_args("--steps", "1"))
        assert result.returncode != 0
        assert str(own) in result.stderr, result.stderr[-3000:]
        assert list(bait.iterdir()) == []  # nothing of the victim's went through the link
    finally:
        attacker.shell(f"rm -f {own}")
    group_dir = attacker.shell(f"umask 002; mkdir {own} && chmod 2775 {own}")
    assert group_dir.returncode == 0
    try:
        result = victim.orch(*victim.launch_args("--steps", "1"))
        assert result.returncode != 0 and str(own) in result.stderr, result.stderr[-3000:]
    finally:
        attacker.shell(f"rm -rf {own}")


def test_the_victims_files_reservations_and_records_are_out_of_reach(victim, attacker):
    """After a job of the victim's: the attacker cannot read its records, plant anything
    among its port reservations or its node directories, nor jam its ports with its own."""
    result = victim.orch(*victim.launch_args("--steps", "1", launcher="pdsh"))
    assert result.returncode == 0, result.stderr[-3000:]
    own = _own_dir(victim)
    probes = {
        "read the victim's records": f"ls {victim.runs}",
        "list the victim's own directory": f"ls {own}",
        "plant a FIFO among its reservations": f"mkfifo {own}/ports/29500",
        "plant a link where its next job's node directory goes": f"ln -s /tmp {own}/runs/x",
    }
    for what, script in probes.items():
        answer = attacker.shell(script)
        assert answer.returncode != 0, f"the attacker could {what}"
        assert "Permission denied" in answer.stderr, (what, answer.stderr)
    # Reservations for the whole range in the attacker's own directory leave the victim free.
    jam = attacker.shell("mkdir -p /tmp/orch-$(id -u)/ports && cd /tmp/orch-$(id -u)/ports && "
                         "for p in $(seq 29500 29700); do echo x > $p; done")  # fmt: skip
    assert jam.returncode == 0, jam.stderr
    chosen = victim.orch("launch", "--hostfile", str(victim.hostfile), "--nproc-per-node", "1",
                         "--no-doctor", ALLREDUCE, "--", "--steps", "1")  # fmt: skip
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    status = attacker.orch("status", "--runs-dir", str(victim.runs))
    assert status.returncode != 0
    said = status.stdout + status.stderr
    assert "Invalid value for '--runs-dir'" in said and "Traceback" not in said, said


def test_the_records_of_another_user_are_refused_as_code(victim, attacker, tmp_path):
    """A runs directory someone else could have written (a shared ./runs under /tmp) is never
    acted on: orch stacks and kill run the interpreter a record names on every host."""
    shared = Path(tempfile.mkdtemp(prefix="orch-shared-runs-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        forged = attacker.shell(f"mkdir {shared}/job1 && echo '{{}}' > {shared}/job1/job.json")
        assert forged.returncode == 0, forged.stderr
        for command in (["stacks", "job1"], ["kill", "job1"], ["status", "job1"]):
            answer = victim.orch(*command, "--runs-dir", str(shared))
            assert answer.returncode != 0
            said = answer.stdout + answer.stderr
            assert str(shared) in said and "Traceback" not in said, said
    finally:
        shutil.rmtree(shared, ignore_errors=True)



def test_a_main_port_the_other_account_holds_is_refused_naming_it(victim, attacker):
    """The attacker listens on the port the victim's job would meet on: the job does not
    start its ranks against it, and says whose it is."""
    port = free_port()
    listen = ("import socket, time; s = socket.socket(); "
              "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              f"s.bind(('0.0.0.0', {port})); s.listen(); print('listening', flush=True); "
              "time.sleep(300)")  # fmt: skip
    squatter = subprocess.Popen(attacker.argv("python3", "-c", listen), stdout=subprocess.PIPE)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline() == b"listening\n"
        args = ["launch", "--hostfile", str(victim.hostfile), "--nproc-per-node", "1",
                "--main-port", str(port), "--no-doctor", ALLREDUCE, "--", "--steps", "1"]
        result = victim.orch(*args)
        assert result.returncode != 0
        assert str(port) in result.stderr and ATTACKER in result.stderr, result.stderr[-3000:]
        assert " up on " not in result.stderr  # no rank met the attacker's listener
    finally:
        squatter.kill()
        squatter.wait(30)


# ----- another account made the victim's /tmp/orch-<uid> first: a way around it, no root ----
def _taken_by(attacker: User, own: Path) -> None:
    """The attacker makes the victim's /tmp/orch-<uid> first, a directory of its own."""
    shutil.rmtree(own, ignore_errors=True)
    made = attacker.shell(f"mkdir -m 755 {own}")
    assert made.returncode == 0, made.stderr


def _pick_a_port_and_run(victim: User, env: dict[str, str]) -> dict:
    """A job with no --main-port (node 0 reserves one), its record once it succeeded."""
    before = set(victim.jobs())
    args = ["launch", "--hostfile", str(victim.hostfile), "--nproc-per-node", "1",
            "--no-doctor", ALLREDUCE, "--", "--steps", "1"]  # fmt: skip
    result = victim.orch(*args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    [job_id] = set(victim.jobs()) - before
    record = victim.record(job_id)
    assert all(why == "ok" for why in record["node_logs"].values()), record["node_logs"]
    return record


def test_the_users_setting_goes_around_a_directory_another_account_made(victim, attacker):
    """Doctor names the other account's /tmp/orch-<uid> and the way around; with
    ORCH_NODE_ROOT (and TMPDIR on the head) doctor and jobs work, nothing in the other's."""
    own = _own_dir(victim)
    _taken_by(attacker, own)
    try:
        doctor = victim.orch("doctor", "--hostfile", str(victim.hostfile), "--json")
        said = doctor.stdout + doctor.stderr
        assert doctor.returncode == 1 and str(own) in said and ATTACKER in said, said
        assert "set ORCH_NODE_ROOT on the head to a directory of your own" in said, said
        assert victim.shell("mkdir -m 700 -p ~/tmp").returncode == 0
        around = {"ORCH_NODE_ROOT": "~/.orch-node", "TMPDIR": str(victim.home / "tmp")}
        doctor = victim.orch("doctor", "--hostfile", str(victim.hostfile), env=around)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        _pick_a_port_and_run(victim, around)
        root = victim.home / ".orch-node"
        assert root.stat().st_uid == victim.account.pw_uid and _private(root)
        assert (root / "ports").is_dir() and (root / "runs").is_dir()
        assert list(own.iterdir()) == []  # nothing of the victim's in the other's directory
    finally:
        attacker.shell(f"rm -rf {own}")


def test_a_lasting_runtime_directory_goes_around_it_by_itself(victim, attacker):
    """The victim's $XDG_RUNTIME_DIR (its own, kept past its sessions: it lingers) holds
    orch's directory where the other account made /tmp/orch-<uid>: doctor warns, saying so;
    jobs work; nothing is set."""
    own = _own_dir(victim)
    runtime = victim.home / "run-user"
    assert victim.shell(f"mkdir -m 700 -p {runtime}").returncode == 0
    bashrc = victim.home / ".bashrc"
    kept = bashrc.read_text()
    bashrc.write_text(f"export XDG_RUNTIME_DIR={runtime}\n" + kept)  # as logind's PAM would
    linger = Path("/var/lib/systemd/linger")
    made_linger = not linger.exists()
    linger.mkdir(parents=True, exist_ok=True)
    (linger / VICTIM).touch()
    _taken_by(attacker, own)
    try:
        env = {"XDG_RUNTIME_DIR": str(runtime)}
        doctor = victim.orch("doctor", "--hostfile", str(victim.hostfile), "--json", env=env)
        said = doctor.stdout + doctor.stderr
        assert doctor.returncode == 0, said
        assert f"orch keeps its files in {runtime / 'orch'} there instead" in said, said
        _pick_a_port_and_run(victim, env)
        assert _private(runtime / "orch") and (runtime / "orch" / "jobs").is_dir()
        assert (runtime / "orch" / "ports").is_dir()
        assert list(own.iterdir()) == []
    finally:
        attacker.shell(f"rm -rf {own}")
        bashrc.write_text(kept)
        (linger / VICTIM).unlink(missing_ok=True)
        if made_linger:
            shutil.rmtree(linger, ignore_errors=True)
