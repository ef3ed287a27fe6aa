"""The probe's all_reduce figures next to a plain torch all_reduce loop, same sizes, same
timing method, in one run (python benchmarks/bench_probe.py): the probe must measure the
transport and add nothing of its own."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from workers import run_worker

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def plain(ranks: int, max_bytes: int, repeats: int) -> dict[int, float]:
    result = run_worker("allreduce_sizes.py", ranks, str(max_bytes), str(repeats), "10")
    return {int(k): v for k, v in result.items()}


def probed(ranks: int, max_bytes: int, repeats: int) -> dict[int, dict[str, float]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncclcheck",
            "probe",
            "--json",
            f"--nproc-per-node={ranks}",
            f"--max-bytes={max_bytes}",
            f"--repeats={repeats}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=REPO,
    )
    report = json.loads(done.stdout)
    return {row["bytes"]: row for row in report["summary"]["performance"] if row["op"] == "all_reduce"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for ranks in (2, 4):
        base = plain(ranks, args.max_bytes, args.repeats)
        probe = probed(ranks, args.max_bytes, args.repeats)
        print(
            f"all_reduce, gloo, {ranks} ranks (time of the slowest rank, median of {args.repeats} x 10 calls)"
        )
        print(f"  {'bytes':>9}{'plain us':>11}{'probe us':>11}{'probe/plain':>13}{'busbw GB/s':>12}")
        for size in sorted(base):
            row = probe.get(size)
            if row is None:
                continue
            print(
                f"  {size:>9}{base[size]:>11.1f}{row['time_us']:>11.1f}"
                f"{row['time_us'] / base[size]:>12.2f}x{row['busbw_GBps']:>12.4f}"
            )


if __name__ == "__main__":
    main()
