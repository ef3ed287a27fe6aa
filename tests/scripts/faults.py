"""Faults for preflight's hardening tests, on 2 ranks. FAULT:

- sigkill: rank 1 is SIGKILLed while it waits in an all_reduce rank 0 joins late
- segfault: rank 1 dereferences NULL (SIGSEGV) after its first collective
- exit0: rank 1 leaves with exit status 0 before the second all_reduce
- loader: rank 1's dataset blocks in __getitem__; rank 0 waits in the all_reduce past
  the process group's timeout (PG_TIMEOUT_S, default 1800)
- slow-worker: rank 1's DataLoader worker computes for SLOW_S seconds (default 12),
  then the job goes on: slow, not hung
- slow-step: rank 1 itself computes for SLOW_S seconds, then the job goes on
- setup-error: rank 1 fails while it picks its device, before any collective (as
  set_device does on a node with fewer GPUs than ranks); rank 0 is still setting up
- record-error: rank 1's dataset raises FileNotFoundError for one record (a file missing
  from its shard) and nothing catches it; rank 0 waits in the all_reduce
- spinning-hang: rank 0 alone all_reduces, rank 1 goes on to the barrier, and a
  thread of each rank keeps a CPU busy, as a rank waiting on a GPU does (CUDA spins)
- none: no fault; each rank prints the NCCLCHECK_DRY_RUN it sees
"""

import ctypes
import datetime
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


def stuck() -> None:
    time.sleep(3600)  # a stuck file system, a dead data server


def work() -> None:
    end = time.monotonic() + float(os.environ.get("SLOW_S", "12"))
    while time.monotonic() < end:  # decoding, augmenting: slow, but it ends
        pass


class SlowOnRankOne(Dataset):  # type: ignore[type-arg]
    """Item 2 on rank 1 takes ``delay`` (sleeps or computes); the rest are instant."""

    def __init__(self, rank: int, delay: Callable[[], object]) -> None:
        self.rank = rank
        self.delay = delay

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == 1 and index == 2:
            self.delay()
        return torch.ones(2)


class MissingRecordOnRankOne(Dataset):  # type: ignore[type-arg]
    """Record 4 of rank 1's shard is a file that is not there."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rank == 1 and index == 4:
            raise FileNotFoundError(f"[Errno 2] No such file or directory: 'shard1/{index:05d}.pt'")
        return torch.ones(2)


def spin() -> None:
    while True:  # cudaStreamSynchronize's default wait, in Python
        pass


def pick_device(rank: int) -> None:
    if rank == 1:
        raise RuntimeError("CUDA error: invalid device ordinal")
    time.sleep(60)  # a slow start: torchrun stops this rank when rank 1 fails


def main() -> None:
    fault = os.environ["FAULT"]
    timeout = datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT_S", "1800")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    if fault == "setup-error":
        pick_device(rank)
    dist.all_reduce(torch.ones(1))
    if fault == "sigkill":
        if rank == 1:
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGKILL)).start()
        else:
            time.sleep(3)
        dist.all_reduce(torch.ones(2))
    elif fault == "segfault":
        if rank == 1:
            ctypes.string_at(0)
        dist.all_reduce(torch.ones(2))
    elif fault == "exit0":
        if rank == 1:
            sys.exit(0)
        dist.all_reduce(torch.ones(2))
    elif fault == "spinning-hang":
        threading.Thread(target=spin, daemon=True).start()
        if rank == 0:
            dist.all_reduce(torch.ones(2))
        dist.barrier()
    elif fault == "none":
        os.write(1, f"NCCLCHECK_DRY_RUN={os.environ.get('NCCLCHECK_DRY_RUN')}\n".encode())
    elif fault == "loader":
        for batch in DataLoader(SlowOnRankOne(rank, stuck), batch_size=2):
            dist.all_reduce(batch)
    elif fault == "record-error":
        for batch in DataLoader(MissingRecordOnRankOne(rank), batch_size=2):
            dist.all_reduce(batch)
    elif fault == "slow-worker":
        for batch in DataLoader(SlowOnRankOne(rank, work), batch_size=2, num_workers=1):
            dist.all_reduce(batch)
    elif fault == "slow-step":
        if rank == 1:
            work()
        dist.all_reduce(torch.ones(2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
