"""Rank 1 cannot read its shard and exits with code 3 before init_process_group; rank 0
waits in init_process_group for it until torchrun stops the job."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def load_shard(rank: int) -> None:
    if rank == 1:
        print(f"cannot open shard-{rank}.bin: no such file", file=sys.stderr)
        sys.exit(3)


def main() -> None:
    load_shard(int(os.environ["RANK"]))
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
