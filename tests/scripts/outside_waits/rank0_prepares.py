"""Rank 0 prepares the data set while the other ranks wait in a barrier: the most
common set-up there is, and a correct one while the wait stays under the process
group's timeout. PREPARE says what rank 0's preparation waits on, PREPARE_S for how
long (default 40):

- download: a sleep, which is what a download looks like from the process
- pipe: a read from a pipe another process fills slowly
- subprocess: a child process that does the work
- compute: rank 0's own CPU

ALSO_REDUCE=1 makes the preparation all_reduce the data set's size on rank 0 alone,
after its wait: that script is broken (rank 0 waits in a collective the others never
call), whatever the wait was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PREPARE_S = float(os.environ.get("PREPARE_S", "40"))


def fetch(kind: str) -> None:
    if kind == "download":
        time.sleep(PREPARE_S)
    elif kind == "pipe":
        writer = subprocess.Popen(
            ["sh", "-c", f"sleep {PREPARE_S}; echo done"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        assert writer.stdout is not None
        writer.stdout.read()
        writer.wait()
    elif kind == "subprocess":
        subprocess.run(["sleep", str(PREPARE_S)], check=True)
    elif kind == "compute":
        end = time.monotonic() + PREPARE_S
        while time.monotonic() < end:
            pass


def prepare(root: str) -> None:
    fetch(os.environ.get("PREPARE", "download"))
    torch.save(torch.randn(64, 8), os.path.join(root, "features.pt"))
    if os.environ.get("ALSO_REDUCE") == "1":
        dist.all_reduce(torch.tensor([64.0]))  # BUG when set: rank 0 alone calls it


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    root = os.path.join(tempfile.gettempdir(), f"prepared-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}")
    os.makedirs(root, exist_ok=True)
    if rank == 0:
        prepare(root)
    dist.barrier()  # the others wait here for rank 0's preparation
    features = torch.load(os.path.join(root, "features.pt"))
    dataset = TensorDataset(features, torch.zeros(64))
    loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset))
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch, _ in loader:
        optimizer.zero_grad()
        model(batch).sum().backward()
        optimizer.step()
    dist.barrier()
    if rank == 0:  # a demonstration: leave nothing behind
        os.remove(os.path.join(root, "features.pt"))
        os.rmdir(root)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
