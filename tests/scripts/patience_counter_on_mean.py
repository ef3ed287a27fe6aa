"""The fixed twin of patience_counter.py: the validation loss is averaged over every
rank's shard before the count is kept, so every rank counts alike and stops together."""

import torch
import torch.distributed as dist
import torch.nn as nn
from patience_trainer import parts, train_epoch


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.mse_loss(model(x), y).item()
    mean = torch.tensor([total / len(loader)])
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def main():
    train, val, model, optimizer = parts()
    best, bad, patience = float("inf"), 0, 30
    for epoch in range(100):
        train_epoch(train, model, optimizer, epoch)
        val_loss = evaluate(model, val)
        if val_loss < best:
            best, bad = val_loss, 0
        else:
            bad += 1
        if bad >= patience:
            print(f"early stop at {epoch}")
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
