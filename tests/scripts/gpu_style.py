"""A training script written for NCCL and CUDA, for `preflight --cpu` on a machine
without GPUs. MODE=aligned trains and evaluates on every rank; MODE=rank0 evaluates
on rank 0 alone, with an all_reduce inside; MODE=stream uses a CUDA stream, which
--cpu does not map."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    model.eval()
    total = torch.zeros(2, device=device)
    with torch.no_grad():
        for features, labels in loader:
            features, labels = features.to(device), labels.to(device)
            total += torch.stack([F.cross_entropy(model(features), labels), torch.tensor(1.0).cuda()])
    dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def main() -> None:
    mode = os.environ.get("MODE", "aligned")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    model = DDP(nn.Linear(8, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    train = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    val = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
    if mode == "stream":
        torch.cuda.Stream()
    for features, labels in train:
        features, labels = features.to(device, non_blocking=True), labels.to(device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if mode == "aligned" or rank == 0:
        print(f"val loss {evaluate(model, val, device):.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
