"""Worker for bench_scale.py: CALLS small all_reduces in one loop, then each rank prints
its peak resident memory (the recorder's cost over a long dry run)."""

import os
import resource

import torch
import torch.distributed as dist


def main() -> None:
    calls = int(os.environ.get("CALLS", "100000"))
    dist.init_process_group("gloo")
    value = torch.ones(1)
    for _ in range(calls):
        dist.all_reduce(value)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    os.write(1, f"PEAK rank {dist.get_rank()} {peak_kib}\n".encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
