"""Tensor and data parallelism laid out as Megatron-style scripts lay them out:
tensor-parallel groups of TP_SIZE = 8 consecutive ranks (the whole world, when it is
smaller), data-parallel groups of the ranks that hold the same shard (ranks s, s + 8,
s + 16, ...). Evaluation runs on the first data-parallel replica only, to save
compute, and shares its loss with the other replicas by a broadcast over the
data-parallel group, written inside that `if`. Up to 8 ranks there is one replica
and every data-parallel group has one member: the broadcast completes, aligned. From
16 ranks on, ranks 0-7 wait in it for replicas that never call it, while those go on
to the next step's tensor-parallel all_reduce.

FIXED=1 broadcasts on every replica (the first sends, the others receive).
"""

import os

import torch
import torch.distributed as dist

TP_SIZE = 8


def build_groups(rank: int, world: int, tp_size: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Every rank makes every group, in the same order, as new_group requires."""
    tp_group = dp_group = None
    for first in range(0, world, tp_size):
        group = dist.new_group(list(range(first, first + tp_size)))
        if first <= rank < first + tp_size:
            tp_group = group
    for shard in range(tp_size):
        group = dist.new_group(list(range(shard, world, tp_size)))
        if rank % tp_size == shard:
            dp_group = group
    assert tp_group is not None and dp_group is not None
    return tp_group, dp_group


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp_size = min(TP_SIZE, world)
    tp_group, dp_group = build_groups(rank, world, tp_size)
    dp_rank = rank // tp_size
    first_replica_rank = rank % tp_size  # this shard's rank in the first replica
    weight = torch.ones(4)
    for step in range(4):
        activation = weight * (rank + 1)
        dist.all_reduce(activation, group=tp_group)  # the tensor-parallel forward
        dist.all_reduce(activation, group=dp_group)  # the gradients, over the replicas
        if step % 2 == 1:  # evaluate
            val_loss = torch.zeros(1)
            if dp_rank == 0:
                val_loss = weight.sum().reshape(1)
                dist.all_reduce(val_loss, group=tp_group)
                if os.environ.get("FIXED") != "1":
                    dist.broadcast(val_loss, src=first_replica_rank, group=dp_group)
            if os.environ.get("FIXED") == "1":  # every replica: the first sends, the others receive
                dist.broadcast(val_loss, first_replica_rank, group=dp_group)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
