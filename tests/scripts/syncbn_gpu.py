"""A GPU training script with SyncBatchNorm, for `preflight --cpu`.

MODE=aligned trains and evaluates on every rank. MODE=rank0_preview has rank 0
alone run the unwrapped model on a preview batch after each epoch without
switching it to eval mode: SyncBatchNorm all-gathers its batch statistics in
training mode, so rank 0 waits for ranks that never come (pytorch/pytorch#48988)."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )


def main() -> None:
    mode = os.environ.get("MODE", "aligned")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = nn.SyncBatchNorm.convert_sync_batchnorm(build_model()).cuda()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(48, 3, 8, 8), torch.randint(0, 2, (48,)))
    train = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    val = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    for _epoch in range(2):
        model.train()
        for images, labels in train:
            loss = F.cross_entropy(model(images.cuda()), labels.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if mode == "rank0_preview" and dist.get_rank() == 0:
            preview = model.module(data.tensors[0][:4].cuda())
            print("preview", preview.argmax(1).tolist(), flush=True)
        model.eval()
        correct = torch.zeros(1).cuda()
        with torch.no_grad():
            for images, labels in val:
                correct += (model(images.cuda()).argmax(1) == labels.cuda()).sum()
        dist.all_reduce(correct)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
