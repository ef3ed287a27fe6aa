"""A long epoch as production scripts have it: STEPS steps (10,000 by default), a
checkpoint every SAVE_EVERY (1,000) with a barrier after every rank's shard is written,
an evaluation every EVAL_EVERY (2,500) whose mean is all-reduced, and an epoch end that
saves and evaluates again. Nothing wrong in it: benchmarks/bench_coverage.py times what
covering it costs."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

STEPS = int(os.environ.get("STEPS", "10000"))
SAVE_EVERY = int(os.environ.get("SAVE_EVERY", "1000"))
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "2500"))


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    total = torch.zeros(2)
    with torch.no_grad():
        for features, target in loader:
            total += torch.tensor([nn.functional.mse_loss(model(features), target).item(), 1.0])
    dist.all_reduce(total)
    model.train()
    return float(total[0] / total[1])


def save(model: nn.Module, folder: str, step: int) -> None:
    torch.save(model.state_dict(), os.path.join(folder, f"rank{dist.get_rank()}-step{step}.pt"))
    dist.barrier()  # every shard written before anyone goes on


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train = TensorDataset(torch.randn(STEPS * 4 * world, 16), torch.randn(STEPS * 4 * world, 1))
    held_out = TensorDataset(torch.randn(64 * world, 16), torch.randn(64 * world, 1))
    loader = DataLoader(train, batch_size=4, sampler=DistributedSampler(train))
    eval_loader = DataLoader(held_out, batch_size=8, sampler=DistributedSampler(held_out, shuffle=False))
    step = 0
    with tempfile.TemporaryDirectory() as folder:
        for features, target in loader:
            loss = nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                save(model, folder, step)
            if step % EVAL_EVERY == 0:
                print(f"step {step}: eval loss {evaluate(model, eval_loader):.4f}", flush=True)
        save(model, folder, step)  # the epoch's end
        print(f"epoch end: eval loss {evaluate(model, eval_loader):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
