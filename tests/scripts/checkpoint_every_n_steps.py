"""A checkpoint every SAVE_EVERY steps (200 by default, past a dry run's few steps), with
its barrier inside a try/except OSError, as people write a save that must not kill a long
run. MODE=broken: rank 1's disk is full (its save raises OSError before the barrier), so
it skips the barrier the others wait in. MODE=fixed: the barrier is outside the try, every
rank reaches it whatever its save did."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "200"))
BROKEN = os.environ.get("MODE", "broken") == "broken"


def save_checkpoint(model: nn.Module, folder: str, step: int) -> None:
    path = os.path.join(folder, f"rank{dist.get_rank()}-step{step}.pt")
    try:
        if BROKEN and dist.get_rank() == 1:
            raise OSError(28, "No space left on device", path)
        torch.save(model.state_dict(), path)
        if BROKEN:
            dist.barrier()  # every rank's shard written before anyone goes on
    except OSError as error:
        print(f"rank {dist.get_rank()}: checkpoint at step {step} failed: {error}", flush=True)
    if not BROKEN:
        dist.barrier()


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    step = 0
    with tempfile.TemporaryDirectory() as folder:
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for features, target in loader:
                loss = nn.functional.mse_loss(model(features), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step % SAVE_EVERY == 0:
                    save_checkpoint(model, folder, step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
