"""Hand-made eval shards of 4/3/3/3 batches and no collective in the eval loop: no hang,
but the counts differ (a warning), and the dry run reports them exactly."""

import datetime

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(256, 8, generator=gen)
    data = TensorDataset(features, (features.sum(dim=1) > 0).long())
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    eval_shard = Subset(data, range(rank, 13, world))  # 13 samples: 4, 3, 3, 3
    eval_loader = DataLoader(eval_shard, batch_size=1)
    for _epoch in range(2):
        for x, y in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        total = torch.zeros(2)
        with torch.no_grad():
            for x, y in eval_loader:
                total += torch.stack([F.cross_entropy(model(x), y), torch.tensor(1.0)])
        dist.all_reduce(total)
        model.train()


if __name__ == "__main__":
    main()
