"""FSDP2 (fully_shard on each block and the root) evaluated on validation rows each rank
cuts for itself: 37 rows, `rows[rank::world]`, make 19 and 18, 7 batches of 3 against 6.
Every batch's forward all-gathers each block's parameters inside the model's own
forward(): the rank with the extra batch waits in an all-gather its peer never makes. The
finding's line is the loop's model call, not a layer inside the model, and the loop that
decided is the eval loop, not the loop over the blocks in forward() (which ran more passes
only as it ran in one more batch). MODE=slices: the same with no DataLoader. MODE=fixed: a
DistributedSampler pads both ranks to the same count."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Scorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


def evaluate_in_slices(model: nn.Module, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(2)
    with torch.no_grad():
        for start in range(0, len(features), 3):
            predicted = model(features[start : start + 3])
            total[0] += nn.functional.mse_loss(predicted, targets[start : start + 3], reduction="sum")
            total[1] += len(predicted)
    return total


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Scorer()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    rows = TensorDataset(torch.randn(37, 8), torch.randn(37, 1))
    mode = os.environ.get("MODE", "broken")
    total = torch.zeros(2)
    if mode == "slices":
        # no loader: the rank's own rows, taken three at a time in a function of their own
        total = evaluate_in_slices(model, rows.tensors[0][rank::world], rows.tensors[1][rank::world])
    else:
        if mode == "fixed":
            loader = DataLoader(rows, batch_size=3, sampler=DistributedSampler(rows, shuffle=False))
        else:
            mine = torch.utils.data.Subset(rows, list(range(rank, len(rows), world)))
            loader = DataLoader(mine, batch_size=3)
        with torch.no_grad():
            for x, y in loader:
                predicted = model(x)
                total[0] += nn.functional.mse_loss(predicted, y, reduction="sum")
                total[1] += len(y)
    dist.all_reduce(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
