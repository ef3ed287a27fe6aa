"""A hand-split eval set whose batch count is computed from the rank: 9 batches over 2
ranks give rank 0 five and rank 1 four, and rank 0's fifth all_reduce has no partner
(uneven-eval-batches, named at the loop whose length differs)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total_batches = 9
    num_batches = total_batches // world + (1 if rank < total_batches % world else 0)
    correct = torch.zeros(1)
    with torch.no_grad():
        for _ in range(num_batches):
            hits = torch.ones(1)
            dist.all_reduce(hits)
            correct += hits
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
