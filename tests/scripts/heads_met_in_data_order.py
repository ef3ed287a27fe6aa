"""A multi-head classifier evaluated on a mixed stream: each batch belongs to one head, and
the per-head prediction counts (one slot per class of that head) are created the first
time the evaluation meets the head (``setdefault``). The dict holds its heads in the order
each rank met them, which its own shard of the stream decides, so the all_reduce over
the dict pairs rank 0's counts of one head with rank 1's of another (another size).
MODE=fixed creates every head's counts up front, in the order of HEADS."""

import os

import torch
import torch.distributed as dist
from torch import nn

HEADS = {"intent": 7, "sentiment": 3, "language": 12}


class MultiHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.heads = nn.ModuleDict({name: nn.Linear(32, size) for name, size in HEADS.items()})

    def forward(self, x: torch.Tensor, head: str) -> torch.Tensor:
        return self.heads[head](torch.relu(self.body(x)))


def eval_stream(rank: int, world: int) -> list[tuple[str, torch.Tensor]]:
    """Every rank's shard of one shuffled stream of batches, each batch one head's."""
    generator = torch.Generator().manual_seed(3)
    names = list(HEADS)
    order = torch.randperm(12, generator=generator).tolist()
    batches = [(names[i % len(names)], torch.randn(4, 16, generator=generator)) for i in order]
    return batches[rank::world]


@torch.no_grad()
def evaluate(model: nn.Module, rank: int, world: int) -> dict[str, torch.Tensor]:
    if os.environ.get("MODE") == "fixed":
        counts = {name: torch.zeros(size) for name, size in HEADS.items()}
    else:
        counts = {}
    for head, x in eval_stream(rank, world):
        predicted = model(x, head).argmax(dim=1)
        slots = counts.setdefault(head, torch.zeros(HEADS[head]))
        slots += torch.bincount(predicted, minlength=HEADS[head]).float()
    for _head, slots in counts.items():
        dist.all_reduce(slots)
    return counts


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = MultiHead()
    counts = evaluate(model, rank, world)
    if rank == 0:
        print({head: slots.tolist() for head, slots in counts.items()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
