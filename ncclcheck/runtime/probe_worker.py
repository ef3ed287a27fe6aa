"""The probe's rank side, run by torch.distributed.run (``--module ncclcheck.runtime.probe_worker``).

Each rank checks in through torchrun's store, shares what it is (host, device,
versions, NCCL_/TORCH_/MASTER_ settings), runs every collective on known values
and verifies the result, then times each collective over a range of sizes. It
writes what it found to ``<NCCLCHECK_PROBE_OUT>/rank-NNNNN.json`` after each
stage, so a rank that dies or is stopped leaves what it had. Every wait is
bounded: the store by the check-in timeout, collectives by the process group's.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from ncclcheck.record.rendezvous import CheckInFailed, check_in

ENV_OUT = "NCCLCHECK_PROBE_OUT"
ENV_CONFIG = "NCCLCHECK_PROBE_CONFIG"
# Test-only switches: make one rank fail in a chosen way (the tests need real faults).
ENV_TEST_CRASH_RANK = "NCCLCHECK_PROBE_TEST_CRASH_RANK"  # exits at start, before checking in
ENV_TEST_STALL_RANK = "NCCLCHECK_PROBE_TEST_STALL_RANK"  # never checks in
ENV_TEST_CORRUPT_RANK = "NCCLCHECK_PROBE_TEST_CORRUPT_RANK"  # contributes wrong values
CHECKIN_FAILED_EXIT = 76

_SETTINGS_PREFIXES = ("NCCL_", "TORCH_", "MASTER_", "GLOO_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


class Output:
    """This rank's findings, rewritten whole after each stage (small: a few KB)."""

    def __init__(self, folder: str, rank: int) -> None:
        self.path = os.path.join(folder, f"rank-{rank:05d}.json")
        self.data: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname()}

    def save(self, **fields: Any) -> None:
        self.data.update(fields)
        partial = self.path + ".partial"
        with open(partial, "w", encoding="utf-8") as handle:
            json.dump(self.data, handle)
        os.replace(partial, self.path)


def facts(backend: str) -> dict[str, Any]:
    import torch

    env = os.environ
    found: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "group_rank": int(env.get("GROUP_RANK", "0")),
        "backend": backend,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": "cpu",
        "settings": {k: v for k, v in sorted(env.items()) if k.startswith(_SETTINGS_PREFIXES)},
    }
    if backend == "nccl" and torch.cuda.is_available():
        local = int(env.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        found["device"] = f"cuda:{local} {torch.cuda.get_device_name(local)}"
        found["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
    return found


# -- correctness: every collective on known values ---------------------------------------


def _value(rank: int, corrupt: bool) -> float:
    return float(rank + 1) + (1000.0 if corrupt else 0.0)


def correctness(rank: int, world: int, device: Any, corrupt: bool) -> list[dict[str, Any]]:
    """Each check: what this rank saw, and which peers' contributions were wrong in it."""
    import torch
    import torch.distributed as dist

    mine = _value(rank, corrupt)
    expected = [float(r + 1) for r in range(world)]
    results: list[dict[str, Any]] = []

    def record(op: str, ok: bool, wrong_from: list[int] | None = None, detail: str = "") -> None:
        results.append({"op": op, "ok": ok, "wrong_from": wrong_from or [], "detail": detail})

    def attempt(op: str, body: Any) -> None:
        try:
            body()
        except RuntimeError as exc:  # an op this backend does not offer
            text = str(exc).splitlines()[0]
            if "not supported" in text.lower() or "unsupported" in text.lower():
                results.append({"op": op, "ok": True, "skipped": text, "wrong_from": [], "detail": ""})
            else:
                record(op, False, detail=text[:200])

    def all_reduce_sum() -> None:
        value = torch.full((4,), mine, device=device)
        dist.all_reduce(value)
        got = value[0].item()
        record("all_reduce(sum)", got == sum(expected), detail=f"got {got}, expected {sum(expected)}")

    def all_reduce_max() -> None:
        value = torch.full((4,), mine, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        got = value[0].item()
        record("all_reduce(max)", got == max(expected), detail=f"got {got}, expected {max(expected)}")

    def broadcast() -> None:
        value = torch.full((4,), mine, device=device)
        dist.broadcast(value, src=0)
        got = value[0].item()
        record("broadcast", got == expected[0], [0] if got != expected[0] else [], f"got {got}")

    def all_gather() -> None:
        slots = [torch.zeros(4, device=device) for _ in range(world)]
        dist.all_gather(slots, torch.full((4,), mine, device=device))
        wrong = [r for r, slot in enumerate(slots) if slot[0].item() != expected[r]]
        record("all_gather", not wrong, wrong)

    def reduce_scatter() -> None:
        out = torch.zeros(2, device=device)
        dist.reduce_scatter_tensor(out, torch.full((2 * world,), mine, device=device))
        got = out[0].item()
        record("reduce_scatter", got == sum(expected), detail=f"got {got}, expected {sum(expected)}")

    def all_to_all() -> None:
        out = torch.zeros(world, device=device)
        dist.all_to_all_single(out, torch.full((world,), mine, device=device))
        wrong = [r for r in range(world) if out[r].item() != expected[r]]
        record("all_to_all", not wrong, wrong)

    def barrier() -> None:
        dist.barrier()
        record("barrier", True)

    def objects() -> None:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"rank": rank, "value": mine})
        wrong = [r for r, item in enumerate(gathered) if item != {"rank": r, "value": expected[r]}]
        record("all_gather_object", not wrong, wrong)
        box: list[Any] = [{"from": 0, "value": mine}] if rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)
        ok = box[0] == {"from": 0, "value": expected[0]}
        record("broadcast_object_list", ok, [] if ok else [0])

    for op, body in (
        ("all_reduce(sum)", all_reduce_sum),
        ("all_reduce(max)", all_reduce_max),
        ("broadcast", broadcast),
        ("all_gather", all_gather),
        ("reduce_scatter", reduce_scatter),
        ("all_to_all", all_to_all),
        ("barrier", barrier),
        ("objects", objects),
    ):
        attempt(op, body)
    return results


# -- performance: as nccl-tests measures it ------------------------------------------------

# bus bandwidth = algorithm bandwidth x this factor (nccl-tests, doc/PERFORMANCE.md)
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def _collective_call(op: str, buffer: Any, chunk: Any, out: Any) -> Any:
    """The timed call for ``op`` on these buffers (bound now, not looked up per call)."""
    import torch.distributed as dist

    if op == "all_reduce":
        return lambda: dist.all_reduce(buffer)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(out, chunk)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(chunk, buffer)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, buffer)
    return lambda: dist.broadcast(buffer, src=0)


def sizes(max_bytes: int, min_bytes: int = 8, step: int = 4) -> list[int]:
    found = []
    size = min_bytes
    while size <= max_bytes:
        found.append(size)
        size *= step
    return found


def performance(
    world: int, device: Any, max_bytes: int, repeats: int, iterations: int, skip: set[str]
) -> list[dict[str, Any]]:
    """This rank's median time per call, by op and size (bytes as nccl-tests counts them:
    the whole buffer, output for all_gather, input for reduce_scatter)."""
    import torch
    import torch.distributed as dist

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for op in BUS_FACTOR:
        if op in skip:
            continue
        for size in sizes(max_bytes):
            elements = max(world, size // 4 // world * world)  # float32, divisible by world
            buffer = torch.ones(elements, device=device)
            chunk = buffer[: elements // world].clone()
            out = torch.empty_like(buffer)

            call = _collective_call(op, buffer, chunk, out)
            for _ in range(3):  # warm-up: connections, algorithms, allocator
                call()
            synchronize()
            samples = []
            for _ in range(repeats):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iterations):
                    call()
                synchronize()
                samples.append((time.perf_counter() - start) / iterations)
            rows.append({"op": op, "bytes": elements * 4, "seconds": statistics.median(samples)})
    return rows


# -- process groups of a parallel layout -------------------------------------------------


def layout_groups(layout: list[tuple[str, int]], world: int) -> dict[str, list[list[int]]]:
    """``[("tp", 2), ("dp", 2)]`` (innermost first): tp groups [0,1],[2,3]; dp [0,2],[1,3]."""
    groups: dict[str, list[list[int]]] = {}
    stride = 1
    for name, size in layout:
        members: list[list[int]] = []
        for base in range(world):
            if (base // stride) % size != 0:
                continue  # not the first member of its group along this dimension
            members.append([base + i * stride for i in range(size)])
        groups[name] = members
        stride *= size
    return groups


def check_layout(
    rank: int,
    world: int,
    device: Any,
    layout: list[tuple[str, int]],
    timeout: datetime.timedelta,
    corrupt: bool,
) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    results = []
    for name, members_list in layout_groups(layout, world).items():
        for members in members_list:
            # every rank creates every group, in the same order (torch requires it)
            group = dist.new_group(members, timeout=timeout)
            if rank not in members:
                continue
            value = torch.full((4,), _value(rank, corrupt), device=device)
            start = time.perf_counter()
            dist.all_reduce(value, group=group)
            seconds = time.perf_counter() - start
            expected = float(sum(r + 1 for r in members))
            results.append(
                {
                    "dimension": name,
                    "members": members,
                    "ok": value[0].item() == expected,
                    "detail": f"got {value[0].item()}, expected {expected}",
                    "seconds": seconds,
                }
            )
    return results


def main() -> None:
    import torch
    import torch.distributed as dist

    env = os.environ
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    config = json.loads(env[ENV_CONFIG])
    out = Output(env[ENV_OUT], rank)
    out.save(stage="started", local_rank=int(env.get("LOCAL_RANK", "0")), world=world)
    if env.get(ENV_TEST_CRASH_RANK) == str(rank):
        os._exit(3)
    if env.get(ENV_TEST_STALL_RANK) == str(rank):
        time.sleep(3600)
    try:
        check_in("probe", config["checkin_timeout"])
    except CheckInFailed as failed:
        out.save(
            stage="check-in failed",
            missing=failed.missing,
            present={str(k): v for k, v in failed.present.items()},
        )
        sys.stdout.flush()
        os._exit(CHECKIN_FAILED_EXIT)
    out.save(stage="checked in")

    backend = config["backend"]
    timeout = datetime.timedelta(seconds=config["op_timeout"])
    if backend == "nccl":
        torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=timeout)
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    mine = facts(backend)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    out.save(stage="facts", facts=mine, everyone=everyone if rank == 0 else None)

    corrupt = env.get(ENV_TEST_CORRUPT_RANK) == str(rank)
    checks = correctness(rank, world, device, corrupt)
    out.save(stage="correctness", checks=checks)

    skip = {c["op"] for c in checks if c.get("skipped")}
    rows = performance(world, device, config["max_bytes"], config["repeats"], config["iterations"], skip)
    out.save(stage="performance", performance=rows)

    layout = [(name, int(size)) for name, size in config.get("layout", [])]
    if layout:
        out.save(stage="layout", layout=check_layout(rank, world, device, layout, timeout, corrupt))
    dist.barrier()
    out.save(stage="done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
