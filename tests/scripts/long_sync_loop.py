"""An aligned job that runs long with no loader for the dry run's budget to cut: 600
steps of 50 ms, each with an all_reduce (30 s). A dry run stopped by a signal or its
time limit before the end is incomplete, not aligned."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(4)
    for _step in range(600):
        time.sleep(0.05)  # a real step's compute
        dist.all_reduce(value)
        value /= dist.get_world_size()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
