"""Validation keeps one meter per kind of sample, created when the rank first meets that
kind in its own shard; the meters are synchronised by walking the dict. Each rank met
the kinds in another order, so one all-reduces while the other all-gathers."""

from __future__ import annotations

import torch
import torch.distributed as dist


class CountMeter:
    def __init__(self) -> None:
        self.hits = torch.zeros(2)

    def add(self, value: torch.Tensor) -> None:
        self.hits += torch.stack([value.sum(), torch.tensor(1.0)])

    def sync(self) -> float:
        dist.all_reduce(self.hits)
        return float(self.hits[0] / self.hits[1])


class SpreadMeter:
    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, value: torch.Tensor) -> None:
        self.values.append(float(value.mean()))

    def sync(self) -> float:
        mine = torch.tensor([min(self.values), max(self.values)])
        everyone = [torch.zeros(2) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
        return float(torch.stack(everyone).max() - torch.stack(everyone).min())


METER_FOR = {"counts": CountMeter, "spread": SpreadMeter}


def validation_shard(rank: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + rank)
    kinds = ["counts", "spread"] if rank % 2 == 0 else ["spread", "counts"]
    return [(kinds[i % 2], torch.randn(4, generator=gen)) for i in range(6)]


def main() -> None:
    dist.init_process_group("gloo")
    meters: dict[str, CountMeter | SpreadMeter] = {}
    for kind, sample in validation_shard(dist.get_rank()):
        meters.setdefault(kind, METER_FOR[kind]()).add(sample)
    results = {}
    for kind, meter in meters.items():
        results[kind] = meter.sync()
    if dist.get_rank() == 0:
        print(results)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
