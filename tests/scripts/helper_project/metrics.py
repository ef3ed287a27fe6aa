"""Metric helpers of the project: one of them all-reduces."""

import torch
import torch.distributed as dist


def mean_loss(total: torch.Tensor, count: int) -> float:
    stats = torch.stack([total, torch.tensor(float(count))])
    dist.all_reduce(stats)  # the collective, two calls below the rank branch
    return (stats[0] / stats[1]).item()


def log_validation(model: torch.nn.Module, loader) -> None:
    model.eval()
    total, count = torch.zeros(()), 0
    with torch.no_grad():
        for features, labels in loader:
            total += torch.nn.functional.cross_entropy(model(features), labels, reduction="sum")
            count += len(labels)
    model.train()
    print(f"val loss {mean_loss(total, count):.4f}", flush=True)
