"""A step of the checkpoint program (remote/checkpoint_node.py) as the head talks to it: its
request, the lines it says and is told, the route line that says where files come from, and
its answer, or {"ok": false, "error"} naming the node, the path and what to do. STANDARD
LIBRARY ONLY, shipped beside the program (as orch_checkpoint_step).
"""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable, Mapping
from typing import Any

try:  # on a node, loaded beside the program
    import orch_checkpoint_stream as stream
    import orch_owned as owned
except ImportError:
    from orchestrator.remote import checkpoint_stream as stream
    from orchestrator.remote import owned

Request = Mapping[str, Any]
Answer = dict[str, Any]
ReadLine = Callable[[], str]
WriteLine = Callable[[Answer], None]


class StepError(Exception):
    """What went wrong, as the user reads it (the path, the fix), and files that changed."""

    def __init__(self, message: str, changed: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.changed = changed


def node_name(request: Request) -> str:
    return str(request.get("node") or socket.gethostname())


def answering(step: Callable[..., Answer]) -> Callable[..., Answer]:
    """The step's answer, or {"ok": false, "error"} naming the node when it failed."""

    @functools.wraps(step)
    def run(request: Request, *args: Any, **kwargs: Any) -> Answer:
        try:
            return step(request, *args, **kwargs)
        except StepError as err:
            return _failed(request, str(err), list(err.changed))
        except stream.StreamError as err:
            return _failed(request, f"{err}: nothing of it is kept", list(err.changed))
        except owned.UnsafeDirectory as err:
            return _failed(request, str(err))
        except EOFError:
            return _failed(request, "the head went away: nothing was changed")
        except TimeoutError as err:
            return _failed(request, f"{err}: the sending node did not reach this node's port "
                                    "(a firewall between the nodes?)")  # fmt: skip
        except stream.UnsafePath as err:
            return _failed(request, f"the request names {err}: run a matching orch")
        except OSError as err:
            where = err.filename or "a connection"
            return _failed(request, f"{where}: {err.strerror or err}: fix it there and retry")
        except (KeyError, TypeError, ValueError) as err:
            return _failed(request, f"the request is not one this program reads ({err!r}): "
                                    "run a matching orch")  # fmt: skip

    return run


def _failed(request: Request, message: str, changed: list[str] | None = None) -> Answer:
    answer: Answer = {"ok": False, "error": f"on {node_name(request)}: {message}"}
    if changed is not None:
        answer["changed"] = changed
    return answer


def read_route(read_line: ReadLine) -> dict[str, Any]:
    """The head's route line: the link (or links) the files come over."""
    line = read_line()
    if not line:
        raise StepError("the head went away before it said where the files come from")
    route = json.loads(line)
    if not isinstance(route, dict):
        raise StepError("the head's route line is not one: run a matching orch")
    return route


def none_missing(wanted: Mapping[str, stream.Wanted], got: Mapping[str, Any]) -> None:
    """StepError when a file asked for did not arrive: a sender that stopped early."""
    lost = sorted(set(wanted) - set(got))
    if lost:
        raise StepError(f"{len(lost)} file(s) never arrived (e.g. {lost[0]}): the sender "
                        "stopped early; nothing of it is kept")  # fmt: skip
