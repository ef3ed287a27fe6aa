"""Rank 0 alone runs a model with a synchronised BatchNorm in training mode (a preview
after the epoch, model.eval() forgotten): its all_gather of batch statistics waits for
rank 1, which waits in the barrier. For `ncclcheck doctor` on CPU, SyncBatchNorm runs
with preflight --cpu's CPU forward (record/cpu_syncbn.py), as PyTorch's own refuses
CPU tensors; the stack has the same shape as on GPUs: the user's model(x) ->
Module.__call__ -> the layer's forward -> autograd Function.forward -> all_gather."""

import torch
import torch.distributed as dist
from torch import nn

from ncclcheck.record.cpu_syncbn import run_sync_batch_norm_on_cpu


def main() -> None:
    run_sync_batch_norm_on_cpu()
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(6, 4), nn.SyncBatchNorm(4), nn.ReLU())
    for _step in range(3):
        model(torch.randn(8, 6)).sum().backward()
    if dist.get_rank() == 0:
        preview = model(torch.randn(2, 6))  # still in training mode: SyncBatchNorm syncs
        print("preview", preview.shape, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
