"""accelerate, fixed: every process evaluates its shard and gathers; only the
printing is the main process's.

    ncclcheck preflight --nproc-per-node 2 examples/frameworks/accelerate_aligned.py
"""

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def dataset(samples: int, seed: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=gen)
    return TensorDataset(features, (features.sum(dim=1) > 0).long())


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(dataset(128, 0), batch_size=8)
    val_loader = DataLoader(dataset(32, 1), batch_size=8)
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )
    for epoch in range(2):
        model.train()
        for features, labels in train_loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(features), labels))
            optimizer.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for features, labels in val_loader:
                predictions = model(features).argmax(dim=1)
                correct += accelerator.gather_for_metrics(predictions == labels).sum().item()
        if accelerator.is_main_process:
            print(f"epoch {epoch}: accuracy {correct}", flush=True)
        accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
