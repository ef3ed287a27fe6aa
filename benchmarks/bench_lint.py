"""lint's speed and findings over large real trees (python benchmarks/bench_lint.py).

Reads every Python file of a few installed packages (torch.distributed, accelerate,
torch.nn, and where installed lightning.pytorch and the transformers Trainer) with
ncclcheck lint, imports followed, and prints lines per second, the time 100k lines
take and the findings (code that trains correctly: each one is a false alarm or a
latent bug to read); each tree is read three times, the best run counts (the first
also warms the file cache).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import accelerate
import torch

from ncclcheck.commands.lint import run_lint


def _installed(module: str, inside: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / inside


def main() -> None:
    trees = [
        Path(torch.__file__).parent / "distributed",
        Path(accelerate.__file__).parent,
        Path(torch.__file__).parent / "nn",
        _installed("lightning", "pytorch"),
        _installed("transformers", "trainer.py"),
    ]
    header = f"  {'tree':<28}{'files':>7}{'lines':>9}{'best s':>8}{'lines/s':>10}"
    print(header + f"{'s per 100k':>12}{'errors':>8}{'warnings':>10}")
    for tree in trees:
        if tree is None or not tree.exists():
            continue
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            findings, linter = run_lint([tree])
            best = min(best, time.perf_counter() - start)
        rate = linter.lines_checked / best
        name = "/".join(tree.parts[-2:])
        errors = sum(f.severity == "error" for f in findings)
        print(
            f"  {name:<28}{linter.files_checked:>7}{linter.lines_checked:>9}{best:>8.2f}{rate:>10.0f}"
            f"{100_000 / rate:>12.2f}{errors:>8}{len(findings) - errors:>10}"
        )


if __name__ == "__main__":
    main()
