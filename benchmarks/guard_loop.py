"""Worker for bench_guard.py: per-call cost of check_aligned next to a small all_reduce,
alternating blocks in the same processes, timed on rank 0."""

import json
import statistics
import time

import torch
import torch.distributed as dist

from ncclcheck.guard import check_aligned


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(1)
    for _ in range(50):
        dist.all_reduce(value)
        check_aligned("warmup", steps=3)
    samples: dict[str, list[float]] = {"all_reduce": [], "check_aligned": []}
    for _ in range(20):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(value)
        samples["all_reduce"].append((time.perf_counter() - start) / 20 * 1e6)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(20):
            check_aligned("eval", steps=3)
        samples["check_aligned"].append((time.perf_counter() - start) / 20 * 1e6)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({k: statistics.median(v) for k, v in samples.items()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
