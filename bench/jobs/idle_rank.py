"""A rank that only waits: a light stand-in for 64 ranks blocked in a collective, for the
cost of `orch stacks`. Runs until the stop file exists (or --max-seconds)."""

from __future__ import annotations

import argparse
import os
import threading
import time


def wait_for_peers(stop: str, deadline: float) -> None:
    while not os.path.exists(stop) and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.max_seconds
    # A second thread, as a data loader or a watchdog gives every real rank.
    threading.Thread(target=wait_for_peers, args=(args.stop_file, deadline), daemon=True).start()
    print(f"rank {os.environ.get('RANK')} up on {os.uname().nodename}", flush=True)
    wait_for_peers(args.stop_file, deadline)


if __name__ == "__main__":
    main()
