"""preflight's figures, measured side by side in one run (python benchmarks/bench_preflight.py).

1. The recorder's cost per collective: the same loop of small gloo all_reduces on
   2 ranks, plain, under ncclcheck's recorder, and under
   TORCH_DISTRIBUTED_DEBUG=DETAIL; runs interleaved, medians compared.
2. Time to a verdict on a hanging reproducer with 4 ranks, next to the backend
   timeouts it replaces (gloo 30 min, NCCL 10 min by default).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOOP = HERE / "allreduce_loop.py"


def run_loop(mode: str, iterations: int) -> float:
    env = {**os.environ, "BENCH_MODE": mode, "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    if mode == "recorder":
        trace_dir = tempfile.mkdtemp(prefix="ncclcheck-bench-")
        env.update(NCCLCHECK_TRACE_DIR=trace_dir, NCCLCHECK_PROBE_TIMEOUT="0")
        argv = [*launcher, "--module", "ncclcheck.record.bootstrap", str(LOOP), str(iterations)]
    else:
        if mode == "detail":
            env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        argv = [*launcher, str(LOOP), str(iterations)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return float(json.loads(line[len("RESULT ") :])["us_per_call"])


def recorder_overhead(repeats: int, iterations: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {"plain": [], "recorder": [], "detail": []}
    for _ in range(repeats):  # interleaved, so drift on the machine hits all three alike
        for mode in samples:
            samples[mode].append(run_loop(mode, iterations))
    return {mode: statistics.median(values) for mode, values in samples.items()}


def time_to_verdict() -> tuple[float, dict[str, object]]:
    script = REPO / "playbooks" / "uneven-eval-batches" / "repro.py"
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncclcheck",
            "preflight",
            "--json",
            "--nproc-per-node=4",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - start
    report = json.loads(done.stdout)
    return elapsed, report["findings"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3000)
    args = parser.parse_args()

    medians = recorder_overhead(args.repeats, args.iterations)
    plain = medians["plain"]
    print(f"small gloo all_reduce, 2 ranks, median of {args.repeats} runs x {args.iterations} calls")
    print(f"  {'mode':<34}{'us/call':>9}{'vs plain':>10}")
    for mode, label in (
        ("plain", "plain torch.distributed"),
        ("recorder", "ncclcheck recorder"),
        ("detail", "TORCH_DISTRIBUTED_DEBUG=DETAIL"),
    ):
        print(f"  {label:<34}{medians[mode]:>9.1f}{medians[mode] / plain:>9.2f}x")

    elapsed, finding = time_to_verdict()
    print("\ntime to a verdict, uneven-eval-batches repro, 4 ranks (stall timeout 15 s)")
    print(f"  preflight: {elapsed:.1f} s -> {finding['cause']} at {finding['site']}")
    for backend, timeout_s in (("gloo default timeout", 1800), ("NCCL default timeout", 600)):
        print(f"  {backend}: {timeout_s} s ({timeout_s / elapsed:.0f}x longer)")


if __name__ == "__main__":
    main()
