"""A two-level gradient reduction written for nodes of 4 GPUs: every rank reduces
(a stand-in for the reduction within its node), then the nodes' first ranks reduce
across nodes in a group of leaders. The group is built from GPUS_PER_NODE = 4 while
the leader test reads the launcher's LOCAL_RANK: on one node of 2 ranks the group is
[0] and rank 0 is its only leader, aligned; on 64 ranks of 8 per node the group is
ranks 0, 4, 8, ..., 60, and its members 4, 12, ..., 60 (local rank 4) never call: the
leaders 0, 8, ..., 56 wait in the all_reduce for them.

FIXED=1 builds the group from LOCAL_WORLD_SIZE, the launcher's ranks per node.
"""

import os

import torch
import torch.distributed as dist

GPUS_PER_NODE = 4


def main() -> None:
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    per_node = int(os.environ["LOCAL_WORLD_SIZE"]) if os.environ.get("FIXED") == "1" else GPUS_PER_NODE
    leaders = dist.new_group(list(range(0, world, per_node)))  # every rank makes every group
    for _step in range(3):
        grad = torch.ones(4)
        dist.all_reduce(grad)  # within the node, in the real two-level scheme
        if local_rank == 0:
            dist.all_reduce(grad, group=leaders)  # across the nodes
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
