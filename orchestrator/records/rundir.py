"""The job's directory, runs/<job-id>/, held open: made or found once, checked, and every file
of its record opened relative to it, never through a link.

The runs directory is opened without following a link and checked (the user's own, writable
by nobody else: records/ownership.py) before a job's directory is made in it (new, O_EXCL)
or opened; `RunDir` then holds that directory's descriptor, and what orch writes and reads
in it (job.json and its temporary name, env.json, the logs, the moments, the progress
samples, the stacks, the kill marker) is opened relative to it with O_NOFOLLOW on every
name. A link planted afterwards anywhere on the way (the runs directory swapped, the job's
directory swapped, a temporary name pointed at ~/.bashrc) is never written through: orch
keeps writing in the directory it checked.

A `RunDir` made from a path alone (`RunDir(path)`, as readers and tests do) opens that
path for each use, the same way, checked; `create` (or `find_job`) makes it hold it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orchestrator.errors import OrchError, RecordError, UsageError
from orchestrator.records.job import (
    ATTEMPTS_DIR,
    JOB_FILE,
    KILL_MARKER,
    LOGS_DIR,
    NODES_DIR,
    PREFLIGHT_FILE,
    PROGRESS_FILE,
    SBATCH_OUTPUT_FILE,
    STACKS_DIR,
    STOP_MARKER,
    TEARDOWN_UNANSWERED_FILE,
    JobRecord,
)
from orchestrator.records.ownership import DIRECTORY_FLAGS, open_own, refuse

APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND
PRIVATE = 0o600  # the record's files: the user's alone, whatever the umask
_TEXT_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": APPEND}
_LAUNCH_ONE = "launch one, or pass --runs-dir"
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(relative: str) -> list[str]:
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"not a name below a run directory: {relative!r}")
    return parts


def _folder(top: int, parts: Sequence[str], *, create: bool) -> int:
    """A new descriptor of the folder `parts` below `top`, each step opened without following
    a link; missing folders made when `create` (their mode as the umask says)."""
    current = os.open(".", DIRECTORY_FLAGS, dir_fd=top)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=current)
            following = os.open(part, DIRECTORY_FLAGS, dir_fd=current)
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


def open_below(top: int, relative: str, flags: int, mode: int = 0o666) -> int:
    """`relative` (names joined by /) below the directory `top`, opened with `flags`: no link
    on the way or at the end is followed; the folders on the way are made when `flags`
    create the file."""
    *folders, name = _parts(relative)
    folder = _folder(top, folders, create=bool(flags & os.O_CREAT))
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder)
    finally:
        os.close(folder)


def create_new(top: int, name: str, mode: int) -> int:
    """A file made new in `top` for writing (O_EXCL, never through a link). One left there by
    a write cut short, or planted, is removed first (a link is removed, not followed)."""
    try:
        return os.open(name, _NEW_FILE, mode, dir_fd=top)
    except FileExistsError:
        os.unlink(name, dir_fd=top)
        return os.open(name, _NEW_FILE, mode, dir_fd=top)


class _Held:
    """The descriptor a RunDir holds once made or found (shared by its copies)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd: int | None = None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True)
class RunDir:
    """runs/<job-id>/: one job's record; its files and folders by the names records/job.py
    gives, opened relative to the directory (see the module docstring)."""

    path: Path
    held: _Held = field(default_factory=_Held, compare=False, repr=False)

    @property
    def job_file(self) -> Path:
        return self.path / JOB_FILE

    @property
    def logs(self) -> Path:
        return self.path / LOGS_DIR

    @property
    def node_logs(self) -> Path:
        """Raw node-local logs pulled back when the job ends."""
        return self.path / NODES_DIR

    @property
    def stacks(self) -> Path:
        return self.path / STACKS_DIR

    @property
    def progress_file(self) -> Path:
        return self.path / PROGRESS_FILE

    @property
    def preflight_file(self) -> Path:
        return self.path / PREFLIGHT_FILE

    @property
    def teardown_unanswered(self) -> Path:
        return self.path / TEARDOWN_UNANSWERED_FILE

    @property
    def kill_marker(self) -> Path:
        return self.path / KILL_MARKER

    @property
    def stop_marker(self) -> Path:
        return self.path / STOP_MARKER

    @property
    def sbatch_output(self) -> Path:
        return self.path / SBATCH_OUTPUT_FILE

    def attempt(self, number: int) -> RunDir:
        """attempts/<number>/: where an earlier attempt's own files were moved."""
        return RunDir(self.path / ATTEMPTS_DIR / str(number))

    # -- the directory ----------------------------------------------------------------
    def create(self, *, existing: bool = False) -> RunDir:
        """The job's directory, the user's alone: it holds the command, the environment's
        names, every rank's output and the raw node logs (0700, whatever the umask). Made
        new (`existing`: one `orch submit --sbatch` made may be there) in a runs directory
        that is checked first, then held; called again, made private again."""
        if self.held.fd is None:
            self.held.fd = _make_job_dir(self.path, existing=existing)
        os.fchmod(self.held.fd, 0o700)
        self.mkdir(LOGS_DIR)
        return self

    def close(self) -> None:
        """Let go of the directory (a RunDir made from its path opens it again to use it)."""
        self.held.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _directory(self) -> Iterator[int]:
        """The directory's descriptor: the one held, else the path opened for this use."""
        if self.held.fd is not None:
            yield self.held.fd
            return
        fd = open_own(self.path, self.path, directory=True)
        try:
            yield fd
        finally:
            os.close(fd)

    def check(self) -> None:
        """The directory and its job.json are the user's own, writable by nobody else
        (OrchError naming what is wrong); a missing one is left to `load`."""
        try:
            with self._directory() as top:
                refuse(self.path, os.fstat(top), directory=True)
                os.close(open_own(self.job_file, JOB_FILE, directory=False, dir_fd=top))
        except FileNotFoundError:
            return

    # -- files in it, by name relative to it ----------------------------------------------
    def open(self, relative: str, flags: int, mode: int = 0o666) -> int:
        """A descriptor of `relative` (names joined by /) in the directory: see open_below."""
        with self._directory() as top:
            return open_below(top, relative, flags, mode)

    def open_text(self, relative: str, how: str = "r", mode: int = 0o666) -> IO[str]:
        """`relative` as a UTF-8 text file: read ("r"), replaced ("w") or appended to ("a");
        `mode` for a file made new."""
        fd = self.open(relative, _TEXT_FLAGS[how], mode)
        return os.fdopen(fd, how, encoding="utf-8", errors="replace" if how == "r" else None)

    def mkdir(self, relative: str) -> None:
        """A folder (and those on the way) in the directory, made when missing."""
        with self._directory() as top:
            os.close(_folder(top, _parts(relative), create=True))

    def exists(self, relative: str) -> bool:
        with contextlib.suppress(OSError), self._directory() as top:
            *folders, name = _parts(relative)
            folder = _folder(top, folders, create=False)
            try:
                os.stat(name, dir_fd=folder, follow_symlinks=False)
                return True
            finally:
                os.close(folder)
        return False

    def touch(self, relative: str) -> None:
        os.close(self.open(relative, os.O_WRONLY | os.O_CREAT))

    def write_file(self, name: str, content: str, mode: int = PRIVATE) -> Path:
        with self.open_text(name, "w", mode) as file:
            file.write(content)
        return self.path / name

    def replace_file(self, name: str, content: str, mode: int = PRIVATE) -> None:
        """`name` replaced whole: written under a temporary name made new (`.<name>.tmp`),
        then renamed over it, so a reader never sees half of it."""
        tmp = f".{name}.tmp"
        with self._directory() as top:
            fd = create_new(top, tmp, mode)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as file:
                    file.write(content)
                os.replace(tmp, name, src_dir_fd=top, dst_dir_fd=top)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=top)
                raise

    def rename(self, source: str, target: str) -> None:
        """Move `source` to `target`, both in the directory (the target's folders made)."""
        *source_folders, source_name = _parts(source)
        *target_folders, target_name = _parts(target)
        with self._directory() as top:
            old = _folder(top, source_folders, create=False)
            try:
                new = _folder(top, target_folders, create=True)
                try:
                    os.rename(source_name, target_name, src_dir_fd=old, dst_dir_fd=new)
                finally:
                    os.close(new)
            finally:
                os.close(old)

    # -- the record -------------------------------------------------------------------------
    def save(self, record: JobRecord) -> None:
        self.replace_file(JOB_FILE, json.dumps(record.to_json(), indent=2) + "\n")

    def load(self) -> JobRecord:
        """The record, read from the descriptor that was checked (the user's own file,
        writable by nobody else, not a link)."""
        try:
            with self._directory() as top:
                fd = open_own(self.job_file, JOB_FILE, directory=False, dir_fd=top)
            with os.fdopen(fd, "rb") as file:
                data = file.read()
            return JobRecord.from_json(json.loads(data))
        except FileNotFoundError as err:
            raise UsageError(
                f"no job record at {self.job_file}", "see `orch status` for the jobs there are"
            ) from err
        except (ValueError, KeyError, TypeError) as err:
            raise OrchError(f"{self.job_file}: unreadable job record ({err})") from err


def _make_job_dir(path: Path, *, existing: bool) -> int:
    """Make the runs directory if missing (0700; the folders above as the umask says), open
    and check it, make the job's directory in it (new unless `existing`) and open it."""
    root = path.parent
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(root, 0o700)
    except OSError as err:  # a parent not writable, a file where a folder should be
        where = f" ({err.filename})" if err.filename else ""
        raise RecordError(f"the runs directory {root} cannot be made: {err.strerror}{where}",
                        "use a runs directory of your own: --runs-dir DIR or "
                        "ORCH_RUNS_DIR=DIR") from None  # fmt: skip
    with _Runs(root) as runs:
        try:
            os.mkdir(path.name, 0o700, dir_fd=runs.fd)
        except FileExistsError:
            if not existing:
                raise OrchError(f"{path} exists already: a new job's record is made new",
                                "launch again: the job gets a new id") from None  # fmt: skip
        return open_own(path, path.name, directory=True, dir_fd=runs.fd)


class _Runs:
    """The runs directory, opened without following a link and checked, for a moment."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fd = open_own(root, root, directory=True)

    def __enter__(self) -> _Runs:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def job_names(self) -> list[str]:
        """The names in it that hold a job.json, in order (job ids sort by time); nothing
        is read from any of them."""
        names = []
        for name in sorted(os.listdir(self.fd)):
            if name.startswith("."):
                continue
            with contextlib.suppress(OSError):
                os.stat(f"{name}/{JOB_FILE}", dir_fd=self.fd, follow_symlinks=False)
                names.append(name)
        return names

    def entry_names(self) -> list[str]:
        """Every name in it but hidden ones and plain files, in order: the jobs' directories,
        with or without a job.json, and whatever stands in the place of one (a link)."""
        names = []
        for name in sorted(os.listdir(self.fd)):
            with contextlib.suppress(OSError):
                mode = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
                if not name.startswith(".") and not stat.S_ISREG(mode):
                    names.append(name)
        return names

    def job(self, name: str) -> RunDir:
        """The job's directory `name` in it, opened and checked, held."""
        run = RunDir(self.root / name)
        run.held.fd = open_own(run.path, name, directory=True, dir_fd=self.fd)
        return run


def run_dir(root: Path, job_id: str) -> RunDir:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise UsageError(f"not a job id: {job_id!r}", "see `orch status` for the jobs there are")
    return RunDir(root / job_id)


@dataclass(frozen=True)
class ListedJob:
    """One job's directory in the runs directory: its record, or why it cannot be read."""

    job_id: str
    record: JobRecord | None
    problem: str | None = None


def _listed(runs: _Runs, name: str) -> ListedJob:
    try:
        with runs.job(name) as run:
            return ListedJob(name, run.load())
    except UsageError:  # load's "no job record at ...": the directory holds no job.json
        return ListedJob(name, None, f"no {JOB_FILE}")
    except OrchError as err:
        return ListedJob(name, None, err.message)
    except OSError as err:
        return ListedJob(name, None, f"{err.strerror or err}: {err.filename or name}")


def list_job_entries(root: Path) -> list[ListedJob]:
    """Every job's directory under root, oldest first, with its record or why it cannot be
    read (not the user's own, a link, no job.json, not a record): none is left out. The runs
    directory is checked first (OrchError when it is not the user's own)."""
    try:
        runs = _Runs(root)
    except FileNotFoundError:
        return []
    with runs:
        return [_listed(runs, name) for name in runs.entry_names()]


def list_jobs(root: Path) -> list[JobRecord]:
    """Every readable record of the user's own under root, oldest first (the runs directory
    is checked first: OrchError when it is not the user's own)."""
    return [listed.record for listed in list_job_entries(root) if listed.record is not None]


def find_job(root: Path, job: str | None) -> RunDir:
    """A job by id, by unique prefix, or (None) the newest one: its directory opened and
    checked, held. The runs directory is checked first, and no record is read to find it."""
    try:
        runs = _Runs(root)
    except FileNotFoundError:
        raise UsageError(f"no jobs recorded under {root}", _LAUNCH_ONE) from None
    with runs:
        return runs.job(_chosen(runs.job_names(), root, job))


def _chosen(names: Sequence[str], root: Path, job: str | None) -> str:
    if not names:
        raise UsageError(f"no jobs recorded under {root}", _LAUNCH_ONE)
    if job is None:
        return names[-1]
    matches = [job] if job in names else [n for n in names if n.startswith(job)]
    if len(matches) != 1:
        which = "no job" if not matches else f"{len(matches)} jobs"
        raise UsageError(f"{which} under {root} match {job!r}", "see `orch status`")
    return matches[0]
