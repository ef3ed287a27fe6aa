"""Training at module level, as short scripts do, with a bug after the epochs: the
final checkpoint's barrier runs on rank 0 only.

EPOCHS=3 (the default): the dry run's budget stops it inside the second epoch, so the
code after the loop does not run; the report says which lines those are, and what the
source decides of them (lint reads the barrier under the rank test).
EPOCHS=1: the loop ends within the budget and the barrier is found.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(128, 4))
train_sampler = DistributedSampler(data)
train_loader = DataLoader(data, batch_size=8, sampler=train_sampler)
val_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))

for epoch in range(int(os.environ.get("EPOCHS", "3"))):
    train_sampler.set_epoch(epoch)
    model.train()
    for (x,) in train_loader:
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    total = torch.zeros(1)
    with torch.no_grad():
        for (x,) in val_loader:
            total += model.module(x).sum()
    dist.all_reduce(total)

print(f"rank {rank}: done", flush=True)
if rank == 0:
    torch.save(model.module.state_dict(), os.path.join(os.environ.get("CKPT_DIR", "/tmp"), "final.pt"))
    dist.barrier()  # "wait until the checkpoint is written"
dist.destroy_process_group()
