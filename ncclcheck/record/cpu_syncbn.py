"""SyncBatchNorm on CPU ranks, for ``preflight --cpu``.

PyTorch's SyncBatchNorm runs only on GPUs: DDP refuses a CPU module that holds one,
its forward refuses a CPU input, and its statistics kernels (``batch_norm_stats``
and kin) exist only for CUDA. A GPU script that converts its BatchNorms would stop
in DDP's constructor under ``--cpu``, a crash of the tool's making, not the script's.

This is the same computation in plain tensor operations, with the same collectives
in the same order as PyTorch's gloo path: in training, one ``all_gather`` of
(mean, invstd, count) per layer in the forward and one ``all_reduce`` of
(sum dy, sum dy*(x - mean)) in the backward; in eval mode none. So a rank that runs
a forward in training mode alone is seen calling the all_gather the others never
reach, as it would hang on the cluster. The figures match BatchNorm over the
ranks' batches put together (tests/test_cpu_mode.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _channel_view(values: torch.Tensor, dims: int) -> torch.Tensor:
    """[C] -> [1, C, 1, ...] to broadcast over an input of ``dims`` dimensions."""
    return values.view(1, -1, *([1] * (dims - 2)))


class CpuSyncBatchNormFunction(torch.autograd.Function):  # type: ignore[misc]  # torch is not followed
    """torch.nn.modules._functions.SyncBatchNorm, without the CUDA-only kernels."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        momentum: float,
        process_group: Any,
        world_size: int,
    ) -> torch.Tensor:
        channels = input.shape[1]
        reduce_dims = [d for d in range(input.dim()) if d != 1]
        # Statistics in float32 at least, as the CUDA kernels accumulate half inputs.
        stats_dtype = torch.promote_types(input.dtype, torch.float32)
        count = input.numel() // channels if channels else 0
        if count > 0:
            values = input.to(stats_dtype)
            local_var, local_mean = torch.var_mean(values, reduce_dims, correction=0)
            combined = torch.cat(
                [local_mean, torch.rsqrt(local_var + eps), torch.full((1,), float(count), dtype=stats_dtype)]
            )
        else:
            # An empty batch still takes part in the collective, or its peers wait.
            combined = torch.zeros(2 * channels + 1, dtype=stats_dtype)
        gathered = [torch.empty_like(combined) for _ in range(world_size)]
        dist.all_gather(gathered, combined, process_group, async_op=False)
        table = torch.stack(gathered)
        counts = table[:, 2 * channels]
        present = counts >= 1
        means = table[present, :channels]
        variances = table[present, channels : 2 * channels].pow(-2) - eps
        counts = counts[present].unsqueeze(1)
        total = counts.sum()
        mean = (means * counts).sum(0) / total
        # Chan's parallel variance: each rank's spread plus that of its mean.
        var = ((variances + (means - mean).pow(2)) * counts).sum(0) / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None and running_var is not None and total > 0:
            unbiased = var * total / (total - 1) if total > 1 else var
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        ctx.save_for_backward(input, weight, mean, invstd, total)
        ctx.process_group = process_group
        ctx.has_bias = bias is not None
        if count == 0:
            return torch.empty_like(input)
        output = (input.to(stats_dtype) - _channel_view(mean, input.dim())) * _channel_view(
            invstd, input.dim()
        )
        if weight is not None:
            output = output * _channel_view(weight.to(stats_dtype), input.dim())
        if bias is not None:
            output = output + _channel_view(bias.to(stats_dtype), input.dim())
        return output.to(input.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        input, weight, mean, invstd, total = ctx.saved_tensors
        channels = input.shape[1]
        grad_input = grad_weight = grad_bias = None
        if input.numel() > 0:
            dims = input.dim()
            reduce_dims = [d for d in range(dims) if d != 1]
            dy = grad_output.to(mean.dtype)
            centred = input.to(mean.dtype) - _channel_view(mean, dims)
            sum_dy = dy.sum(reduce_dims)
            sum_dy_centred = (dy * centred).sum(reduce_dims)
            if ctx.needs_input_grad[0]:
                combined = torch.cat([sum_dy, sum_dy_centred])
                dist.all_reduce(combined, dist.ReduceOp.SUM, ctx.process_group, async_op=False)
                all_dy, all_dy_centred = combined.split(channels)
                scale = invstd if weight is None else invstd * weight.to(mean.dtype)
                grad_input = (
                    dy
                    - _channel_view(all_dy / total, dims)
                    - centred * _channel_view(invstd.pow(2) * all_dy_centred / total, dims)
                ) * _channel_view(scale, dims)
                grad_input = grad_input.to(input.dtype)
            # The weight and bias gradients stay local: DDP all-reduces them.
            if weight is not None and ctx.needs_input_grad[1]:
                grad_weight = (sum_dy_centred * invstd).to(weight.dtype)
            if weight is not None and ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = sum_dy.to(weight.dtype)
        elif ctx.needs_input_grad[0]:
            combined = torch.zeros(2 * channels, dtype=mean.dtype)
            dist.all_reduce(combined, dist.ReduceOp.SUM, ctx.process_group, async_op=False)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


def needs_cpu_sync(module: torch.nn.SyncBatchNorm, input: torch.Tensor) -> bool:
    """Whether PyTorch's forward would synchronise this input and refuse it for being on CPU."""
    return bool(
        module.training and input.device.type == "cpu" and dist.is_available() and dist.is_initialized()
    )


def cpu_sync_batch_norm(module: torch.nn.SyncBatchNorm, input: torch.Tensor) -> torch.Tensor:
    """SyncBatchNorm.forward in training mode, for a CPU input (see needs_cpu_sync)."""
    module._check_input_dim(input)
    check_channels = getattr(module, "_check_non_zero_input_channels", None)  # torch >= 2.5
    if check_channels is not None:
        check_channels(input)
    factor = 0.0 if module.momentum is None else module.momentum
    if module.track_running_stats and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        if module.momentum is None:  # cumulative moving average
            factor = 1.0 / float(module.num_batches_tracked.item())
    running_mean = module.running_mean if module.track_running_stats else None
    running_var = module.running_var if module.track_running_stats else None
    group = module.process_group if module.process_group is not None else dist.group.WORLD
    world_size = dist.get_world_size(group)
    if world_size < 2:
        return F.batch_norm(
            input, running_mean, running_var, module.weight, module.bias, True, factor, module.eps
        )
    output: torch.Tensor = CpuSyncBatchNormFunction.apply(
        input, module.weight, module.bias, running_mean, running_var, module.eps, factor, group, world_size
    )
    return output


def run_sync_batch_norm_on_cpu(note: Callable[[str], None] = lambda kind: None) -> None:
    """Patch torch so that SyncBatchNorm trains on CPU ranks: its forward takes CPU
    inputs (cpu_sync_batch_norm) and DDP accepts a CPU module that holds one. ``note``
    hears of each use, for --cpu's report of what it mapped."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    original_forward = nn.SyncBatchNorm.forward

    def forward(self: nn.SyncBatchNorm, input: torch.Tensor) -> torch.Tensor:
        if not needs_cpu_sync(self, input):
            return original_forward(self, input)
        note("SyncBatchNorm -> CPU statistics, same collectives")
        return cpu_sync_batch_norm(self, input)

    def accept_cpu_syncbn(self: DistributedDataParallel, module: nn.Module) -> None:
        if any(isinstance(layer, nn.SyncBatchNorm) for layer in module.modules()):
            note("DistributedDataParallel(SyncBatchNorm on CPU) accepted")

    nn.SyncBatchNorm.forward = forward
    DistributedDataParallel._passing_sync_batchnorm_handle = accept_cpu_syncbn
