"""Whether a path is the user's own to trust: not a link, of the kind expected, owned by the
user, writable by nobody else. One answer for the head (its job records, records/ownership.py;
the job's private directory) and the nodes (the user's directory for orch, with the job's
node directories and the port reservations, shipped beside them as orch_owned), the one
way orch makes such a directory (under umask 077, then checked), and where the user's
directory for orch is: the user's setting (ORCH_NODE_ROOT), else /tmp/orch-<uid>, else,
when another user made that one first, $XDG_RUNTIME_DIR/orch where it lasts.

A path someone else owns, or can write, may hold anything they like: a record that names
the interpreter orch runs on every node, a reservation that jams or hangs the chooser.
Pure, standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NotOwn:
    """What is wrong with a path (it, its owner and mode named) and the fix."""

    message: str
    fix: str

    @property
    def line(self) -> str:
        return f"{self.message}: {self.fix}"


def owner_name(uid: int) -> str:
    """`alice (uid 1000)`, or `uid 1000` where no account has that uid."""
    try:
        import pwd  # not on every platform

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def not_own(path: str, st: os.stat_result, uid: int, *, directory: bool,
            elsewhere: str) -> NotOwn | None:  # fmt: skip
    """Why `path`, as lstat saw it, is not `uid`'s own directory (or regular file); None when
    it is. `elsewhere`: the fix when it is not the user's at all (a link, another kind,
    another owner); writable by others is fixed by chmod."""
    mode, owner = st.st_mode, st.st_uid
    said = f"{path} (owner {owner_name(owner)}, mode {stat.S_IMODE(mode):04o})"
    kind = "directory" if directory else "regular file"
    if stat.S_ISLNK(mode):
        return NotOwn(f"{said} is a symbolic link, not a {kind} of your own", elsewhere)
    if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
        return NotOwn(f"{said} is not a {kind}", elsewhere)
    if owner != uid:
        return NotOwn(f"{said} belongs to another user, not to {owner_name(uid)}", elsewhere)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return NotOwn(f"{said} is writable by others", f"chmod go-w -- {path}, and run again")
    return None


# ----- the user's own directory, made and checked ------------------------------------
class UnsafeDirectory(Exception):
    """A directory orch would use is not the user's own: one line with the path, its owner,
    its mode and the fix (`problem`, the two apart)."""

    def __init__(self, problem: NotOwn) -> None:
        super().__init__(problem.line)
        self.problem = problem


def not_own_directory(path: str, st: os.stat_result, uid: int,
                      elsewhere: str = "") -> NotOwn | None:  # fmt: skip
    """Why `path` (as lstat saw it) is no directory of `uid`'s own for orch to use, with its
    owner, its mode and the fix (`elsewhere`, when it is not the user's at all: by default,
    removing it); None when it is."""
    fix = elsewhere or f"remove it (rm -rf -- {path}, as its owner or root) and run again"
    return not_own(path, st, uid, directory=True, elsewhere=fix)


def directory_problem(path: str, st: os.stat_result, uid: int) -> str | None:
    """not_own_directory's answer in one line."""
    problem = not_own_directory(path, st, uid)
    return problem.line if problem else None


def private_directory(path: str, uid: int, elsewhere: str = "") -> None:
    """Make `path` (its parent must exist) readable and writable by the user alone, then
    check what is there with lstat: one made by someone else first (a link, another
    user's, one others can write) is refused, never used (`elsewhere`: the fix then)."""
    old = os.umask(0o077)  # set before mkdir: never open to others, not even for a second
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    finally:
        os.umask(old)
    problem = not_own_directory(path, os.lstat(path), uid, elsewhere)
    if problem is not None:
        raise UnsafeDirectory(problem)


def private_directories(top: str, below: Sequence[str], uid: int) -> str:
    """`top`, then each of `below` in it in turn, each made and checked as
    `private_directory` does; the deepest. A link anywhere on the way is refused, so
    nothing below `top` is ever reached through one."""
    path = top
    private_directory(path, uid)
    for part in below:
        path = os.path.join(path, part)
        private_directory(path, uid)
    return path


# ----- where the user's own directory for orch is, and the one way it is made ----------
ROOT_SETTING = "ORCH_NODE_ROOT"  # the user's choice, set on the head, sent to every node
ROOT_EXAMPLE = "~/.orch-node"
RUNTIME_VAR = "XDG_RUNTIME_DIR"
RUNTIME_NAME = "orch"  # orch's directory in the user's runtime directory
LINGER_DIR = "/var/lib/systemd/linger"  # a file per user whose runtime directory stays
NODE_BASE = "/tmp"  # a node's <base>/orch-<uid>
NODE_WAY = (f"set {ROOT_SETTING} on the head to a directory of your own on this node "
            f"(export {ROOT_SETTING}={ROOT_EXAMPLE}, say)")  # fmt: skip
HEAD_WAY = "set TMPDIR to a directory of your own (export TMPDIR=~/tmp, say)"


def default_directory(uid: int | str, base: str | None = None) -> str:
    """<base>/orch-<uid> (a node's /tmp, the head's temporary directory): the user's
    directory for orch unless choose_directory picks another. `uid` a str: a stand-in
    (`<uid>` in messages)."""
    return os.path.join(base or NODE_BASE, f"orch-{uid}")


def root_setting(environ: Mapping[str, str]) -> str:
    """The user's ORCH_NODE_ROOT as the head's environment has it ("": none)."""
    return environ.get(ROOT_SETTING, "").strip()


def expand_root(root: str) -> str | None:
    """The setting as a path here: absolute, or ~ (the user's home on this machine) and
    below; None for anything else (relative to what?)."""
    if root == "~" or root.startswith("~/"):
        root = os.path.expanduser(root)
    return root if os.path.isabs(root) else None


@dataclass(frozen=True)
class Runtime:
    """The user's $XDG_RUNTIME_DIR here: its path ("": not set), what is wrong with it (None:
    a directory of the user's own), and whether it outlives the user's sessions (logind
    removes it when the last one ends, which for the one-command sessions orch opens is
    after each one, unless the user lingers)."""

    path: str = ""
    problem: NotOwn | None = None
    lingers: bool = False

    @property
    def usable(self) -> bool:
        return bool(self.path) and self.problem is None and self.lingers


def _lingers(uid: int) -> bool:
    try:
        import pwd  # not on every platform

        return os.path.exists(os.path.join(LINGER_DIR, pwd.getpwuid(uid).pw_name))
    except (ImportError, KeyError):
        return False


def runtime_directory(uid: int) -> Runtime:
    """$XDG_RUNTIME_DIR as this process has it, checked with lstat."""
    path = os.environ.get(RUNTIME_VAR, "")
    if not path:
        return Runtime()
    try:
        problem = not_own_directory(path, os.lstat(path), uid)
    except OSError as err:
        problem = NotOwn(f"{path}: {err.strerror or err}", "")
    return Runtime(path, problem, _lingers(uid))


@dataclass(frozen=True)
class Choice:
    """Where the user's directory for orch is here. `passed_over`: why <base>/orch-<uid> is
    not it, when another place is; `refused`: why the user's setting names no place."""

    path: str
    passed_over: NotOwn | None = None
    refused: NotOwn | None = None


def choose_directory(uid: int, root: str = "", base: str | None = None) -> Choice:
    """The user's own directory for orch here, in this order: `root`, the user's setting
    (ORCH_NODE_ROOT); else <base>/orch-<uid>, unless something not the user's own is there
    (another user made it first); else $XDG_RUNTIME_DIR/orch, when that is a directory of
    the user's own that outlives their sessions; else <base>/orch-<uid> (refused when made,
    naming the ways around). Every program of orch on a machine chooses so, the head's
    shell commands too (shell_user_directory): they agree on each node."""
    if root:
        path = expand_root(root)
        if path is None:
            said = f"{ROOT_SETTING} {root!r} is not an absolute path"
            fix = f"set {ROOT_SETTING} to an absolute path on the nodes, or one under ~/"
            return Choice(root, refused=NotOwn(said, fix))
        return Choice(path)
    default = default_directory(uid, base)
    try:
        problem = not_own_directory(default, os.lstat(default), uid)
    except OSError:  # not there (or /tmp unreadable: making it says why)
        return Choice(default)
    if problem is None:
        return Choice(default)
    runtime = runtime_directory(uid)
    if runtime.usable:
        return Choice(os.path.join(runtime.path, RUNTIME_NAME), passed_over=problem)
    return Choice(default)


def user_directory(uid: int, root: str = "", base: str | None = None) -> str:
    """The user's directory for orch here, as choose_directory chooses it: everything orch
    keeps per job lives below it."""
    return choose_directory(uid, root, base).path


def user_directories(uid: int, below: Sequence[str] = (), root: str = "",
                     base: str | None = None, way: str = NODE_WAY) -> str:  # fmt: skip
    """The user's directory for orch here, then each of `below` in it, each made and
    checked (private_directories); the deepest. Refused (UnsafeDirectory) when the setting
    names no usable place, or <base>/orch-<uid> is not the user's own and nothing else is:
    the message says what is wrong, the fix names the ways around (`way`: the setting's)."""
    choice = choose_directory(uid, root, base)
    if choice.refused is not None:
        raise UnsafeDirectory(choice.refused)
    make_user_directory(choice.path, uid, root, way)
    return private_directories(choice.path, below, uid)


def make_user_directory(top: str, uid: int, root: str = "", way: str = NODE_WAY) -> None:
    """Make and check `top`, the user's directory for orch as chosen; when it is not the
    user's own, the refusal names the ways around it."""
    if root:
        fix = (f"set {ROOT_SETTING} to a directory of your own on this node (not a link, "
               "writable by you alone)")  # fmt: skip
        try:
            private_directory(top, uid, fix)
        except UnsafeDirectory as err:
            said = NotOwn(f"{ROOT_SETTING}: {err.problem.message}", err.problem.fix)
            raise UnsafeDirectory(said) from None
        return
    runtime = runtime_directory(uid)
    fix = (f"{way}{_runtime_way(runtime)}, or have {top} removed (rm -rf -- {top}, as its "
           "owner or root); then run again")  # fmt: skip
    try:
        private_directory(top, uid, fix)
    except UnsafeDirectory as err:
        said = NotOwn(err.problem.message + _runtime_note(runtime), err.problem.fix)
        raise UnsafeDirectory(said) from None


def _runtime_note(runtime: Runtime) -> str:
    """Why $XDG_RUNTIME_DIR was no way around, when it is set."""
    if not runtime.path or runtime.usable:
        return ""
    if runtime.problem is not None:
        return f"; ${RUNTIME_VAR} is no way around it: {runtime.problem.message}"
    return (f"; ${RUNTIME_VAR} ({runtime.path}) is no way around it: it is removed when "
            "your last session here ends")  # fmt: skip


def _runtime_way(runtime: Runtime) -> str:
    if runtime.path and runtime.problem is None and not runtime.lingers:
        return f", or keep ${RUNTIME_VAR} past your sessions (loginctl enable-linger)"
    return ""


def shell_user_directory(root: str = "") -> str:
    """Shell that sets $u to the user's directory for orch on a node, chosen as
    choose_directory chooses it (the caller checks what is there); `root` the user's
    setting. A setting that names no place: exit 5, saying why."""
    if root == "~" or root.startswith("~/"):
        return f'u="$HOME"{shlex.quote(root[1:])}; ' if root[1:] else 'u="$HOME"; '
    if root:
        if os.path.isabs(root):
            return f"u={shlex.quote(root)}; "
        said = f"{ROOT_SETTING} {root!r} is not an absolute path"
        return f"echo {shlex.quote(said)} >&2; exit 5; "
    own = ('[ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] '
           '&& [ -z "$(find "$1" -maxdepth 0 -perm /022)" ]')  # fmt: skip
    runtime = f'"${RUNTIME_VAR}"'
    return (
        f"orch_own() {{ {own}; }}; u={shlex.quote(NODE_BASE)}/orch-$(id -u); "
        '{ [ ! -e "$u" ] && [ ! -L "$u" ]; } || orch_own "$u" || '
        f"{{ [ -n {runtime} ] && orch_own {runtime} "
        f'&& [ -e {shlex.quote(LINGER_DIR)}/"$(id -un)" ] && u={runtime}/{RUNTIME_NAME}; }}; '
    )


def write_private_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write a file only the user can read (`mode`), replacing a regular file there but
    never following a link to somewhere else."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)  # a file that was there keeps its mode otherwise
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)
