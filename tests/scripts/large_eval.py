"""A validation set of SAMPLES samples (20,000 by default) with a per-batch all_reduce:
preflight runs its last --eval-batches batches, whatever SAMPLES is. UNEVEN=1 splits it
by hand, the remainder to rank 0: rank 0's last batch has no partner. STREAM=1 makes it
a stream (an IterableDataset that shards itself by rank, as webdataset or a streaming
set does): no length, so preflight reads it ahead instead. ENDLESS=1 makes the stream
endless, each sample a millisecond's read as from storage (not a CPU spun for the
whole read-ahead bound), and the loop stop itself after EVAL_STEPS batches."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class RankStream(IterableDataset):
    """This rank's part of the set, produced as it is read."""

    def __init__(self, first: int, end: int, read_s: float = 0.0) -> None:
        self.first, self.end, self.read_s = first, end, read_s

    def __iter__(self):  # type: ignore[no-untyped-def]
        for index in range(self.first, self.end):
            if self.read_s:
                time.sleep(self.read_s)
            yield torch.full((4,), float(index))


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    samples = int(os.environ.get("SAMPLES", "20000"))
    val_set = TensorDataset(torch.randn(samples, 4))
    per_rank = samples // world
    extra = samples % world if rank == 0 and os.environ.get("UNEVEN") == "1" else 0
    mine = (rank * per_rank, (rank + 1) * per_rank + extra)
    read_s = 0.0
    if os.environ.get("ENDLESS") == "1":
        mine, read_s = (mine[0], sys.maxsize), 0.001
    eval_steps = int(os.environ.get("EVAL_STEPS", "0")) or sys.maxsize
    if os.environ.get("STREAM") == "1":
        val_loader = DataLoader(RankStream(*mine, read_s=read_s), batch_size=4)
    elif os.environ.get("UNEVEN") == "1":
        val_loader = DataLoader(Subset(val_set, range(*mine)), batch_size=4)
    else:
        val_loader = DataLoader(val_set, batch_size=4, sampler=DistributedSampler(val_set, shuffle=False))
    model = torch.nn.Linear(4, 1).eval()
    with torch.no_grad():
        for step, batch in enumerate(val_loader):
            if step == eval_steps:
                break
            features = batch[0] if isinstance(batch, list) else batch
            loss = model(features).mean()
            dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
