"""Early stopping the way many training scripts write it: a best loss and a count of
epochs without improvement, the count kept by each rank from its own validation loss
(evaluate() averages the rank's own shard). Within a dry run the count never reaches the
patience; in a real run one rank's count does first, it leaves the epoch loop, and the
others wait in the next epoch's gradient all-reduce. Fixed twin:
patience_counter_on_mean.py, whose loss is averaged over every rank."""

import torch
import torch.distributed as dist
import torch.nn as nn
from patience_trainer import parts, train_epoch


def evaluate(model, loader):
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += nn.functional.mse_loss(model(x), y).item()
    return total / len(loader)


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
