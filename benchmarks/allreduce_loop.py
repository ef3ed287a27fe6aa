"""Worker for bench_preflight.py: a tight loop of small gloo all_reduces, timed on rank 0.

Mode ``interleaved`` (the default) measures plain and recorded calls in the same
processes, over the same connections, in alternating blocks, so that the drift
of a busy machine hits both alike; ``plain`` and ``detail`` time one kind only
(DETAIL must be chosen before the process group exists).
"""

import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist


def time_block(call, value: torch.Tensor, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(calls):
        call(value)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    mode = os.environ.get("BENCH_MODE", "interleaved")
    dist.init_process_group("gloo")
    value = torch.ones(1)
    plain = dist.all_reduce
    for _ in range(300):  # warm-up: connections, allocator
        plain(value)
    result: dict[str, float] = {}
    if mode == "interleaved":
        from ncclcheck.record.recorder import Recorder

        recorder = Recorder(tempfile.mkdtemp(prefix="ncclcheck-bench-"), dist.get_rank(), 5, 1, 10)
        recorded = recorder.wrap_collective("all_reduce", plain)
        block = 100
        samples: dict[str, list[float]] = {"plain": [], "recorder": []}
        for _ in range(max(1, iterations // (2 * block))):
            dist.barrier()
            samples["plain"].append(time_block(plain, value, block))
            dist.barrier()
            samples["recorder"].append(time_block(recorded, value, block))
        result = {name: statistics.median(values) for name, values in samples.items()}
    else:
        dist.barrier()
        result[mode] = time_block(plain, value, iterations)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
