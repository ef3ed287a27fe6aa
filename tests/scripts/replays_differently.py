"""A script that does not run the same twice: rank 1 counts its own runs in a file
(REPRO_RUNS_FILE) and makes one more all_reduce each time, so a replay of a dry run
makes other calls than the run it replays."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    steps = 4
    if rank == 1:
        runs = Path(os.environ["REPRO_RUNS_FILE"])
        seen = int(runs.read_text()) if runs.exists() else 0
        runs.write_text(str(seen + 1))
        steps = 2 + seen
    for _ in range(steps):
        dist.all_reduce(torch.ones(1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
