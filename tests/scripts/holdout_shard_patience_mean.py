"""holdout_shard_patience.py's twin: each rank scores its own slice of the holdout set,
and the loss is averaged over the ranks before the stopper sees it, so every rank stops at
the same epoch."""

import torch
import torch.distributed as dist
from holdout_shard_setup import Patience, holdout_loss, holdout_slice, model_and_optimizer, train_epoch


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    rows, targets = holdout_slice(dist.get_rank(), world)
    model, optimizer = model_and_optimizer()
    stopper = Patience(patience=3)
    for _epoch in range(30):
        train_epoch(model, optimizer)
        total = torch.tensor([holdout_loss(model.module, rows, targets)])
        dist.all_reduce(total)
        if stopper.should_stop(total.item() / world):
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
