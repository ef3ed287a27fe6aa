"""Early stopping on each rank's own validation loss, with a patience counter: within a
dry run's budget no rank runs out of patience, so the ranks never part there; in a real
run one rank runs out first and leaves the epoch loop while the others go on to the next
epoch's gradient all-reduce. Fixed twin: patience_on_reduced_loss.py."""

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
        if stopper.should_stop(loss.item()):
            break  # this rank's own loss decides
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
