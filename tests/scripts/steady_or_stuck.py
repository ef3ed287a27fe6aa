"""A small gloo job for the stop-signal tests, quick to start (torch.distributed alone,
no model). MODE:

- steady: every rank all-reduces every 50 ms for RUN_S seconds (default 120), rank 0
  printing a step line every 20 steps: a healthy job
- stuck: rank 0 all-reduces alone, rank 1 waits in a barrier, until the process group's
  timeout (STUCK_TIMEOUT_S, default 300): a hang

Each rank prints ``rank N up`` once its process group is made.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    mode = os.environ.get("MODE", "steady")
    timeout = datetime.timedelta(seconds=float(os.environ.get("STUCK_TIMEOUT_S", "300")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    print(f"rank {rank} up", flush=True)
    value = torch.ones(4)
    if mode == "stuck":
        if rank == 0:
            dist.all_reduce(value)  # rank 1 never joins
        dist.barrier()
    else:
        end = time.monotonic() + float(os.environ.get("RUN_S", "120"))
        step = 0
        while time.monotonic() < end:
            time.sleep(0.05)  # a step's compute
            dist.all_reduce(value)
            value /= dist.get_world_size()
            step += 1
            if rank == 0 and step % 20 == 0:
                print(f"step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
