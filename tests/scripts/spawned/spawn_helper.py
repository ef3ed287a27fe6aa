"""A project's launch helper, in a module of its own: the script that calls it does not
show mp.spawn in its source, so preflight learns of it when the rank refuses to start
more ranks, and runs the script again with the spawn launcher.

LAUNCH_HELPER=bound-fork: torch's start_processes bound at import from its own module,
with the fork start method, as a framework's launcher may do it (Lightning's ddp_fork
calls start_processes with start_method="fork"): nothing named torch.multiprocessing.spawn
is looked up when it runs."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch.multiprocessing as mp
from torch.multiprocessing.spawn import start_processes


def launch(worker: Callable[[int, int], None], world_size: int) -> None:
    if os.environ.get("LAUNCH_HELPER") == "bound-fork":
        start_processes(worker, args=(world_size,), nprocs=world_size, start_method="fork")
    else:
        mp.spawn(worker, args=(world_size,), nprocs=world_size, join=True)
