"""An eval loop that wraps each step in try/except ValueError and logs the error, the way
a loader of images or documents often is: rank 1's decoder raises on a corrupt record
(record 2 of its shard), so rank 1 skips that step's all_reduce and the ranks are a call
apart from there (rank-exception: the handler swallowed it)."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("eval")


def decode(record: int, rank: int) -> torch.Tensor:
    if rank == 1 and record == 2:
        raise ValueError(f"record {record}: truncated JPEG")
    return torch.full((2, 4), float(record))


def evaluate(model: nn.Module, rank: int) -> float:
    model.eval()
    total, count = torch.zeros(1), 0
    with torch.no_grad():
        for record in range(5):
            try:
                batch = decode(record, rank)
                loss = model(batch).pow(2).mean().reshape(1)
                dist.all_reduce(loss)
                total += loss
                count += 1
            except ValueError as exc:
                log.warning("skipping a bad record: %s", exc)
    return float(total) / max(count, 1)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    print("val loss", evaluate(model, dist.get_rank()), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
