"""Worker for bench_probe.py: plain torch all_reduce at the probe's sizes, timed the probe's
way (3 warm-up calls, then the median of REPEATS blocks of ITERATIONS calls), on rank 0."""

import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

from ncclcheck.runtime.probe_worker import sizes


def main() -> None:
    max_bytes, repeats, iterations = (int(x) for x in sys.argv[1:4])
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    result = {}
    for size in sizes(max_bytes):
        elements = max(world, size // 4 // world * world)
        buffer = torch.ones(elements)
        for _ in range(3):
            dist.all_reduce(buffer)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iterations):
                dist.all_reduce(buffer)
            samples.append((time.perf_counter() - start) / iterations)
        # the slowest rank's median, as the probe reports it
        mine = torch.tensor([statistics.median(samples)], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        result[elements * 4] = mine.item() * 1e6
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
