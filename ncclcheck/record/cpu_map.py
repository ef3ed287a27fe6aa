"""``preflight --cpu``: run a script written for NCCL and CUDA on CPU ranks with gloo.

The alignment check needs the script's control flow, not its kernels: which
collectives each rank calls, in which order, with which shapes. So the common
CUDA calls are mapped to their CPU meaning, each first use per call site is
written to the trace (``{"t": "cpu", "kind": ..., "site": ...}``) and the report
lists them:

- backend: ``init_process_group("nccl")`` (or no backend) and ``new_group(backend="nccl")``
  -> gloo; ``device_id=`` dropped
- ``torch.cuda.is_available()`` -> True (the script takes its GPU path),
  ``device_count()`` -> the ranks on this node, ``current_device()`` -> LOCAL_RANK,
  ``set_device``/``synchronize``/``empty_cache``/memory statistics -> no-ops or 0
- ``Tensor.cuda()``/``Module.cuda()`` -> unchanged (CPU), ``.to("cuda")``,
  ``.to(torch.device("cuda", i))``, ``.to(i)`` -> CPU, ``device="cuda"`` in the
  tensor factories -> CPU
- ``DistributedDataParallel(module, device_ids=[i])`` -> without device ids
- ``torch.autocast("cuda", ...)`` -> CPU autocast in bfloat16; ``GradScaler("cuda")`` -> CPU
- ``SyncBatchNorm`` -> the same statistics and collectives on CPU (record/cpu_syncbn.py),
  and DDP accepts a CPU module that holds one

What is not mapped (streams, events, custom kernels, NCCL-only options) fails in
the script, and preflight says which call it was.
"""

from __future__ import annotations

import datetime
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from ncclcheck import frames
from ncclcheck.record.recorder import Recorder
from ncclcheck.settings import NCCL_DEFAULT_TIMEOUT_S

ENV_CPU = "NCCLCHECK_CPU"
_FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
    "randint",
    "randperm",
    "arange",
    "linspace",
    "eye",
    "tensor",
    "as_tensor",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
)


class _Mapper:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def note(self, kind: str) -> None:
        """Write the first use of a mapping at each user call site."""
        self.recorder.note_site("cpu", kind, frames.first_user_frame(sys._getframe(2)))


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # .to(0): a CUDA ordinal
    return getattr(device, "type", None) == "cuda"


def _gloo(backend: Any) -> Any:
    if backend is None:
        return "gloo"
    text = str(backend)
    return "gloo" if "nccl" in text else backend


def install(recorder: Recorder) -> None:
    """Patch torch so that a CUDA/NCCL script runs on CPU with gloo (after the recorder's
    own patches, which these wrap)."""
    note = _Mapper(recorder).note
    _map_process_groups(note)
    _map_cuda_queries(note)
    _map_devices(note)
    _map_wrappers(note)

    from ncclcheck.record.cpu_syncbn import run_sync_batch_norm_on_cpu

    run_sync_batch_norm_on_cpu(note)


def _map_process_groups(note: Callable[[str], None]) -> None:
    """NCCL process groups become gloo ones."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original_init = dist.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = args[0] if args else kwargs.get("backend")
        if _gloo(backend) != backend:
            note(f"init_process_group({backend!r}) -> gloo")
            if "timeout" not in kwargs and len(args) <= 2:
                # the job's collectives wait NCCL's 10 minutes, not gloo's 30: how long a
                # rank outside every collective may keep them waiting (evidence/waits.py)
                kwargs["timeout"] = datetime.timedelta(seconds=NCCL_DEFAULT_TIMEOUT_S)
        args = ("gloo", *args[1:]) if args else args
        if not args:
            kwargs["backend"] = "gloo"
        if kwargs.pop("device_id", None) is not None:
            note("init_process_group(device_id=...) dropped")
        return original_init(*args, **kwargs)

    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group

    original_new_group = dist.new_group

    @functools.wraps(original_new_group)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        if "nccl" in str(kwargs.get("backend")):
            note(f"new_group(backend={kwargs['backend']!r}) -> gloo")
            kwargs["backend"] = "gloo"
        return original_new_group(*args, **kwargs)

    dist.new_group = new_group
    c10d.new_group = new_group


def _map_cuda_queries(note: Callable[[str], None]) -> None:
    """torch.cuda answers as a machine with one GPU per local rank would."""
    import torch

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    def replace_cuda(name: str, value: Callable[..., Any]) -> None:
        def mapped(*args: Any, **kwargs: Any) -> Any:
            note(f"torch.cuda.{name}()")
            return value(*args, **kwargs)

        setattr(torch.cuda, name, mapped)

    replace_cuda("is_available", lambda: True)
    replace_cuda("device_count", lambda: local_ranks)
    replace_cuda("current_device", lambda: local_rank)
    for name in ("set_device", "synchronize", "empty_cache", "reset_peak_memory_stats", "manual_seed_all"):
        replace_cuda(name, lambda *a, **k: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        replace_cuda(name, lambda *a, **k: 0)
    replace_cuda("get_device_name", lambda *a, **k: "cpu (ncclcheck preflight --cpu)")


def _map_devices(note: Callable[[str], None]) -> None:
    """Tensors and modules sent to a CUDA device stay on the CPU."""
    import torch
    from torch import nn

    def tensor_cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        note(".cuda()")
        return self

    def module_cuda(self: nn.Module, device: Any = None) -> nn.Module:
        note("Module.cuda()")
        return self

    torch.Tensor.cuda = tensor_cuda
    nn.Module.cuda = module_cuda

    def cpu_args(
        kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args and _is_cuda(args[0]):
            note(kind)
            args = ("cpu", *args[1:])
        if _is_cuda(kwargs.get("device")):
            note(kind)
            kwargs["device"] = "cpu"
        return args, kwargs

    original_tensor_to = torch.Tensor.to
    original_module_to = nn.Module.to

    def tensor_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = cpu_args('.to("cuda")', args, kwargs)
        return original_tensor_to(self, *args, **kwargs)

    def module_to(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = cpu_args('Module.to("cuda")', args, kwargs)
        return original_module_to(self, *args, **kwargs)

    torch.Tensor.to = tensor_to
    nn.Module.to = module_to

    for name in _FACTORIES:
        factory = getattr(torch, name, None)
        if factory is None:
            continue

        def on_cpu(*args: Any, _factory: Any = factory, _name: str = name, **kwargs: Any) -> Any:
            if _is_cuda(kwargs.get("device")):
                note(f'torch.{_name}(device="cuda")')
                kwargs["device"] = "cpu"
            return _factory(*args, **kwargs)

        setattr(torch, name, on_cpu)


def _map_wrappers(note: Callable[[str], None]) -> None:
    """DDP's device_ids, autocast and GradScaler for CUDA, made CPU ones."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    original_ddp_init = DistributedDataParallel.__init__

    def ddp_init(self: DistributedDataParallel, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("device_ids") is not None or kwargs.get("output_device") is not None:
            note("DistributedDataParallel(device_ids=...) -> CPU module")
            kwargs.pop("device_ids", None)
            kwargs.pop("output_device", None)
        if args:  # device_ids given positionally
            note("DistributedDataParallel(device_ids=...) -> CPU module")
            args = (None, None, *args[2:])
        original_ddp_init(self, module, *args, **kwargs)

    DistributedDataParallel.__init__ = ddp_init

    original_autocast_init = torch.autocast.__init__

    def autocast_init(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        if device_type == "cuda":
            note('torch.autocast("cuda") -> CPU bfloat16')
            device_type = "cpu"
            kwargs["dtype"] = torch.bfloat16
            args = ()
        original_autocast_init(self, device_type, *args, **kwargs)

    torch.autocast.__init__ = autocast_init

    original_scaler_init = torch.amp.GradScaler.__init__

    def scaler_init(self: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
        if device == "cuda":
            note('GradScaler("cuda") -> CPU')
            device = "cpu"
        original_scaler_init(self, device, *args, **kwargs)

    torch.amp.GradScaler.__init__ = scaler_init
