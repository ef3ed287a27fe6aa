"""A length-bucketing batch sampler, as people write for variable-length text: each rank
takes its share of the samples, sorts them by length into buckets and packs each bucket to
a token budget. Its ``__len__`` is an estimate from the whole set's tokens, the same on
every rank, as such samplers often give, so the loaders agree on their length while the
ranks pack different numbers of batches: at the epoch's end one rank's DDP step waits for
a partner that has moved on. MODE=fixed: the batches are packed from the whole set, the
same on every rank, and dealt out evenly, so ``__len__`` is exact."""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, Sampler

MAX_TOKENS = 400


class Sentences(Dataset[torch.Tensor]):
    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((self.lengths[index],), 0.01)


class BucketBatchSampler(Sampler[list[int]]):
    def __init__(self, lengths: list[int], rank: int, world: int, fixed: bool) -> None:
        self.lengths, self.rank, self.world, self.fixed = lengths, rank, world, fixed

    def _pack(self, indices: list[int]) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        tokens = 0
        for index in sorted(indices, key=lambda i: self.lengths[i]):
            if current and tokens + self.lengths[index] > MAX_TOKENS:
                batches.append(current)
                current, tokens = [], 0
            current.append(index)
            tokens += self.lengths[index]
        return batches + ([current] if current else [])

    def __iter__(self) -> Iterator[list[int]]:
        if self.fixed:
            packed = self._pack(list(range(len(self.lengths))))
            usable = len(packed) - len(packed) % self.world
            yield from packed[self.rank : usable : self.world]
        else:
            yield from self._pack(list(range(self.rank, len(self.lengths), self.world)))

    def __len__(self) -> int:
        if self.fixed:
            packed = self._pack(list(range(len(self.lengths))))
            return len(packed) // self.world
        return sum(self.lengths) // (MAX_TOKENS * self.world)  # about right, and the same everywhere


def collate(items: list[torch.Tensor]) -> torch.Tensor:
    return nn.utils.rnn.pad_sequence(items, batch_first=True).mean(dim=1, keepdim=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = torch.randint(8, 120, (3000,), generator=torch.Generator().manual_seed(1)).tolist()
    sampler = BucketBatchSampler(lengths, rank, world, fixed=os.environ.get("MODE") == "fixed")
    loader = DataLoader(Sentences(lengths), batch_sampler=sampler, collate_fn=collate)
    model = DistributedDataParallel(nn.Linear(1, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(2):
        model.train()
        running = 0.0
        for batch in loader:
            loss = model(batch).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
        if rank == 0:
            print(f"epoch {epoch}: mean loss {running / max(1, len(loader)):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
