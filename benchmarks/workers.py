"""What the benchmark scripts share: run a worker script on N local ranks through
torch.distributed.run and read the RESULT line rank 0 prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run_worker(script: str, ranks: int, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(HERE / script),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent), **(env or {})},
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def timed_preflight(*args: str, env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """``ncclcheck preflight --json ARGS`` from the repository root: (wall seconds, report)."""
    import time

    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "preflight", "--json", *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=HERE.parent,
        env={**os.environ, **(env or {})},
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return time.perf_counter() - start, report
