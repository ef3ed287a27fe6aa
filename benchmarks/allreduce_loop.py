"""Worker for bench_preflight.py: a tight loop of small gloo all_reduces, timed on rank 0."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    dist.init_process_group("gloo")
    value = torch.ones(1)
    for _ in range(300):  # warm-up: connections, allocator
        dist.all_reduce(value)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(value)
    elapsed = time.perf_counter() - start
    if dist.get_rank() == 0:
        print(
            "RESULT "
            + json.dumps(
                {
                    "us_per_call": elapsed / iterations * 1e6,
                    "mode": os.environ.get("BENCH_MODE", "?"),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
