"""Batches filled to a token budget, as people batch variable-length text: each rank takes
its share of the samples (DistributedSampler's split), then packs them into batches of at
most MAX_TOKENS tokens. The shares hold different lengths, so one rank packs fewer batches
than the other: its epoch ends early and the others' next step waits in DDP's all-reduce.
MODE=fixed: the whole set is packed into batches first, the same way on every rank, and the
batches are split evenly (the remainder dropped), so every rank has as many."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

MAX_TOKENS = 512


class Texts(Dataset[torch.Tensor]):
    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(self.lengths[index])


def pack(indices: list[int], lengths: list[int]) -> list[list[int]]:
    batches: list[list[int]] = [[]]
    tokens = 0
    for index in indices:
        if tokens + lengths[index] > MAX_TOKENS and batches[-1]:
            batches.append([])
            tokens = 0
        batches[-1].append(index)
        tokens += lengths[index]
    return batches


def batches_for(rank: int, world: int, lengths: list[int]) -> list[list[int]]:
    if os.environ.get("MODE", "broken") == "broken":
        return pack(list(range(rank, len(lengths), world)), lengths)  # split, then pack
    packed = pack(list(range(len(lengths))), lengths)  # pack, then split evenly
    usable = len(packed) - len(packed) % world
    return packed[rank:usable:world]


def collate(items: list[torch.Tensor]) -> torch.Tensor:
    return nn.utils.rnn.pad_sequence(items, batch_first=True).sum(dim=1, keepdim=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 200, (2000,), generator=generator).tolist()
    data = Texts(lengths)
    loader = DataLoader(data, batch_sampler=batches_for(rank, world, lengths), collate_fn=collate)
    model = DistributedDataParallel(nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    for epoch in range(2):
        for batch in loader:
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: {len(loader)} batches", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
