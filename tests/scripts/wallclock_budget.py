"""Training for a wall-clock budget, each rank reading its own clock
(pytorch/pytorch#22834): the ranks leave the loop after different numbers of
steps (here rank 0's clock starts later, as when it writes the run's config
first), and rank 1, which leaves first, all-reduces its step count while rank 0
is still in a step's gradient all_reduce.

MODE=clock (the default) ends the loop by each rank's clock; MODE=synced ends it by
rank 0's clock, broadcast every step.
"""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def keep_training(start: float, budget_s: float) -> bool:
    decision = torch.tensor([float(time.time() - start < budget_s)])
    dist.broadcast(decision, src=0)  # rank 0's clock decides for every rank
    return bool(decision.item())


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()  # DDP all-reduces the gradients here
    optimizer.step()


def main() -> None:
    synced = os.environ.get("MODE", "clock") == "synced"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    budget_s, steps = 1.0, 0
    if rank == 0:
        time.sleep(0.5)  # rank 0 writes the run's config first: its clock starts later
    start = time.time()
    if synced:
        while keep_training(start, budget_s):
            train_step(model, optimizer)
            steps += 1
    else:
        while time.time() - start < budget_s:  # BUG: each rank reads its own clock
            train_step(model, optimizer)
            steps += 1
    total = torch.tensor([float(steps)])
    dist.all_reduce(total)
    print(f"rank {rank}: {steps} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
