"""Checks ncclcheck's CPU SyncBatchNorm (record/cpu_syncbn.py) against BatchNorm over
the ranks' batches put together: outputs, running statistics, input gradients and,
summed over ranks, weight and bias gradients. Rank r holds 2 + 3r samples, so the
ranks' counts differ; the last rank also sends an empty batch once.
Run with torchrun (gloo); prints "numerics ok" on rank 0."""

import torch
import torch.distributed as dist
from torch import nn

from ncclcheck.record.cpu_syncbn import cpu_sync_batch_norm


def check(shape_tail: tuple[int, ...], empty_rank: int | None) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    batches = [
        torch.randn(2 + 3 * r, 4, *shape_tail, dtype=torch.float64) * (r + 1) + r for r in range(world)
    ]
    if empty_rank is not None:
        batches[empty_rank] = batches[empty_rank][:0]
    grads = [torch.randn_like(batch) for batch in batches]

    synced = nn.SyncBatchNorm(4, momentum=0.3).double()
    reference = (
        nn.BatchNorm1d(4, momentum=0.3).double()
        if not shape_tail
        else nn.BatchNorm2d(4, momentum=0.3).double()
    )
    with torch.no_grad():
        for layer in (synced, reference):
            layer.weight.copy_(torch.linspace(0.5, 2.0, 4))
            layer.bias.copy_(torch.linspace(-1.0, 1.0, 4))

    mine = batches[rank].clone().requires_grad_()
    output = cpu_sync_batch_norm(synced, mine)
    output.backward(grads[rank])
    everything = torch.cat(batches).requires_grad_()
    expected = reference(everything)
    expected.backward(torch.cat(grads))

    start = sum(len(batch) for batch in batches[:rank])
    rows = slice(start, start + len(batches[rank]))
    torch.testing.assert_close(output, expected[rows])
    if len(mine):
        torch.testing.assert_close(mine.grad, everything.grad[rows])
    else:  # as PyTorch's: no gradient for an empty batch (autograd reads zeros)
        assert mine.grad is None
    torch.testing.assert_close(synced.running_mean, reference.running_mean)
    torch.testing.assert_close(synced.running_var, reference.running_var)
    for mine_grad, expected_grad in (
        (synced.weight.grad, reference.weight.grad),
        (synced.bias.grad, reference.bias.grad),
    ):
        total = mine_grad.clone() if mine_grad is not None else torch.zeros(4, dtype=torch.float64)
        dist.all_reduce(total)
        torch.testing.assert_close(total, expected_grad)


def main() -> None:
    dist.init_process_group("gloo")
    check((), None)
    check((3, 5), None)
    check((3, 5), empty_rank=dist.get_world_size() - 1)
    if dist.get_rank() == 0:
        print("numerics ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
