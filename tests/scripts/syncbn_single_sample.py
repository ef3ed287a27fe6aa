"""A SyncBatchNorm layer skipped for a batch of one sample (pytorch/pytorch#44957).

The training set is split by hand (6 and 5 samples), so rank 1's last batch holds
one sample: its forward skips the layer and the all_gather of batch statistics
in it, which rank 0 makes. MODE=sampler shards with DistributedSampler
(drop_last=True): every rank's batches have the same sizes and skip alike.

Written for GPUs (nccl, .cuda()): run it with `ncclcheck preflight --cpu`.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.shape[0] > 1:  # BatchNorm cannot normalise a single sample
            h = self.bn(h)
        return self.out(h)


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(Net()).cuda(), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(11, 4), torch.randn(11, 1))
    if os.environ.get("MODE", "by_hand") == "sampler":
        sampler = DistributedSampler(data, shuffle=False, drop_last=True)  # 5 samples each
        loader = DataLoader(data, batch_size=2, sampler=sampler)
    else:
        loader = DataLoader(Subset(data, range(rank, len(data), 2)), batch_size=2)  # 6 and 5 samples
    for features, targets in loader:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(features.cuda()), targets.cuda()).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
