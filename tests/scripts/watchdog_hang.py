"""watchdog() on real ranks. MODE:

- mismatch: rank 0 evaluates alone and all-reduces its metric, rank 1 goes on to a
  barrier (rank-conditional-collective); abort=True ends the job after the reports
- slow: rank 1 reaches the all_reduce 4 s late; the watchdog (2 s) reports rank 0,
  then says it returned; the job ends normally
- async: rank 0 queues an all_reduce with async_op=True that rank 1 never joins,
  and keeps computing; the watchdog names the queued call from its completion
- converted: as mismatch, with track_completion=True (the GPU path, on gloo)
"""

import datetime
import os
import time

import torch
import torch.distributed as dist

from ncclcheck.guard import aligned_phase, watchdog


def evaluate(metric: torch.Tensor) -> None:
    dist.all_reduce(metric)  # only rank 0 gets here in MODE=mismatch


def main() -> None:
    mode = os.environ["MODE"]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    guard = watchdog(
        timeout=float(os.environ.get("WATCHDOG_TIMEOUT", "2")),
        interval=0.2,
        abort=mode != "slow",
        track_completion=True if mode == "converted" else None,
    )
    dist.all_reduce(torch.ones(2))  # a call every rank makes
    if mode in ("mismatch", "converted"):
        if rank == 0:
            with torch.no_grad():
                evaluate(torch.ones(1))
        dist.barrier()
    elif mode == "slow":
        with aligned_phase("eval", steps=1):
            if rank == 1:
                time.sleep(4)
            dist.all_reduce(torch.ones(3))
    elif mode == "async":
        if rank == 0:
            work = dist.all_reduce(torch.ones(4), async_op=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # compute on; the work never completes
                time.sleep(0.05)
            work.wait()
        else:
            time.sleep(60)
    guard.stop()
    dist.barrier()
    os.write(1, f"rank {rank}: done\n".encode())  # one write: the ranks share stdout
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
