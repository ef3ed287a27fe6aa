"""The shape of pytorch/examples' ImageNet script: torch.multiprocessing.spawn only under
an option that is off by default (--multiprocessing-distributed); by default each process
is one rank, as torchrun starts it."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main_worker(local_rank: int, args: argparse.Namespace) -> None:
    if args.multiprocessing_distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(args.port))
        dist.init_process_group("gloo", rank=local_rank, world_size=args.nprocs)
    else:
        dist.init_process_group("gloo")  # torchrun's environment
    model = DistributedDataParallel(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    for features, labels in loader:
        loss = nn.functional.cross_entropy(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    if args.multiprocessing_distributed:
        mp.spawn(main_worker, nprocs=args.nprocs, args=(args,))
    else:
        main_worker(int(os.environ.get("LOCAL_RANK", "0")), args)


if __name__ == "__main__":
    main()
