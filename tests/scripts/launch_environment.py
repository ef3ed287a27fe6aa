"""Writes what a rank sees of its launch (environment, argv, __name__, its process
group) to OUT/rank-N.json, after an all_reduce and a barrier: torchrun's ranks and the
replay server's forked ranks must see the same. Its numpy draw, unseeded, must differ
from rank to rank, as it does between interpreters."""

import json
import os
import sys

import numpy
import torch
import torch.distributed as dist

SEEN = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "OMP_NUM_THREADS",
)

out = sys.argv[1]
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
dist.barrier()
view = {
    "env": {name: os.environ.get(name) for name in SEEN},
    "argv": sys.argv[1:],
    "name": __name__,
    "path0": sys.path[0],
    "cwd": os.getcwd(),
    "world": dist.get_world_size(),
    "total": total.item(),
    "threads": torch.get_num_threads(),
    "numpy_draw": float(numpy.random.rand()),
}
with open(os.path.join(out, f"rank-{dist.get_rank()}.json"), "w", encoding="utf-8") as handle:
    json.dump(view, handle)
dist.destroy_process_group()
