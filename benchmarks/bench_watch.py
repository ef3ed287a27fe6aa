"""watch's cost on a healthy training loop (python benchmarks/bench_watch.py).

The same 2-rank gloo job (tests/scripts/training_still_running.py: matmuls and a
gradient-sized all_reduce, step after step for RUN_S seconds) runs under plain torchrun
and under ``ncclcheck watch`` at its default look interval (10 s) and at 2 s, the runs
interleaved; the figure is the steps the job made in its fixed time, as a ratio to
plain torchrun's (the median of the repeats). On this machine the job and watch share
2 cores: py-spy's looks take CPU the ranks would use.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "training_still_running.py"
STEPS = re.compile(r"steps done: (\d+)")


def steps(argv: list[str], run_s: float) -> int:
    env = {**os.environ, "RUN_S": str(run_s), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=run_s + 120, check=False
    )
    found = STEPS.findall(done.stdout + done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"{' '.join(argv[:6])}: exit {done.returncode}\n{(done.stdout + done.stderr)[-2000:]}"
        )
    return int(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-s", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(SCRIPT)]
    watched = {
        every: [
            sys.executable,
            "-m",
            "ncclcheck",
            "watch",
            "--every",
            every,
            "--nproc-per-node",
            "2",
            str(SCRIPT),
        ]
        for every in ("10", "2")
    }
    counts: dict[str, list[int]] = {"plain": [], **{f"watch --every {e}": [] for e in watched}}
    for _ in range(args.repeats):
        counts["plain"].append(steps(plain, args.run_s))
        for every, argv in watched.items():
            counts[f"watch --every {every}"].append(steps(argv, args.run_s))
    base = statistics.median(counts["plain"])
    print(f"steps in {args.run_s:g} s of a 2-rank gloo job, {os.cpu_count()} CPUs, median of {args.repeats}")
    for name, values in counts.items():
        median = statistics.median(values)
        each = ", ".join(map(str, values))
        print(f"  {name:<18} {median:>9.0f} steps  {median / base:6.3f} of plain  ({each})")


if __name__ == "__main__":
    main()
