"""One rank runs out of memory in a training step, catches the error and skips the
batch (facebookresearch/fairseq#708): its DDP gradient all_reduce for that step is
never made, so its later steps pair with the other ranks' earlier ones. The OOM
is raised on purpose on rank 1 at step 2, as a batch too large for its GPU would.
MODE=fixed: the rank that skips the batch still makes the step's gradient all-reduce,
with a backward of a zeroed loss, so the ranks stay a step together."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train_step(model, optimizer, features, labels, simulate_oom):  # type: ignore[no-untyped-def]
    optimizer.zero_grad()
    loss = F.cross_entropy(model(features), labels)
    if simulate_oom:  # stand-in for a batch too large for this GPU
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(128, 8), torch.randint(0, 2, (128,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
    for step, (features, labels) in enumerate(loader):
        try:
            train_step(model, optimizer, features, labels, simulate_oom=dist.get_rank() == 1 and step == 2)
        except torch.cuda.OutOfMemoryError:
            print(f"rank {dist.get_rank()}: OOM at step {step}, skipping the batch", flush=True)
            torch.cuda.empty_cache()
            if os.environ.get("MODE") == "fixed":
                optimizer.zero_grad()
                (model(features[:1]).sum() * 0.0).backward()  # the all-reduce, of zeros
            continue
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
