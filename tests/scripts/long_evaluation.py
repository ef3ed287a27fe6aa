"""A healthy job with a long evaluation: a few quick training steps, then every rank
evaluates its shard sample by sample (a greedy decode of 40 tokens a sample, in Python,
no collective) for many seconds before the metrics are all-reduced. doctor's looks land
in the evaluation on every rank: the job is progressing, not hung. It runs for RUN_S
seconds; rank 0 prints "eval started" as each evaluation begins."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn


def decode(model: nn.Module, prompt: torch.Tensor, tokens: int) -> torch.Tensor:
    state = prompt
    for _ in range(tokens):
        state = torch.tanh(model(state)) + state  # one token's step, as generate() does
    return state


def evaluate(model: nn.Module, samples: torch.Tensor) -> torch.Tensor:
    total = torch.zeros(2)
    with torch.no_grad():
        for sample in samples:
            out = decode(model, sample.unsqueeze(0), 40)
            total += torch.stack([out.pow(2).mean(), torch.tensor(1.0)])
    dist.all_reduce(total)
    return total[0] / total[1]


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    samples = torch.randn(int(os.environ.get("EVAL_SAMPLES", "8000")), 512)[rank::world]
    deadline = time.monotonic() + float(os.environ.get("RUN_S", "60"))
    epoch = 0
    while time.monotonic() < deadline:
        for _ in range(5):
            loss = model(torch.randn(32, 512)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: eval started", flush=True)
        score = evaluate(model, samples)
        if rank == 0:
            print(f"epoch {epoch}: eval {score.item():.4f}", flush=True)
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
