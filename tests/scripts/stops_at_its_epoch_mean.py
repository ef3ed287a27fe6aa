"""A training loop that stops once the epoch's mean loss is under a target, on each rank's
own mean, summed over its own batches: a data test in form (`math.isfinite`), a decision in
fact, taken on what this rank saw over the epoch. Within a dry run's budget no rank's mean
gets there; in a real run one rank's does first, it leaves the epoch loop, and the others
wait in the next epoch's gradient all-reduce. Fixed twin: stops_at_the_reduced_epoch_mean.py."""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

TARGET_LOSS = 1e-6  # never met within a dry run


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(1000):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        running_loss, seen = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
            seen += 1
        epoch_loss = running_loss / max(seen, 1)
        if math.isfinite(epoch_loss) and epoch_loss < TARGET_LOSS:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
