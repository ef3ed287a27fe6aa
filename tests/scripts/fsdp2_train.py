"""FSDP2 (fully_shard) training on CPU ranks: its collectives go through
dist.all_gather_single and dist.reduce_scatter_single."""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    features = torch.randn(64, 16)
    train_set = TensorDataset(features, (features.sum(dim=1) > 0).long())
    loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
    for batch, labels in loader:
        loss = nn.functional.cross_entropy(model(batch), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
