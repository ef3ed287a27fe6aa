"""Training shards made by hand, of 48 samples on rank 0 and 40 on the others (the
remainder of a packing step kept by rank 0; prime-rl#2515 saw 338 vs 327 batches):
6 batches against 5 per epoch, a DDP gradient all_reduce in every step. The last
step of rank 0's epoch pairs with the first of the others' next one; at the end
rank 0 waits alone. A dry run cut to 5 steps per epoch never gets there."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = TensorDataset(torch.randn(48 + 40 * 7, 8), torch.randint(0, 2, (48 + 40 * 7,)))
    start = 0 if rank == 0 else 48 + 40 * (rank - 1)
    shard = Subset(data, range(start, start + (48 if rank == 0 else 40)))
    loader = DataLoader(shard, batch_size=8)
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for features, labels in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(features), labels).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
