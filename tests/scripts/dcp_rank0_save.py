"""Rank 0 alone writes a distributed checkpoint (torch.distributed.checkpoint.save):
DCP plans every save across the ranks (it gathers each rank's plan on the
coordinator first), so rank 0 waits in that gather while rank 1 waits in the
barrier after the `if`."""

import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    with tempfile.TemporaryDirectory(prefix="ncclcheck-dcp-") as folder:
        if dist.get_rank() == 0:
            dcp.save({"model": model.state_dict()}, checkpoint_id=folder)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
