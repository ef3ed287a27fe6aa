"""ZeroRedundancyOptimizer's state is sharded across the ranks: consolidate_state_dict()
broadcasts every shard, each rank in turn, so every rank must call it.

MODE=rank0 (the default): called where only rank 0 writes the checkpoint: rank 0 waits
in its broadcast, the others in their next step.
MODE=everyone: every rank consolidates, rank 0 alone saves: aligned.
(Importing torch.distributed.optim compiles its functional optimizers with TorchScript,
no_grad included: the dry run must leave that compilable.)
"""

import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

MODE = os.environ.get("MODE", "rank0")


def save_checkpoint(optimizer: ZeroRedundancyOptimizer, epoch: int) -> None:
    if MODE == "everyone":
        optimizer.consolidate_state_dict(to=0)
    if dist.get_rank() == 0:
        if MODE == "rank0":
            optimizer.consolidate_state_dict(to=0)
        torch.save(optimizer.state_dict(), os.path.join(tempfile.gettempdir(), f"zero-{epoch}.pt"))


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    data = TensorDataset(torch.randn(64, 4))
    train_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    for epoch in range(2):
        for (x,) in train_loader:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        save_checkpoint(optimizer, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
