"""torchmetrics: every rank calls compute() (it syncs the metric's state across the
ranks) and rank 0 alone prints the value.

    ncclcheck preflight --nproc-per-node 2 examples/frameworks/torchmetrics_aligned.py
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from torchmetrics.classification import MulticlassAccuracy


def dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=gen)
    return TensorDataset(features, (features.sum(dim=1) > 0).long())


def main() -> None:
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_data, val_data = dataset(128, 0), dataset(32, 1)
    train_loader = DataLoader(train_data, batch_size=8, sampler=DistributedSampler(train_data))
    val_loader = DataLoader(val_data, batch_size=8, sampler=DistributedSampler(val_data, shuffle=False))
    accuracy = MulticlassAccuracy(num_classes=2)
    for epoch in range(3):
        model.train()
        for features, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            for features, labels in val_loader:
                accuracy.update(model(features), labels)
        value = accuracy.compute().item()  # every rank: compute() gathers every rank's state
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: accuracy {value:.3f}", flush=True)
        accuracy.reset()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
