"""Evaluation on a subgroup of ranks 0 and 1, in a job of 3.

MODE=members (the default): only the members create the group, under the membership
test. The job goes on (no barrier in new_group by default), but rank 2 has made one
new_group call fewer: the group every rank creates next is named "2" on ranks 0-1 and
"1" on rank 2, and each side waits for peers that never come.
MODE=everyone: every rank creates the group, the members use it: aligned.
"""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

MODE = os.environ.get("MODE", "members")


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = TensorDataset(torch.randn(48, 4))
    train_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    for (x,) in train_loader:
        model(x).pow(2).mean().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)

    eval_ranks = [0, 1]
    if MODE == "everyone":
        eval_group = dist.new_group(eval_ranks)
    if rank in eval_ranks:
        if MODE == "members":
            eval_group = dist.new_group(eval_ranks)
        model.eval()
        val_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, 2, rank, shuffle=False))
        total = torch.zeros(1)
        with torch.no_grad():
            for (x,) in val_loader:
                total += model(x).sum()
        dist.all_reduce(total, group=eval_group)
    dist.barrier()

    everyone = dist.new_group(list(range(dist.get_world_size())))  # a checkpoint helper's group
    dist.all_reduce(torch.ones(1), group=everyone)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
