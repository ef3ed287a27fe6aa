"""FSDP2 (fully_shard) on a stack of blocks with LayerDrop: in training, each block is
skipped when a draw from Python's random falls under the drop rate. The draw is seeded
with the rank, so the ranks skip other blocks, and a skipped block's parameters are
never all-gathered on that rank: at the first step the ranks wait in other FSDP
collectives inside loss.backward()."""

import random

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


class Stack(nn.Module):
    def __init__(self, width: int, depth: int, layerdrop: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(width, 1)
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.training and random.random() < self.layerdrop:
                continue
            x = x + block(x)
        return self.head(x)


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    random.seed(1234 + rank)
    torch.manual_seed(0)
    model = Stack(16, 6, layerdrop=0.3)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _step in range(4):
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
