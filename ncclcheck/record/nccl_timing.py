"""NCCL's timing on gloo: collectives return at once, a rank blocks where a CUDA program would.

On GPUs, ``dist.all_reduce(x)`` enqueues a kernel and returns; the CPU runs on and
only waits for the GPU at the next device synchronisation point: ``.item()``,
``.cpu()``, ``.tolist()``, ``.numpy()``, printing or formatting a tensor, ``float()``
/``int()``/``bool()`` of one, ``torch.cuda.synchronize()``, or a ``barrier()``
(NCCL's barrier synchronises the device). A rank whose collective has no partner
therefore hangs at one of those lines, not in the collective: the shape doctor
must read on real NCCL jobs. gloo blocks in the collective itself. This module
gives gloo ranks NCCL's timing, so that the hangs the tests make are the hangs
users see:

- every collective called with ``async_op=False`` (the default) is issued with
  ``async_op=True`` and its work kept as pending; the call returns at once;
- each synchronisation point above first waits for every pending work (a CUDA
  stream runs in order, so a read waits for every kernel enqueued before it);
- ``barrier()`` runs as it is: gloo's barrier waits for the pending work itself.

What stays as on gloo: DDP's gradient all-reduce completes inside ``backward()``
(DDP copies the gradients out of its buckets when its hook's future completes, so
the future cannot be returned early without averaging stale values), a
``work.wait()`` on the user's own ``async_op=True`` call blocks, and the object
collectives read their sizes at once (as on NCCL, where they synchronise too).

A rank waiting at a synchronisation point shows this module's ``settle`` frame
innermost; doctor drops it (``EMULATION_FILE``), so the stack it reads is a CUDA
rank's: the user's ``.item()`` line innermost, no torch.distributed frame.

Enabled by ``NCCLCHECK_NCCL_TIMING=1``: by preflight's bootstrap
(``preflight --nccl-timing``), or for any script by
``torchrun ... -m ncclcheck.record.nccl_timing train.py ARGS``.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
import threading
from collections.abc import Callable
from typing import Any

from ncclcheck.communicates import COLLECTIVES, P2P

ENV_NCCL_TIMING = "NCCLCHECK_NCCL_TIMING"
# doctor drops this file's frames from a stack (evidence/stacks.py)
EMULATION_FILE = "ncclcheck/record/nccl_timing.py"

# Tensor methods that read a value on the host: each waits for the device first.
TENSOR_READS = (
    "item",
    "tolist",
    "cpu",
    "numpy",
    "__repr__",
    "__format__",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
)
# Collectives that block on NCCL as well: they synchronise the device themselves.
BLOCKING = frozenset({"barrier", "monitored_barrier"})
_OBJECT_COLLECTIVES = frozenset(
    {"all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"}
)

_pending: list[Any] = []
_lock = threading.Lock()


def settle() -> None:
    """Wait for every collective this rank enqueued: a device synchronisation point."""
    with _lock:
        works = list(_pending)
        _pending.clear()
    for work in works:
        work.wait()


def _enqueue(work: Any) -> None:
    with _lock:
        _pending[:] = [w for w in _pending if not w.is_completed()]
        _pending.append(work)


def _asynchronous(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` issued with async_op=True unless the caller asked for a work itself."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return fn
    if "async_op" not in params:
        return fn
    position = params.index("async_op")

    @functools.wraps(fn)
    def issued(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("async_op") or (len(args) > position and args[position]):
            return fn(*args, **kwargs)  # the caller waits on its work itself
        if len(args) > position:
            args = (*args[:position], True, *args[position + 1 :])
        else:
            kwargs["async_op"] = True
        work = fn(*args, **kwargs)
        if work is not None:  # a rank outside the group gets None
            _enqueue(work)
        return None

    return issued


def _reading(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def read(*args: Any, **kwargs: Any) -> Any:
        if _pending:
            settle()
        return method(*args, **kwargs)

    return read


def install() -> None:
    """Give torch.distributed's collectives NCCL's timing (before the recorder wraps them)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for op in (*COLLECTIVES, *P2P):
        if op in BLOCKING or op in _OBJECT_COLLECTIVES:
            continue
        original = getattr(c10d, op, None)
        if original is None or getattr(original, "__ncclcheck_timing__", False):
            continue
        issued = _asynchronous(original)
        issued.__ncclcheck_timing__ = True  # type: ignore[attr-defined]
        for module in (dist, c10d):
            if getattr(module, op, None) is original:
                setattr(module, op, issued)
    for name in TENSOR_READS:
        method = getattr(torch.Tensor, name, None)
        if method is not None:
            setattr(torch.Tensor, name, _reading(method))
    install_device_synchronize()


def install_device_synchronize() -> None:
    """``torch.cuda.synchronize()`` (after preflight --cpu has mapped it to a no-op)."""
    import torch

    mapped = torch.cuda.synchronize

    def synchronize(*args: Any, **kwargs: Any) -> None:
        settle()
        if torch.cuda.is_initialized():
            mapped(*args, **kwargs)

    torch.cuda.synchronize = synchronize


def main() -> None:
    """``python -m ncclcheck.record.nccl_timing SCRIPT ARGS``: run SCRIPT with NCCL's timing."""
    if len(sys.argv) < 2:
        print("usage: python -m ncclcheck.record.nccl_timing SCRIPT [ARGS...]", file=sys.stderr)
        sys.exit(2)
    os.environ[ENV_NCCL_TIMING] = "1"
    install()
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
