"""lint's speed, recall and false alarms (python benchmarks/bench_lint.py).

Speed and false alarms: every Python file of a few installed packages
(torch.distributed, accelerate, torch.nn, and where installed lightning.pytorch and
the transformers Trainer) and the training scripts they ship as examples and tests
(accelerate's test_utils/scripts, Lightning's demos), code that trains correctly:
each finding is a false alarm or a latent bug to read. Recall: the playbooks'
repros and the realistic broken scripts of tests/scripts/real/, each broken on
purpose (a file with no finding is a miss), beside their fixed twins (any error is a
false alarm). Prints per tree: files, lines, best time, lines per second, seconds
per 100k lines, errors, warnings, and for the broken trees the files flagged. Each
tree is read three times, the best run counts (the first also warms the file cache).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from pathlib import Path

import accelerate
import torch

from ncclcheck.lint import run_lint


def _installed(module: str, inside: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / inside


REPO = Path(__file__).resolve().parent.parent
REAL = REPO / "tests" / "scripts" / "real"


def main() -> None:
    clean: list[tuple[str, Sequence[Path | None]]] = [
        ("torch/distributed", [Path(torch.__file__).parent / "distributed"]),
        ("accelerate", [Path(accelerate.__file__).parent]),
        ("torch/nn", [Path(torch.__file__).parent / "nn"]),
        ("lightning/pytorch", [_installed("lightning", "pytorch")]),
        ("transformers/trainer.py", [_installed("transformers", "trainer.py")]),
        ("accelerate's scripts", [Path(accelerate.__file__).parent / "test_utils" / "scripts"]),
        ("lightning's demos", [_installed("lightning", "pytorch/demos")]),
        ("playbooks' fixed.py", sorted((REPO / "playbooks").glob("*/fixed.py"))),
        ("real scripts, fixed", sorted(REAL.glob("*_fixed.py"))),
    ]
    broken: list[tuple[str, Sequence[Path | None]]] = [
        ("playbooks' repro.py", sorted((REPO / "playbooks").glob("*/repro.py"))),
        ("real scripts, broken", sorted(p for p in REAL.glob("*.py") if not p.stem.endswith("_fixed"))),
    ]
    header = f"  {'tree':<26}{'files':>7}{'lines':>9}{'best s':>8}{'lines/s':>10}"
    print(header + f"{'s per 100k':>12}{'errors':>8}{'warnings':>10}  flagged")
    for name, paths in [*clean, *broken]:
        present = [p for p in paths if p is not None and p.exists()]
        if not present:
            continue
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            findings, linter = run_lint(present)
            best = min(best, time.perf_counter() - start)
        rate = linter.lines_checked / best
        errors = sum(f.severity == "error" for f in findings)
        flagged = ""
        if (name, paths) in broken:
            hit = {Path(f.location.checked_path or f.location.path).resolve() for f in findings if f.location}
            flagged = f"{sum(p.resolve() in hit for p in present)}/{len(present)}"
        print(
            f"  {name:<26}{linter.files_checked:>7}{linter.lines_checked:>9}{best:>8.2f}{rate:>10.0f}"
            f"{100_000 / rate:>12.2f}{errors:>8}{len(findings) - errors:>10}  {flagged}"
        )


if __name__ == "__main__":
    main()
