"""A rank of a virtual world: ``preflight --world-size W`` (launch/virtual.py).

Each virtual rank is one process that is rank r of a world of W through torch's fake
process group (backend "fake", ``FakeStore``): every collective completes at once
with no communication, so any rank of a 1,024-rank job can run alone and record its
sequence of collectives like any dry-run rank.

A fake collective leaves each rank its own data, so ranks that decide on a reduced
value would decide differently than they really do. The results are made the same on
every virtual rank at the same position of the same group: rank 0 runs first (the
reference) and writes the result of each all_reduce, broadcast and all_gather it
makes (tensors up to ``_KEPT`` elements); every other rank takes rank 0's result at the same group
and position where the shape and dtype match. Rank 0's own result is what the job
would give if every rank held rank 0's value (a SUM is its value times the group's
size; AVG, MAX, MIN keep it; a broadcast keeps it, exactly right when rank 0 is the
source). Decisions on synchronised values then agree; decisions on rank-local values
still differ. What this cannot reproduce: a decision that depends on the true
reduced value of W different contributions.

Also here: the backend the script asks for is replaced by "fake" (a store address of
its own is refused: the virtual world is the launcher's environment), DDP's
gradient all-reduce returns the bucket at once (the fake work gives DDP no tensor),
and ``broadcast_object_list`` keeps each rank's own objects (its size exchange
cannot run on the fake group).
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

ENV_VIRTUAL = "NCCLCHECK_VIRTUAL"  # the reference file: set in every rank of a virtual world
REFERENCE_FILE = "virtual-reference.jsonl"
_KEPT = 4096  # elements of a result rank 0 writes for the others


class VirtualWorldRefused(BaseException):
    """The script sets up a real process group of its own (an init_method or a store)."""


class Reference:
    """Rank 0's results, by (group, position): written by rank 0, read by the others."""

    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.writing = rank == 0
        self.results: dict[str, Any] = {}
        self.positions: dict[str, int] = {}
        if not self.writing and os.path.exists(path):
            with open(path, encoding="utf-8") as saved:
                for line in saved:
                    if line.strip():
                        record = json.loads(line)
                        self.results[record["key"]] = record
        self.out = open(path, "w", encoding="utf-8") if self.writing else None  # noqa: SIM115

    def key(self, op: str, group: Any) -> str:
        import torch.distributed as dist

        ranks = (
            "world"
            if group is None or group is dist.group.WORLD
            else str(dist.get_process_group_ranks(group))
        )
        name = f"{ranks}"
        position = self.positions.get(name, 0)
        self.positions[name] = position + 1
        return f"{name}#{position}:{op}"

    def settle(self, key: str, tensor: Any) -> None:
        """Write rank 0's result, or take it on another rank."""
        if self.out is not None:
            if tensor.numel() <= _KEPT:
                values = tensor.detach().cpu().flatten().tolist()
                record = {
                    "key": key,
                    "shape": list(tensor.shape),
                    "dtype": str(tensor.dtype),
                    "values": values,
                }
                self.out.write(json.dumps(record) + "\n")
                self.out.flush()
            return
        kept = self.results.get(key)
        if kept is None or kept["shape"] != list(tensor.shape) or kept["dtype"] != str(tensor.dtype):
            return
        import torch

        with torch.no_grad():
            tensor.copy_(torch.tensor(kept["values"], dtype=tensor.dtype).reshape(tensor.shape))


def install(reference_path: str, rank: int, world_size: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.testing._internal.distributed.fake_pg import FakeStore

    reference = Reference(reference_path, rank)
    original_init = dist.init_process_group

    @functools.wraps(original_init)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
        if kwargs.get("store") is not None or (init_method and not str(init_method).startswith("env://")):
            raise VirtualWorldRefused(
                "the script sets up its own process group (init_method= or store=): a virtual world "
                "gives each rank the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR); use "
                "init_process_group(backend) with the env:// default"
            )
        for name in ("backend", "init_method", "rank", "world_size", "store", "device_id"):
            kwargs.pop(name, None)
        return original_init("fake", store=FakeStore(), rank=rank, world_size=world_size, **kwargs)

    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group

    original_new_group = dist.new_group

    @functools.wraps(original_new_group)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        # a subgroup of the fake world is fake too: a backend named here would be a real one
        kwargs.pop("backend", None)
        kwargs.pop("pg_options", None)
        if len(args) > 2:
            args = args[:2]  # new_group(ranks, timeout, backend, ...): keep ranks and timeout
        return original_new_group(*args, **kwargs)

    dist.new_group = new_group
    c10d.new_group = new_group

    def settled(op: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            # all_reduce(tensor, op, group), broadcast(tensor, src, group), all_gather(outputs,
            # input, group), all_gather_into_tensor(output, input, group): the group is third
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            work = fn(tensor, *args, **kwargs)
            if op == "all_reduce":
                reduce_op = kwargs.get("op", args[0] if args else dist.ReduceOp.SUM)
                if reduce_op == dist.ReduceOp.SUM and tensor.dtype is not torch.bool:
                    size = dist.get_world_size(group)
                    with torch.no_grad():
                        tensor.mul_(size)  # as if every rank held this rank's value
            key = reference.key(op, group)
            if isinstance(tensor, (list, tuple)):  # all_gather's list: each slot at its own key
                for slot, each in enumerate(tensor):
                    reference.settle(f"{key}/{slot}", each)
            else:
                reference.settle(key, tensor)
            return work

        return call

    # The fake group gives an all_gather W copies of the rank's own input: rank 0's
    # output stands for everyone's, as if every rank held rank 0's (a gather of lengths
    # before padding to the longest then pads alike on every rank).
    for op in ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor"):
        wrapped = settled(op, getattr(dist, op))
        setattr(dist, op, wrapped)
        setattr(c10d, op, wrapped)

    def broadcast_object_list(
        object_list: list[Any], src: int | None = None, group: Any = None, **_: Any
    ) -> None:
        return None  # each rank keeps its own objects

    dist.broadcast_object_list = broadcast_object_list
    c10d.broadcast_object_list = broadcast_object_list

    def allreduce_fut(process_group: Any, tensor: Any) -> Any:
        future: torch.futures.Future[Any] = torch.futures.Future()
        future.set_result(tensor)  # every rank holds this gradient: the average is itself
        return future

    default_hooks._allreduce_fut = allreduce_fut
