"""Collectives whose tensors differ from rank to rank when used right, made by every
rank: gather and scatter (only the root passes the list), all_to_all_single with
uneven splits (MoE token routing), and all_gather_object of per-rank lists of
different lengths. preflight must call this aligned."""

import datetime

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        count = torch.tensor([float(rank + 1)])
        gathered = [torch.zeros(1) for _ in range(world)] if rank == 0 else None
        dist.gather(count, gather_list=gathered, dst=0)
        received = torch.zeros(1)
        pieces = [torch.full((1,), float(r)) for r in range(world)] if rank == 0 else None
        dist.scatter(scatter_list=pieces, tensor=received, src=0)  # keywords, the list first
        # rank r sends r + 1 tokens to every peer and receives p + 1 from peer p
        sent = torch.full(((rank + 1) * world,), float(rank))
        got = torch.empty(sum(p + 1 for p in range(world)))
        dist.all_to_all_single(
            got, sent, output_split_sizes=[p + 1 for p in range(world)], input_split_sizes=[rank + 1] * world
        )
        predictions = [torch.tensor([float(i)]) for i in range(rank + 2)]
        everything: list[object] = [None] * world
        dist.all_gather_object(everything, predictions)
    dist.barrier()


if __name__ == "__main__":
    main()
