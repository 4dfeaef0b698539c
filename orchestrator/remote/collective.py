"""`orch doctor --deep` on one node: a timed all_reduce with torch.distributed.

Shipped inline with `python -c`; needs only torch. One process per node,
rendezvous at the main node over TCP. Prints one JSON line with this rank's
bus bandwidth; with NCCL_DEBUG=INFO the head reads the transport NCCL chose.

Arguments: ADDRESS PORT RANK WORLD_SIZE TIMEOUT_S SIZE_BYTES ITERATIONS
"""

from __future__ import annotations

import datetime
import json
import sys
import time


def main(argv: list[str]) -> None:
    address, port, rank, world, timeout, size, iterations = argv[:7]
    rank, world, size, iterations = int(rank), int(world), int(size), int(iterations)
    result = {"rank": rank, "ok": False}
    try:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available()
        backend = "nccl" if cuda else "gloo"
        result["backend"] = backend
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=float(timeout)),
        )
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # warm-up: connections are set up here
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / iterations
        expected = float(world) ** (iterations + 1)
        correct = abs(float(tensor[0]) - expected) <= 1e-3 * expected
        # Bus bandwidth as nccl-tests defines it for all_reduce.
        bus = size * 2 * (world - 1) / world / seconds / 1e6 if world > 1 else 0.0
        result.update(ok=correct, seconds=seconds, bus_bandwidth_mbps=bus)
        if not correct:
            result["error"] = f"wrong all_reduce result {float(tensor[0])} != {expected}"
        dist.destroy_process_group()
    except Exception as err:  # reported per node, not raised
        result["error"] = f"{type(err).__name__}: {err}"[:400]
    print("ORCH-COLLECTIVE " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
