"""patience_on_local_loss.py fixed: the validation loss is averaged over the ranks before
the patience counter reads it, so every rank stops at the same epoch."""

import torch
import torch.distributed as dist
import torch.nn as nn
from patience_trainer import EarlyStopper, parts, train_epoch


def main() -> None:
    train, val, model, optimizer = parts()
    stopper = EarlyStopper()
    for epoch in range(1000):
        train_epoch(train, model, optimizer, epoch)
        with torch.no_grad():
            loss = torch.stack([nn.functional.mse_loss(model(x), y) for x, y in val]).mean()
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)  # one value on every rank
        if stopper.should_stop(loss.item()):
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
