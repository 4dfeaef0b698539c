"""What `orch version` reports for a bug report: orch's version, the interpreter and platform,
the installed versions of the libraries a job runs with, and the versions of the programs
orch starts (pdsh, Slurm's). Collecting them is one function returning a frozen value, with
the reading of a distribution and the running of a program passed in, so the text and the
JSON are tested on values; the CLI prints them."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata

from orchestrator import __version__

# Distribution name as installed -> how a bug report names it. Read from the installed
# metadata, never imported: importing torch or deepspeed takes seconds.
DISTRIBUTIONS: tuple[tuple[str, str], ...] = (
    ("torch", "torch"), ("deepspeed", "DeepSpeed"), ("accelerate", "accelerate"),
    ("transformers", "transformers"), ("paramiko", "paramiko"), ("ClusterShell", "ClusterShell"),
    ("typer", "typer"),
)  # fmt: skip
# Program -> the arguments that make it say its version; the first of a group that answers.
PROGRAMS: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    ("pdsh", (("pdsh", "-V"),)),
    ("Slurm", (("sinfo", "--version"), ("srun", "--version"))),
)
PROGRAM_TIMEOUT_S = 5.0  # a program that does not answer by then is reported, not waited for
NOT_FOUND = "not found"


@dataclass(frozen=True)
class ProgramAnswer:
    """What running a program for its version gave: its exit code and output, or why it
    could not run (`missing`: no such program; `problem`: it ran and did not answer)."""

    code: int | None = None
    output: str = ""
    missing: bool = False
    problem: str | None = None


@dataclass(frozen=True)
class Versions:
    """Every version a bug report needs, as text ("not found" for what is not there)."""

    orch: str
    libraries: tuple[tuple[str, str], ...]  # (name, version or "not found"), in order
    programs: tuple[tuple[str, str], ...]  # (name, version, "not found" or what went wrong)
    python: str
    python_path: str  # the interpreter orch runs on
    platform: str

    def to_json(self) -> dict[str, object]:
        return {"orch": self.orch, "python": self.python, "python_path": self.python_path,
                "platform": self.platform, "libraries": dict(self.libraries),
                "programs": dict(self.programs)}  # fmt: skip


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution, from its metadata; None when not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def run_bounded(argv: Sequence[str], timeout: float = PROGRAM_TIMEOUT_S) -> ProgramAnswer:
    """`argv` run with no input, its stdout and stderr together, for at most `timeout` s."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout,
                              check=False)  # fmt: skip
    except FileNotFoundError:
        return ProgramAnswer(missing=True)
    except subprocess.TimeoutExpired:
        return ProgramAnswer(problem=f"no answer in {timeout:g} s")
    except OSError as err:
        return ProgramAnswer(problem=err.strerror or str(err))
    return ProgramAnswer(code=done.returncode, output=(done.stdout or "") + (done.stderr or ""))


def version_line(answer: ProgramAnswer) -> str | None:
    """The version a program's answer gives: its first line (`pdsh-2.34 (+debug)`,
    `slurm 22.05.8`); None when it gave none."""
    lines = [line.strip() for line in answer.output.splitlines() if line.strip()]
    return lines[0] if answer.code == 0 and lines else None


def _why_no_version(answer: ProgramAnswer, program: str) -> str:
    """`sinfo gave no version: sinfo: fatal: ...`: the last thing it said, or why it could
    not answer."""
    if answer.problem is not None:
        return f"{program}: {answer.problem}"
    lines = [line.strip() for line in answer.output.splitlines() if line.strip()]
    return f"{program} gave no version: {lines[-1] if lines else f'exit code {answer.code}'}"


def _first_answering(commands: Sequence[Sequence[str]],
                     run: Callable[[Sequence[str]], ProgramAnswer]) -> str:  # fmt: skip
    """The version the first command that gives one says; else why none did, or "not found"
    when none of the programs is there."""
    troubles = []
    for argv in commands:
        answer = run(argv)
        if answer.missing:
            continue
        version = version_line(answer)
        if version is not None:
            return version
        troubles.append(_why_no_version(answer, argv[0]))
    return "; ".join(troubles) or NOT_FOUND


def platform_text() -> str:
    """`Linux-6.1.0-x86_64-with-glibc2.36`, as platform.platform() says it, without the
    `uname -p` process that one starts."""
    system = os.uname()
    libc, version = platform.libc_ver()
    with_libc = f"-with-{libc}{version}" if libc else ""
    return f"{system.sysname}-{system.release}-{system.machine}{with_libc}"


def collect_versions(
    version_of: Callable[[str], str | None] = installed_version,
    run: Callable[[Sequence[str]], ProgramAnswer] = run_bounded,
) -> Versions:
    """Every version, the libraries' read by `version_of`, the programs' by `run`."""
    libraries = tuple((shown, version_of(name) or NOT_FOUND) for name, shown in DISTRIBUTIONS)
    programs = tuple((shown, _first_answering(commands, run)) for shown, commands in PROGRAMS)
    return Versions(orch=__version__, python=platform.python_version(),
                    python_path=sys.executable, platform=platform_text(),
                    libraries=libraries, programs=programs)  # fmt: skip


def versions_text(versions: Versions) -> str:
    """The report as `accelerate env` prints its own: one `- name: version` line each."""
    rows = [("Python", f"{versions.python} ({versions.python_path})"),
            ("Platform", versions.platform), *versions.libraries, *versions.programs]  # fmt: skip
    lines = [f"orch {versions.orch}", "", "Copy this into a bug report:", ""]
    lines += [f"- {name}: {value}" for name, value in rows]
    return "\n".join(lines)
