"""A script that starts its own ranks with mp.spawn, whose ranks die before they run a
line of the rank function: each process's arguments fail to unpickle in it, as a
tensor shared through torch's file-descriptor passing does when the connection to the
parent is reset ("ConnectionResetError: [Errno 104] Connection reset by peer", what
Lightning's ddp_spawn showed on a loaded machine). No rank ever starts its recorder."""

from __future__ import annotations

import torch.distributed as dist
import torch.multiprocessing as mp


def reopen_shard(name: str) -> str:
    raise ConnectionResetError(104, f"Connection reset by peer (while receiving {name})")


class SharedShard:
    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return reopen_shard, (self.name,)


def main(rank: int, shard: SharedShard, world_size: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.barrier()


if __name__ == "__main__":
    mp.spawn(main, args=(SharedShard("train-shard"), 2), nprocs=2)
