"""One preflight run as the benchmarks time it: the CLI in a subprocess from the
repository root, --json, the wall time of the whole command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed_preflight(script: Path, *flags: str, timeout: float = 1800) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncclcheck",
            "preflight",
            "--json",
            "--stall-timeout",
            "6",
            *flags,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
    return time.perf_counter() - start, json.loads(done.stdout) if done.stdout.strip() else {}
