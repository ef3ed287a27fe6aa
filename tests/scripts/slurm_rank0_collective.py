"""An srun task: its rank and world size from SLURM_PROCID and SLURM_NTASKS, MASTER_ADDR
and MASTER_PORT from the batch script. Rank 0 alone all-reduces; rank 1 waits in the
barrier."""

import datetime
import os

import torch
import torch.distributed as dist


def main() -> None:
    rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    timeout = datetime.timedelta(seconds=float(os.environ.get("REPRO_TIMEOUT_S", "120")))
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    value = torch.ones(1)
    if rank == 0:
        dist.all_reduce(value)  # rank 0 alone
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
