"""`accelerate launch`, preceded by writing its config: the head's (pdsh launcher) or a node's.

orch copies this file into the run directory (pdsh launcher, on the head) or sends it to
every node (standard launcher, one spec per machine rank) and runs it with the job's
interpreter:

    python accelerate_head.py SPEC.json --config_file CONFIG.yaml SCRIPT [ARGS...]

It writes CONFIG.yaml with accelerate's own ClusterConfig from the fields in
SPEC.json, then runs `accelerate launch` with the remaining arguments in the same
process. accelerate (and torch under it) is imported once per job, here, instead
of once in orch to render the config and again in the launcher.

Standard library, PyYAML and accelerate only: the job's interpreter need not have
orch installed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping

# accelerate copies the head's whole environment into DeepSpeed's env file and warns, value
# and all, of each variable it leaves out (one holding a space: SSH_CLIENT and SSH_CONNECTION
# in every SSH login, orch's own PDSH_SSH_ARGS_APPEND, any the user exported). With orch's
# pdsh launcher that file is /dev/null: the job's variables reach the nodes another way.
_SKIPPED_VARIABLE = "WARNING: Skipping "


def config_text(fields: Mapping[str, object], header: str = "") -> str:
    """The YAML `accelerate launch --config_file` loads, built by accelerate's ClusterConfig."""
    import yaml
    from accelerate.commands.config.config_args import ClusterConfig

    # ClusterConfig turns the enum names into enums and back; same text as its to_yaml_file.
    return header + yaml.safe_dump(ClusterConfig(**fields).to_dict())


def write_config(spec_path: str) -> str:
    """Write the config SPEC names (private to the user, like the rest of the run) and
    return its path."""
    with open(spec_path, encoding="utf-8") as handle:
        spec = json.load(handle)
    # A relative path is beside the spec (on a node: in the job's node directory).
    path = os.path.join(os.path.dirname(os.path.abspath(spec_path)), spec["config_file"])
    text = config_text(spec["fields"], spec.get("header", ""))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


def without_runners_path_entry(env: dict[str, str], workdir: str) -> dict[str, str]:
    """accelerate appends the working directory to PYTHONPATH, and DeepSpeed's runner puts
    it first again: the pdsh line read `PYTHONPATH=DIR:DIR`. Leave it to the runner."""
    entries = env.get("PYTHONPATH", "").split(os.pathsep)
    if entries and entries[-1] == workdir:
        entries.pop()
    kept = [entry for entry in entries if entry]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


class _NothingOfTheHeadsEnvironment(logging.Filter):
    """Drops accelerate's warnings about the env file's lines: each carries a variable's
    value, unmasked, into the terminal and the job's logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_SKIPPED_VARIABLE)


def no_env_file_lines(current_env: Mapping[str, str]) -> list[str]:
    """accelerate's env-file writer when DeepSpeed's env file is /dev/null: no line."""
    return []


def _quiet_about_the_heads_environment() -> None:
    import accelerate.commands.launch as launch

    logging.getLogger("accelerate.utils.environment").addFilter(_NothingOfTheHeadsEnvironment())
    # The lines would go to /dev/null: not building them is what keeps accelerate quiet (the
    # filter is for an accelerate that builds them elsewhere).
    if os.environ.get("DS_ENV_FILE") == os.devnull and hasattr(
        launch, "convert_dict_to_env_variables"
    ):
        launch.convert_dict_to_env_variables = no_env_file_lines
    prepare = getattr(launch, "prepare_deepspeed_cmd_env", None)
    if prepare is None:  # another accelerate: its lines stay as they are
        return

    def prepared(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
        cmd, env = prepare(args)
        if args.num_machines > 1 and args.deepspeed_multinode_launcher == "pdsh":
            env = without_runners_path_entry(env, os.path.abspath("."))
        return cmd, env

    launch.prepare_deepspeed_cmd_env = prepared


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: accelerate_head.py SPEC.json ACCELERATE-LAUNCH-ARGS...\n")
        return 2
    write_config(argv[0])
    _quiet_about_the_heads_environment()
    from accelerate.commands.launch import launch_command, launch_command_parser

    # What `accelerate launch` itself does with its arguments.
    launch_command(launch_command_parser().parse_args(argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
