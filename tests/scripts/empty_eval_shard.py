"""More ranks than validation samples (Lightning-AI/litgpt#2319): the validation set
is split by hand, ``samples[rank::world]``, so on 3 ranks with 2 samples rank 2's
shard is empty; its loop draws no batch and the mean over no losses raises there
alone, while ranks 0 and 1 wait in the all_reduce of the validation loss.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for features, labels in loader:
            losses.append(F.cross_entropy(model(features), labels))
    val_loss = torch.stack(losses).mean()  # no losses on an empty shard
    dist.all_reduce(val_loss)
    model.train()
    return val_loss.item() / dist.get_world_size()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_set = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
    val_set = TensorDataset(torch.randn(2, 8), torch.randint(0, 2, (2,)))
    train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(Subset(val_set, list(range(len(val_set)))[rank::world]), batch_size=1)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        validate(model, val_loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
