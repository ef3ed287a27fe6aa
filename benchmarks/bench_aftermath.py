"""doctor --from at scale: synthetic leftovers of a job of 256, 1,024 and 4,096 ranks,
diagnosed in a subprocess; its wall time and peak memory printed side by side.

Two shapes of evidence, as clusters keep them:
- one interleaved job log: every rank's training lines (``--noise-lines`` each) with
  torchrun's ``[rankN]:`` prefix, then NCCL's watchdog lines of every rank but one,
  which stopped a collective early (it left no watchdog line);
- one py-spy text dump per rank (a file each), every rank but one in the same
  all_reduce, the one in a barrier.

    python benchmarks/bench_aftermath.py [--ranks 256 1024 4096] [--noise-lines 500]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ncclcheck.model import format_ranks

ODD_RANK = 7  # the rank that parts from the others


def write_log(path: Path, ranks: int, noise_lines: int) -> int:
    with open(path, "w") as log:
        for step in range(noise_lines):
            for rank in range(ranks):
                log.write(
                    f"[rank{rank}]:step {step} loss {2.0 - step / 1000:.4f} lr 3.0e-04 tokens/s 41234\n"
                )
        for rank in range(ranks):
            if rank == ODD_RANK:
                continue
            log.write(
                f"[rank{rank}]:[E1202 00:12:40.934712 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=1235, OpType=ALLREDUCE, NumelIn=262144, NumelOut=262144, "
                "Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n"
                f"[rank{rank}]:[E1202 00:12:40.935012 ProcessGroupNCCL.cpp:2167] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Timeout at NCCL work: 1235, last enqueued NCCL work: 1235, "
                "last completed NCCL work: 1234.\n"
            )
        log.write(f"WORLD_SIZE={ranks}\n")
    return path.stat().st_size


def write_stacks(folder: Path, ranks: int) -> int:
    folder.mkdir()
    total = 0
    for rank in range(ranks):
        op, line = ("barrier", 65) if rank == ODD_RANK else ("all_reduce", 39)
        text = (
            f"Process {10000 + rank}: /usr/bin/python3 -u train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread {10000 + rank} (idle): "MainThread"\n'
            f"    {op} (torch/distributed/distributed_c10d.py:2501)\n"
            "    wrapper (torch/distributed/c10d_logger.py:83)\n"
            f"    main (train.py:{line})\n    <module> (train.py:70)\n"
        )
        path = folder / f"rank{rank}.txt"
        path.write_text(text)
        total += len(text)
    return total


def run_doctor(path: Path) -> tuple[float, float, dict]:  # type: ignore[type-arg]
    """(seconds, peak RSS in MiB, report) of ``doctor --json --from path`` in a child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--from", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode not in (0, 1):
        raise SystemExit(f"doctor failed on {path}: {done.stderr[-2000:]}")
    # ru_maxrss is the largest child so far: runs go from small to large, so it is this one's
    return elapsed, max(peak, before) / 1024, json.loads(done.stdout)


def baseline() -> tuple[float, float]:
    """The same child doing nothing but importing ncclcheck's CLI: the fixed cost."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ncclcheck", "--help"], capture_output=True, check=True)
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--noise-lines", type=int, default=500, help="training lines per rank in the log")
    args = parser.parse_args()
    start_s, start_mib = baseline()
    print(f"cpus: {os.cpu_count()}; `ncclcheck --help` alone: {start_s:.2f} s, {start_mib:.0f} MiB peak")
    print(f"{'ranks':>6} {'evidence':<28} {'size MiB':>9} {'time s':>7} {'peak MiB':>9}  finding")
    with tempfile.TemporaryDirectory() as scratch:
        for ranks in sorted(args.ranks):
            log = Path(scratch) / f"job-{ranks}.log"
            size = write_log(log, ranks, args.noise_lines)
            stacks = Path(scratch) / f"stacks-{ranks}"
            stack_bytes = write_stacks(stacks, ranks)
            for label, path, nbytes in (
                (f"one log, {args.noise_lines} lines/rank", log, size),
                ("a py-spy text file per rank", stacks, stack_bytes),
            ):
                elapsed, peak, report = run_doctor(path)
                finding = report["findings"][0] if report["findings"] else {}
                said = f"{finding.get('cause')}: ranks {format_ranks(finding.get('ranks', []))} made it, "
                said += f"{format_ranks(finding.get('absent_ranks', []))} did not"
                print(f"{ranks:>6} {label:<28} {nbytes / 2**20:>9.1f} {elapsed:>7.2f} {peak:>9.0f}  {said}")
            log.unlink()


if __name__ == "__main__":
    main()
