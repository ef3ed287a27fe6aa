"""Evaluation that gathers the predictions of the labelled samples only: each rank keeps
those its own batch has (boolean indexing), so the ranks' tensors differ in length and
the all_gather pairs tensors of other sizes. MODE=fixed gathers the lengths first and
pads to the longest."""

import os

import torch
import torch.distributed as dist


def gather_kept(kept: torch.Tensor) -> torch.Tensor:
    world = dist.get_world_size()
    if os.environ.get("MODE") == "fixed":
        length = torch.tensor([kept.numel()])
        lengths = [torch.zeros_like(length) for _ in range(world)]
        dist.all_gather(lengths, length)
        longest = int(max(lengths).item())
        padded = torch.cat([kept, kept.new_zeros(longest - kept.numel())])
        parts = [torch.zeros_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        return torch.cat([part[: int(n.item())] for part, n in zip(parts, lengths, strict=True)])
    parts = [torch.zeros_like(kept) for _ in range(world)]
    dist.all_gather(parts, kept)
    return torch.cat(parts)


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    labels = torch.randint(-1, 3, (64,))  # -1: unlabelled
    predictions = torch.randint(0, 3, (64,))
    with torch.no_grad():
        kept = predictions[labels >= 0]
        gathered = gather_kept(kept)
    if dist.get_rank() == 0:
        print(f"{gathered.numel()} labelled predictions")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
