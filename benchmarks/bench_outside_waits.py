"""preflight on correct scripts whose rank 0 waits on something other than a rank (a
download's sleep, a slow pipe, a subprocess, its own compute, accelerate's
main_process_first) while the others wait in a barrier, at waits of 40 s and 90 s (90 s
is past the 60 s a busy quiet job used to be forgiven), and the same preparation with a
collective on rank 0 alone. Prints, per run, the verdict, the exit code, the wait the
report says and the ratio of preflight's whole time to the wait: what waiting with the
rank costs beyond the wait itself. Asserts nothing about time.

    python benchmarks/bench_outside_waits.py [--waits 40,90] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "scripts" / "outside_waits"

SHAPES = [
    ("download (sleep)", "rank0_prepares.py", {"PREPARE": "download"}),
    ("slow pipe", "rank0_prepares.py", {"PREPARE": "pipe"}),
    ("subprocess", "rank0_prepares.py", {"PREPARE": "subprocess"}),
    ("compute", "rank0_prepares.py", {"PREPARE": "compute"}),
    ("main_process_first", "main_process_first.py", {}),
    ("download, then rank 0 alone all_reduces (broken)", "rank0_prepares.py", {"ALSO_REDUCE": "1"}),
]


def run(label: str, script: str, env: dict[str, str], wait_s: int) -> dict[str, object]:
    argv = [
        sys.executable,
        "-m",
        "ncclcheck",
        "preflight",
        "--json",
        "--nproc-per-node=2",
        str(SCRIPTS / script),
    ]
    started = time.monotonic()
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **env, "PREPARE_S": str(wait_s)},
        timeout=900,
        check=False,
    )
    elapsed = time.monotonic() - started
    report = json.loads(done.stdout) if done.stdout.startswith("{") else {}
    said = [f for f in report.get("findings", []) if f["cause"] == "straggler" and f["severity"] == "warning"]
    errors = [f"{f['cause']} at {f['site']}" for f in report.get("findings", []) if f["severity"] == "error"]
    return {
        "shape": label,
        "wait_s": wait_s,
        "verdict": report.get("verdict", "?"),
        "exit": done.returncode,
        "warning": said[0]["message"].split(":", 1)[0] if said else "",
        "errors": ", ".join(errors),
        "elapsed_s": elapsed,
        "ratio": elapsed / wait_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waits", default="40,90")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    waits = [int(w) for w in args.waits.split(",")]
    plan = [(label, script, env, wait) for wait in waits for label, script, env in SHAPES]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda item: run(*item), plan))
    print("| shape | wait | verdict | exit | what it says | preflight's time | time / wait |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        said = row["errors"] or row["warning"]
        print(
            f"| {row['shape']} | {row['wait_s']} s | {row['verdict']} | {row['exit']} | {said} | "
            f"{row['elapsed_s']:.0f} s | {row['ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
