"""FSDP2 (fully_shard) training, then a full state dict for a checkpoint: each
parameter is a DTensor, and full_tensor() all-gathers its shards through torch's
functional collectives (not torch.distributed's module functions).

MODE=rank0: rank 0 alone gathers (under `if rank == 0`, to save the file): it waits
in the all-gather while rank 1 waits in the barrier. MODE=every: every rank gathers,
rank 0 alone saves."""

import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.full_tensor() for name, value in model.state_dict().items()}


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _step in range(3):
        model(torch.randn(8, 16)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with tempfile.TemporaryDirectory(prefix="ncclcheck-fsdp2-") as folder:
        if os.environ.get("MODE", "rank0") == "every":
            state = full_state(model)
            if dist.get_rank() == 0:
                torch.save(state, os.path.join(folder, "model.pt"))
        elif dist.get_rank() == 0:
            torch.save(full_state(model), os.path.join(folder, "model.pt"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
