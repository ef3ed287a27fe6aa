"""A healthy job with a long checkpoint save: after each epoch rank 0 alone writes a
checkpoint (a large state dict, torch.save, then an fsync) while the other ranks wait in
the barrier that follows, as people write it. The save takes several seconds, well inside
the process group's timeout: the job is progressing, not hung, and the rank the others
wait for is working. It runs for RUN_S seconds; rank 0 prints "saving" as each save
begins."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn


def save_checkpoint(model: nn.Module, folder: Path, epoch: int) -> None:
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    # the optimizer's moments and an EMA copy, as real checkpoints carry
    state.update({f"ema.{name}": tensor * 0.999 for name, tensor in model.state_dict().items()})
    path = folder / f"epoch{epoch}.pt"
    for copy in range(int(os.environ.get("SAVE_COPIES", "12"))):
        torch.save(state, path)
        with path.open("rb+") as handle:
            os.fsync(handle.fileno())
        state = {name: tensor + copy for name, tensor in state.items()}


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(2048, 2048) for _ in range(6)))
    deadline = time.monotonic() + float(os.environ.get("RUN_S", "60"))
    with tempfile.TemporaryDirectory() as folder:
        epoch = 0
        while time.monotonic() < deadline:
            for _ in range(3):
                loss = model(torch.randn(8, 2048)).pow(2).mean()
                loss.backward()
                for parameter in model.parameters():
                    dist.all_reduce(parameter.grad)
                    parameter.grad = None
            if rank == 0:
                print(f"epoch {epoch}: saving", flush=True)
                save_checkpoint(model, Path(folder), epoch)
            dist.barrier()
            epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
