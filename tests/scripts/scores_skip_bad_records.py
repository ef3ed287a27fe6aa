"""Scoring a fixed list of shards, tolerating bad ones: the helper all-reduces each shard's
score, and the caller's `except ValueError` logs a shard that fails to decode and goes on.
One rank's shard 3 is corrupt: it skips that shard's all_reduce, runs out of shards one
call early and waits in the final barrier while the others wait in their last all_reduce.
MODE=fixed catches the error around the decode only and contributes a zero score."""

import logging
import os

import torch
import torch.distributed as dist

log = logging.getLogger("scores")
SHARDS = 6


def decode(shard: int, rank: int) -> torch.Tensor:
    if rank == 1 and shard == 3:
        raise ValueError(f"shard {shard}: truncated record")
    return torch.full((4,), float(shard))


def shard_score(shard: int, rank: int) -> float:
    if os.environ.get("MODE") == "fixed":
        try:
            values = decode(shard, rank)
        except ValueError as err:
            log.warning("%s: scored as 0", err)
            values = torch.zeros(4)
    else:
        values = decode(shard, rank)
    score = values.mean().reshape(1)
    dist.all_reduce(score)
    return score.item()


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    total = 0.0
    for shard in range(SHARDS):
        try:
            total += shard_score(shard, rank)
        except ValueError as err:  # a bad shard must not stop the evaluation
            log.warning("skipping %s", err)
    dist.barrier()
    if rank == 0:
        print("total", total, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
