"""Early stopping on a holdout loss, each rank scoring the slice of the holdout set its
rank picks (holdout_shard_setup.py), so each rank's loss is its own. The patience runs
out after a few evaluations, past a short dry run: there the ranks stop alike or not at
all. The day one rank's loss stops improving first, it leaves the epoch loop for the
final all_reduce while the others train on. Its twin, holdout_shard_patience_mean.py,
averages the loss over the ranks before the stopper sees it."""

import torch
import torch.distributed as dist
from holdout_shard_setup import Patience, holdout_loss, holdout_slice, model_and_optimizer, train_epoch


def main() -> None:
    dist.init_process_group("gloo")
    rows, targets = holdout_slice(dist.get_rank(), dist.get_world_size())
    model, optimizer = model_and_optimizer()
    stopper = Patience(patience=3)
    epochs = 0
    for _epoch in range(30):
        train_epoch(model, optimizer)
        epochs += 1
        loss = holdout_loss(model.module, rows, targets)
        if stopper.should_stop(loss):
            break
    summary = torch.tensor([float(epochs)])
    dist.all_reduce(summary)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
