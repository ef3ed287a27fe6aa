"""Ranks that call the same collective from their own branch, by design:

- the first process prepares the data while the others wait, as YOLOv5's
  torch_distributed_zero_first and the transformers examples do: the others' barrier
  before the work pairs with rank 0's barrier after it (used twice);
- rank 0 broadcasts the seed it chose from the `if`, the others receive it from the
  `else`.

Correct, so aligned; then training together. PAUSE_S makes rank 0's preparation and
the step after the broadcast last that long: past preflight's short wait for records
that disagree, as the pairings across lines are not settled until the calls after them."""

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CACHE = os.environ.get("CACHE_DIR", tempfile.gettempdir())
PAUSE_S = float(os.environ.get("PAUSE_S", "0"))


@contextmanager
def torch_distributed_zero_first(local_rank: int) -> Iterator[None]:
    if local_rank not in (-1, 0):
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def cached(name: str, make: int, local_rank: int) -> torch.Tensor:
    path = os.path.join(CACHE, f"ncclcheck-zero-first-{name}.pt")
    with torch_distributed_zero_first(local_rank):
        if local_rank == 0:
            time.sleep(PAUSE_S)  # a slow preparation, the others in their barrier
            torch.save(torch.randn(make, 4, generator=torch.Generator().manual_seed(0)), path)
        return torch.load(path)


def main() -> None:
    dist.init_process_group("gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    features = cached("features", 64, local_rank)
    targets = cached("targets", 64, local_rank)[:, 0]
    if dist.get_rank() == 0:
        seed = torch.tensor([1234])
        dist.broadcast(seed, src=0)
    else:
        seed = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(seed, src=0)
    torch.manual_seed(int(seed))
    time.sleep(PAUSE_S)  # the broadcasts from two lines pair: nothing tells so until later
    data = TensorDataset(features, targets)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data, batch_size=8, sampler=DistributedSampler(data)):
        (model(x).squeeze(1) - y).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
