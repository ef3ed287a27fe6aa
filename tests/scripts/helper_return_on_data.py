"""An early return under a test on the data, in a helper two calls below the loop: rank 1's
third batch holds an outlier, step() returns before sync_gradients() and rank 1 misses
the all_reduce rank 0 waits in (data-dependent-branch)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def sync_gradients(gradient: torch.Tensor) -> None:
    dist.all_reduce(gradient)


def step(batch: torch.Tensor) -> None:
    if batch.abs().max() > 100:  # an outlier: skip the batch
        return
    sync_gradients(batch.mean(dim=0))


def run_epoch(batches: list[torch.Tensor]) -> None:
    for batch in batches:
        step(batch)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    batches = [torch.randn(4, 4) for _ in range(4)]
    if rank == 1:
        batches[2][0, 0] = 1e6  # a corrupt record in rank 1's shard
    run_epoch(batches)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
