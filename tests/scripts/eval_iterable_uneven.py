"""A streaming eval set: an IterableDataset that shards itself by rank (5 samples over
2 ranks: 3 and 2 batches), read through a generator (as tqdm does), a per-batch
all_reduce, and main() under torchelastic's @record, as real training scripts have it."""

import datetime

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class RankStream(IterableDataset):
    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __iter__(self):  # type: ignore[no-untyped-def]
        for index in range(dist.get_rank(), self.samples, dist.get_world_size()):
            yield torch.full((2,), float(index))


def progress(batches):  # type: ignore[no-untyped-def]
    yield from batches  # a progress bar's wrapper: the loader is iterated one level down


@record
def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model = DDP(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader([torch.ones(2)] * 16, batch_size=2)
    val_loader = DataLoader(RankStream(5), batch_size=1)
    for _epoch in range(2):
        model.train()
        for x in progress(train_loader):
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for x in progress(val_loader):
                loss = model(x).sum()
                dist.all_reduce(loss)


if __name__ == "__main__":
    main()
