"""Validation scores gathered for a global metric: a helper collects the scores of the
labelled rows only, a list of masked pieces, and returns them joined with a
count, and each rank's shard has its own number of unlabelled rows, so the all_gather
is given tensors of other lengths. MODE=fixed gathers the lengths first and pads every
rank's scores to the longest."""

import os

import torch
import torch.distributed as dist


def gather(t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return parts


def labelled_scores(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, int]:
    kept, seen = [], 0
    for scores, labels in batches:
        labelled = labels >= 0
        kept.append(scores[labelled])
        seen += len(labels)
    return torch.cat(kept), seen


def padded(t: torch.Tensor) -> torch.Tensor:
    lengths = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(lengths, torch.tensor([len(t)]))
    longest = int(max(length.item() for length in lengths))
    return torch.cat([t, t.new_zeros(longest - len(t))])


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    generator = torch.Generator().manual_seed(rank)
    batches = []
    for _ in range(3):
        labels = torch.randint(0, 3, (8,), generator=generator)
        labels[: rank + 1] = -1  # rows without a label: more on the later shards
        batches.append((torch.randn(8, generator=generator), labels))
    scores, seen = labelled_scores(batches)
    if os.environ.get("MODE") == "fixed":
        scores = padded(scores)
    everything = gather(scores)
    if rank == 0:
        print(f"{seen} rows per rank, {sum(len(p) for p in everything)} gathered")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
