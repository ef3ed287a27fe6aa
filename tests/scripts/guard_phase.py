"""aligned_phase on real ranks: MODE=uneven gives rank 0 four eval batches and the others
three; MODE=absent makes rank 1 leave before the check; MODE=even aligns. PHASE_TIMEOUT_S:
how long the check waits for every rank (the guard's default, 60 s, if unset)."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset, TensorDataset

from ncclcheck.guard import AbsentRanks, MisalignedPhase, aligned_phase


def say(line: str) -> None:
    # One write per line: the ranks share torchrun's stdout, and print() under
    # PYTHONUNBUFFERED writes the text and its newline separately, so two ranks'
    # lines can run together.
    os.write(1, (line + "\n").encode())


def main() -> None:
    mode = os.environ["MODE"]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    val_set = TensorDataset(torch.randn(13 if mode == "uneven" else 12, 4))
    loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=2)
    if mode == "absent" and rank == 1:
        sys.exit(0)  # a rank that leaves cleanly: torchrun keeps the others running
    start = time.monotonic()
    try:
        with aligned_phase("eval", timeout=float(os.environ.get("PHASE_TIMEOUT_S", "60")), steps=len(loader)):
            for _batch in loader:
                dist.all_reduce(torch.ones(1))
    except (MisalignedPhase, AbsentRanks) as error:
        say(f"rank {rank} after {time.monotonic() - start:.1f} s: {type(error).__name__}: {error}")
        if isinstance(error, MisalignedPhase):
            # every rank raised it: let each say so before any exits, as torchrun ends the
            # others at the first exit (a rank 0.1 s behind on a loaded machine was cut off)
            dist.barrier()
        os._exit(3)
    say(f"rank {rank}: aligned")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
