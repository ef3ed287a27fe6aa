"""A healthy job: matmuls, a gradient-sized all_reduce and a logged loss, step after step
for RUN_S seconds (doctor must call it progressing, not hung)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    weights = torch.randn(128, 128)
    deadline = time.monotonic() + float(os.environ.get("RUN_S", "60"))
    step = 0
    while True:
        activations = torch.randn(64, 128) @ weights
        gradient = activations.t() @ activations / 64
        dist.all_reduce(gradient)
        weights -= 1e-4 * gradient / dist.get_world_size()
        loss = activations.pow(2).mean()
        if step % 50 == 0 and rank == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
        step += 1
        # the end decided together: a rank that stopped on its own clock would leave the
        # other in the next all_reduce
        done = torch.tensor([float(time.monotonic() >= deadline)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
    if rank == 0:
        print(f"steps done: {step}", flush=True)  # what benchmarks/bench_watch.py compares
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
