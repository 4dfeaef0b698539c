"""The torchrun launcher: every node's agent runs torchrun, c10d rendezvous at node 0.
Nodes may hold different rank counts: each node's agent starts its own. ColossalAI's
recipes run on it as they are (its `colossalai run` is torchrun underneath). Pure.

Each node's torchrun is told whether it hosts the c10d store (`--rdzv_conf is_host=`):
node 0's does, no other. Left to itself, torchrun guesses by comparing the endpoint with
its machine's names and addresses: a loopback endpoint makes every node the host (the first
to bind the port wins, on whichever node), an address on a secondary NIC makes none (the
rendezvous hangs). Node 0's agent vouches for what listens on the main port, so the store
must be node 0's."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.plan.launch_plan import HeadContext, JobShape, Launch, node_side
from orchestrator.remote.agent_spec import RANK_PROGRAM

RDZV_CONF_OPTIONS = ("--rdzv_conf", "--rdzv-conf")  # torchrun's spellings of the option
IS_HOST_KEY = "is_host"  # torch's c10d backend reads it (params.get_as_bool)


def launch(job: JobShape, head: HeadContext) -> Launch:
    commands = tuple(
        _torchrun_command(job, count, is_host=node_rank == 0)
        for node_rank, count in enumerate(job.ranks_per_node)
    )
    return node_side(job, commands[0], (), wait_for_main=False, pdsh=head.pdsh,
                     environ=head.environ, per_node=commands)  # fmt: skip


def _torchrun_command(job: JobShape, nproc: int, *, is_host: bool) -> tuple[str, ...]:
    args, conf = split_rdzv_conf(job.torchrun_args)
    return (
        job.python, "-m", "torch.distributed.run",
        f"--nnodes={len(job.hostfile.hosts)}",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={job.hostfile.names[0]}:{job.main_port}",
        f"--rdzv_id={job.rdzv_id or job.job_id}",
        *args,
        f"--rdzv_conf={rdzv_conf_with_host(conf, is_host)}",
        "--no-python", RANK_PROGRAM,
    )  # fmt: skip


def split_rdzv_conf(args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A recipe's torchrun arguments without their `--rdzv_conf` options, and those
    options' values in order (`--rdzv_conf=V` or `--rdzv_conf V`): orch gives torchrun one
    `--rdzv_conf`, theirs and its own in it (argparse would keep only the last)."""
    rest: list[str] = []
    confs: list[str] = []
    words = iter(args)
    for word in words:
        option, equals, value = word.partition("=")
        if option not in RDZV_CONF_OPTIONS:
            rest.append(word)
        elif equals:
            confs.append(value)
        else:
            confs.append(next(words, ""))
    return tuple(rest), tuple(confs)


def rdzv_conf_with_host(confs: Sequence[str], is_host: bool) -> str:
    """`k1=v1,...` of the recipe's settings, a later one of a key winning as in torch's
    parser, with `is_host` set as orch says whatever the recipe set."""
    settings: dict[str, str] = {}
    for conf in confs:
        for pair in filter(None, (part.strip() for part in conf.split(","))):
            key, _, value = pair.partition("=")
            settings[key.strip()] = value.strip()
    settings.pop(IS_HOST_KEY, None)
    settings[IS_HOST_KEY] = "true" if is_host else "false"
    return ",".join(f"{key}={value}" for key, value in settings.items())
