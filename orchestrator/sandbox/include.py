"""The one thing a sandbox adds outside its directory: a marked `Include` of its
ssh_config at the top of ~/.ssh/config, so plain ssh and pdsh reach its nodes by name."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def _markers(directory: Path) -> tuple[str, str]:
    return (f"# >>> orch sandbox {directory} >>>", f"# <<< orch sandbox {directory} <<<")


@contextlib.contextmanager
def _ssh_config_locked(home: Path | None = None) -> Iterator[Path]:
    ssh_dir = (home or Path.home()) / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    with (ssh_dir / ".orch-sandbox.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield ssh_dir / "config"
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _strip_block(text: str, directory: Path) -> str:
    begin, end = _markers(directory)
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == begin:
            inside = True
        elif line.rstrip("\n") == end and inside:
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def install_include(directory: Path, home: Path | None = None, config_file: Path | None = None
                    ) -> Path:  # fmt: skip
    """Add the block to `home`'s ~/.ssh/config (this user's by default); returns that file."""
    begin, end = _markers(directory)
    with _ssh_config_locked(home) as config:
        text = config.read_text() if config.exists() else ""
        text = _strip_block(text, directory)
        # Include must come before any Host block to apply to every host.
        block = f"{begin}\nInclude {config_file or directory / 'ssh_config'}\n{end}\n"
        _write_private(config, block + text)
    return config


def remove_include(directory: Path, home: Path | None = None) -> None:
    with _ssh_config_locked(home) as config:
        if not config.exists():
            return
        text = config.read_text()
        stripped = _strip_block(text, directory)
        if stripped != text:
            _write_private(config, stripped)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".orch-tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
