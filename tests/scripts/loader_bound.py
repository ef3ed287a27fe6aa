"""A healthy job bound by its DataLoader: each batch takes its worker a few seconds of
CPU (a slow decode), the training step is quick, so the ranks wait in the loader's next()
at the same line with the same locals at both of doctor's looks. It trains for RUN_S
seconds; doctor must call it progressing, not hung."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class SlowDecode(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        started = time.monotonic()
        x = torch.full((64, 64), float(index))
        while time.monotonic() - started < 2.5:  # the decode: CPU, in the worker
            x = (x @ x.t()).tanh()
        return x.sum(dim=0)


def main() -> None:
    dist.init_process_group("gloo")
    loader = DataLoader(SlowDecode(), batch_size=1, num_workers=1)
    deadline = time.monotonic() + float(os.environ.get("RUN_S", "60"))
    for step, batch in enumerate(loader):
        total = batch.sum()
        dist.all_reduce(total)
        if dist.get_rank() == 0:
            print(f"step {step}: {total.item():.3f}", flush=True)
        if time.monotonic() > deadline:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
