"""A step function returns None for a batch with a non-finite value, and the loop skips
on that None: the rank whose shard holds the bad row skips one step's gradient all_reduce.
The test that decided is the finiteness check in the step, one helper deep, not the
`if loss is None` the loop reads. MODE=fixed zeroes the bad batch's loss instead."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def all_finite(batch: torch.Tensor) -> bool:
    return bool(torch.isfinite(batch).all())


class Stepper:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def step(self, batch: torch.Tensor) -> torch.Tensor | None:
        if not all_finite(batch) and os.environ.get("MODE") != "fixed":
            return None
        return torch.nan_to_num(batch * self.weight).sum()


def main() -> None:
    dist.init_process_group("gloo")
    rows = torch.ones(16, 2)
    rows[5, 0] = float("nan")  # one bad row, in one rank's shard
    data = TensorDataset(rows)
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=False))
    stepper = Stepper(torch.ones(2))
    for (batch,) in loader:
        loss = stepper.step(batch)
        if loss is None:
            continue
        dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
