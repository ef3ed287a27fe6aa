"""The fixed twin of accelerate_hand_split_validation.py: the validation loader is
prepared too, so accelerate shards it evenly and gather_for_metrics drops the padding.

An accelerate script shaped like accelerate's nlp_example: the training loader is
prepared, but the validation set is split across processes by hand, so with 49 samples
process 0 gets 25 (7 batches) and process 1 gets 24 (6). BUG: each eval batch's
predictions go through gather_for_metrics; process 0's seventh has no partner while
process 1 waits in wait_for_everyone() (the fixed twin prepares the validation loader:
accelerate_hand_split_validation_fixed.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def synthetic(samples: int, seed: int) -> TensorDataset:
    features = torch.randn(samples, 16, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(features, (features.sum(dim=1) > 0).long())


def main() -> None:
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_loader = DataLoader(synthetic(128, 0), batch_size=16, shuffle=True)
    val_set = synthetic(49, 1)
    val_loader = DataLoader(val_set, batch_size=4)
    model, optimizer, train_loader, val_loader = accelerator.prepare(
        model, optimizer, train_loader, val_loader
    )

    for epoch in range(2):
        model.train()
        for features, labels in train_loader:
            loss = F.cross_entropy(model(features), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        correct = total = 0
        for features, labels in val_loader:
            with torch.no_grad():
                predictions = model(features).argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, labels))
            correct += (predictions == references).sum().item()
            total += references.numel()
        accelerator.print(f"epoch {epoch}: accuracy {correct / total:.3f}")
        accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
