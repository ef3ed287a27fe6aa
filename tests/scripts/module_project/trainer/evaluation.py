"""The package's evaluation helpers."""

import torch
import torch.distributed as dist


def report_accuracy(model: torch.nn.Module) -> None:
    correct = (model(torch.ones(8, 4)).argmax(dim=1) == 0).float().sum()
    dist.all_reduce(correct)  # summed over the ranks: every rank must call it
    print(f"accuracy {correct.item() / (8 * dist.get_world_size()):.2f}", flush=True)
