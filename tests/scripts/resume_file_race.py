"""Resuming from a checkpoint that rank 0 stages while the other ranks look for it
(KempnerForge#49, Lightning PR#5155): rank 0 copies the checkpoint from slow
storage, and every rank resumes if it finds the file. Rank 1 looks before the copy
lands, starts from scratch, and waits in its first gradient all_reduce while rank 0
broadcasts the resumed step.

MODE=race (the default) lets each rank check the file for itself; MODE=synced has
rank 0 check and broadcast the answer. CKPT_DIR: where the staged copy goes (default: a
folder in the temporary directory named after the torchrun job).
"""

import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def stage_checkpoint(source: str, target: str) -> None:
    time.sleep(0.5)  # slow shared storage
    shutil.copy(source, target)


def should_resume(path: str, synced: bool) -> bool:
    if not synced:
        return os.path.exists(path)
    found = torch.tensor([float(os.path.exists(path))])
    dist.broadcast(found, src=0)  # rank 0 looked after staging: its answer for everyone
    return bool(found.item())


def main() -> None:
    synced = os.environ.get("MODE", "race") == "synced"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    folder = os.environ.get("CKPT_DIR") or os.path.join(tempfile.gettempdir(), f"resume-{run}")
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    local_copy = os.path.join(folder, "latest.pt")
    if rank == 0:
        archived = os.path.join(folder, "archived.pt")
        torch.save({"model": model.module.state_dict(), "step": 100}, archived)
        stage_checkpoint(archived, local_copy)
    start = torch.zeros(1)
    if should_resume(local_copy, synced):
        state = torch.load(local_copy)
        model.module.load_state_dict(state["model"])
        start = torch.tensor([float(state["step"])])
        dist.broadcast(start, src=0)  # every rank continues from rank 0's step
    for _step in range(int(start.item()), int(start.item()) + 5):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
