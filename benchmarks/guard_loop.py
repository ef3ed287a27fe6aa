"""Worker for bench_guard.py: per-call cost of check_aligned, and of a small all_reduce
with and without the watchdog, alternating blocks in the same processes, timed on rank 0."""

import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ncclcheck.guard import check_aligned, watchdog


def block_us(call: Callable[[], object], repeats: int = 20) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    dist.init_process_group("gloo")
    value = torch.ones(1)
    guard = watchdog(timeout=300)  # on for the whole run, as in production
    watched = dist.all_reduce
    plain = watched.__ncclcheck_watchdog__  # type: ignore[attr-defined]
    for _ in range(50):
        plain(value)
        watched(value)
        check_aligned("warmup", steps=3)
    samples: dict[str, list[float]] = {"all_reduce": [], "watched_all_reduce": [], "check_aligned": []}
    for _ in range(30):
        samples["all_reduce"].append(block_us(lambda: plain(value)))
        samples["watched_all_reduce"].append(block_us(lambda: watched(value)))
        samples["check_aligned"].append(block_us(lambda: check_aligned("eval", steps=3)))
    guard.stop()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({k: statistics.median(v) for k, v in samples.items()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
