"""Worker for bench_preflight.py: a tight loop of small all_reduces, timed on rank 0.

BENCH_BACKEND picks gloo (the default: CPU tensors) or nccl (one GPU per rank, the
tensor on it, each timed block ended by a synchronize so that queued kernels count).

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


def _no_sync() -> None:
    return None


SYNC = _no_sync  # torch.cuda.synchronize under nccl


def time_block(call, value: torch.Tensor, calls: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for _ in range(calls):
        call(value)
    SYNC()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    mode = os.environ.get("BENCH_MODE", "interleaved")
    global SYNC
    backend = os.environ.get("BENCH_BACKEND", "gloo")
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        value = torch.ones(1, device="cuda")
        SYNC = torch.cuda.synchronize
    else:
        value = torch.ones(1)
    plain = dist.all_reduce
    for _ in range(300):  # warm-up: connections, allocator
        plain(value)
    result: dict[str, float] = {}
    if mode == "interleaved":
        from ncclcheck.record.recorder import ENV_PURE_PYTHON, Recorder

        # What preflight installs: the C fast path where it was built (record/_fastcall.c).
        recorder = Recorder(tempfile.mkdtemp(prefix="ncclcheck-bench-"), dist.get_rank(), 5, 1, 10)
        recorded = recorder.wrap_collective("all_reduce", plain)
        result["fast_path"] = float(type(recorded).__name__ == "FastCall")
        # The same recorder in Python alone, as where no C compiler was found.
        os.environ[ENV_PURE_PYTHON] = "1"
        python_recorder = Recorder(tempfile.mkdtemp(prefix="ncclcheck-bench-"), dist.get_rank(), 5, 1, 10)
        python_recorded = python_recorder.wrap_collective("all_reduce", plain)

        # Short blocks in ABBA order, compared pair by pair: the latency of gloo on a
        # shared VM jumps between regimes (300 us, then 3 ms) within seconds, so only
        # neighbouring blocks are comparable.
        # A busy-wait of 10 us before each plain call calibrates how this machine turns
        # a few microseconds of work before a collective into latency.
        def spin_then_plain(tensor: torch.Tensor) -> None:
            end = time.perf_counter() + 10e-6
            while time.perf_counter() < end:
                pass
            plain(tensor)

        block = 20
        # The same wrapper with a recorder that writes nothing: what any recorder
        # written in Python costs before it does any work.
        empty = Recorder(tempfile.mkdtemp(prefix="ncclcheck-bench-"), dist.get_rank(), 5, 1, 10)
        empty.record_call = lambda *args: None  # type: ignore[method-assign]
        wrapper_only = empty.wrap_collective("all_reduce", plain)

        # A write(2) of a call line (of the old, 300-byte size) to a file of its own: what
        # a recorder that writes each record before the collective pays for the call
        # alone, and what storing into the trace's mapping (tracefile.py) avoids.
        line_fd = os.open(
            os.path.join(tempfile.mkdtemp(prefix="ncclcheck-bench-"), "write"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        call_line = b"x" * 300 + b"\n"

        def write_then_plain(tensor: torch.Tensor) -> None:
            os.write(line_fd, call_line)
            plain(tensor)

        variants = {
            "recorder": recorded,
            "python": python_recorded,
            "spin10": spin_then_plain,
            "wrapper": wrapper_only,
            "write": write_then_plain,
        }
        ratios: dict[str, list[float]] = {name: [] for name in variants}
        samples: dict[str, list[float]] = {"plain": [], "recorder": []}
        for pair in range(max(1, iterations // (2 * block * len(variants)))):
            for name, variant in variants.items():
                order = (plain, variant) if pair % 2 == 0 else (variant, plain)
                timed: dict[object, float] = {}
                for call in order:
                    dist.barrier()
                    timed[call] = time_block(call, value, block)
                ratios[name].append(timed[variant] / timed[plain])
                if name == "recorder":
                    samples["plain"].append(timed[plain])
                    samples["recorder"].append(timed[recorded])
        result.update({name: statistics.median(values) for name, values in samples.items()})
        result["paired_ratio"] = statistics.median(ratios["recorder"])
        result["python_ratio"] = statistics.median(ratios["python"])
        result["spin10_ratio"] = statistics.median(ratios["spin10"])
        result["wrapper_ratio"] = statistics.median(ratios["wrapper"])
        result["write_ratio"] = statistics.median(ratios["write"])

        # The recorder's own work per call, without the network: the same wrapper
        # around a collective that returns at once, from the same stack depth.
        def returns_at_once(tensor: torch.Tensor, op: object = None, group: object = None) -> None:
            return None

        noop = recorder.wrap_collective("all_reduce", returns_at_once)
        result["cpu_us"] = min(time_block(noop, value, 2000) for _ in range(5))
        python_noop = python_recorder.wrap_collective("all_reduce", returns_at_once)
        result["python_cpu_us"] = min(time_block(python_noop, value, 2000) for _ in range(5))

        # The Python recorder's work timed from inside, in the loop and alone: between
        # two gloo calls it runs beside the other rank on 2 vCPUs, with the caches the
        # wait left behind, and costs several times what it costs alone.
        recorder = python_recorder
        record_call, spent = recorder.record_call, []
        clock = time.perf_counter_ns

        def timed_record_call(*args: object) -> None:
            start = clock()
            record_call(*args)
            spent.append(clock() - start)

        recorder.record_call = timed_record_call  # type: ignore[method-assign]
        timed_loop = recorder.wrap_collective("all_reduce", plain)
        timed_noop = recorder.wrap_collective("all_reduce", returns_at_once)
        for _ in range(1000):
            timed_loop(value)
        result["work_in_loop_us"] = statistics.median(spent) / 1000
        spent.clear()
        for _ in range(1000):
            timed_noop(value)
        result["work_alone_us"] = statistics.median(spent) / 1000
    else:
        dist.barrier()
        result[mode] = time_block(plain, value, iterations)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
