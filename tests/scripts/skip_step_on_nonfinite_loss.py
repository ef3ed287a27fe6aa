"""A training loop with a fixed number of steps that skips a step whose loss is not
finite, before the helper that all-reduces the gradients. Rank 1 meets one bad batch at
step 3: from there its all_reduces pair with rank 0's of the step before, and at the end
rank 0 waits in its last one while rank 1 has left the loop (data-dependent-branch)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def sync_gradients(gradient: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(gradient)
    return gradient / dist.get_world_size()


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    weights = torch.zeros(8)
    for step in range(8):
        batch = torch.randn(4, 8)
        if rank == 1 and step == 3:
            batch[0, 0] = float("inf")  # a corrupt record in rank 1's shard
        loss = (batch @ weights).pow(2).mean() + batch.sum()
        if not torch.isfinite(loss):
            print(f"rank {rank}: skipping step {step}", flush=True)
            continue
        gradient = sync_gradients(batch.mean(dim=0))
        weights -= 0.1 * gradient
        print(f"rank {rank} step {step}: loss {loss.item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
