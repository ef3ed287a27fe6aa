"""Evaluation every 20 steps inside one long pass over the train loader, as LLM
training loops do, with a per-batch all_reduce on rank 0 alone. The default budget
(5 train steps) ends before step 20: preflight must say so; --train-steps 21 reaches it."""

import datetime

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

EVAL_EVERY = 20


def evaluate(model: torch.nn.Module, loader: DataLoader) -> None:
    model.eval()
    with torch.no_grad():
        for x in loader:
            loss = model(x).sum()
            if dist.get_rank() == 0:
                dist.all_reduce(loss)  # rank 0 alone
    model.train()


def main() -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    data = [torch.ones(2)] * 200
    train_loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data))
    val_loader = DataLoader(data[:8], batch_size=2, sampler=DistributedSampler(data[:8], shuffle=False))
    model = torch.nn.Linear(2, 1)
    for step, x in enumerate(train_loader, 1):
        grad = model(x).sum().detach()
        dist.all_reduce(grad)
        if step % EVAL_EVERY == 0:
            evaluate(model, val_loader)
    dist.barrier()


if __name__ == "__main__":
    main()
