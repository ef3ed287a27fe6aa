"""lint's speed over large real trees (python benchmarks/bench_lint.py).

Reads every Python file of a few installed packages (torch.distributed, accelerate,
torch.nn) with ncclcheck lint, imports followed, and prints lines per second and
the time 100k lines take; each tree is read three times, the best run counts
(the first also warms the file cache).
"""

from __future__ import annotations

import time
from pathlib import Path

import accelerate
import torch

from ncclcheck.lint import run_lint


def main() -> None:
    trees = [
        Path(torch.__file__).parent / "distributed",
        Path(accelerate.__file__).parent,
        Path(torch.__file__).parent / "nn",
    ]
    header = f"  {'tree':<28}{'files':>7}{'lines':>9}{'best s':>8}{'lines/s':>10}"
    print(header + f"{'s per 100k':>12}{'findings':>10}")
    for tree in trees:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            findings, linter = run_lint([tree])
            best = min(best, time.perf_counter() - start)
        rate = linter.lines_checked / best
        name = "/".join(tree.parts[-2:])
        print(
            f"  {name:<28}{linter.files_checked:>7}{linter.lines_checked:>9}{best:>8.2f}{rate:>10.0f}"
            f"{100_000 / rate:>12.2f}{len(findings):>10}"
        )


if __name__ == "__main__":
    main()
