"""The summed loss reduced to rank 0 and read on every rank (pytorch/pytorch#77562):
dist.reduce leaves the result on its dst only, so rank 1 decides to stop on its own
partial value, about half of rank 0's mean: it leaves the epoch loop and ends while
rank 0 goes on to the next epoch's gradient all_reduce.

MODE=unsynced (the default) reads the reduced loss on every rank; MODE=careful reads
it on rank 0 alone for the log, and decides on a copy broadcast from rank 0.
STOP_BELOW (default 3.0): the mean loss that ends training; at 100 every rank stops
after the first epoch, whatever it read, and the run stays aligned.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main() -> None:
    careful = os.environ.get("MODE", "unsynced") == "careful"
    stop_below = float(os.environ.get("STOP_BELOW", "3.0"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(5):
        epoch_loss = torch.zeros(1)
        for features, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(features), labels)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach()
        dist.reduce(epoch_loss, dst=0)  # the sum lands on rank 0 only
        if careful:
            if rank == 0:
                print(f"epoch {epoch}: loss {epoch_loss.item() / world:.3f}")
            dist.broadcast(epoch_loss, src=0)  # every rank decides on rank 0's sum
        mean_loss = epoch_loss / world
        if mean_loss.item() < stop_below:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
