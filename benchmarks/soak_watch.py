"""watch on healthy jobs for minutes on end: no alarm (python benchmarks/soak_watch.py).

Each healthy shape of benchmarks/bench_healthy.py (DDP mostly in backward, a job bound
by its DataLoader, a long evaluation, a long checkpoint save, a job beside CPU-bound
neighbours) runs for MINUTES (10 by default) under ``ncclcheck watch --after 10
--every 2``. A healthy job must end with watch's exit 0 and "no hang seen"; a hang
report is an alarm. Not part of ``make test``: it takes MINUTES per shape.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_healthy import SCRIPTS, SHAPES, Shape, busy_loop  # noqa: E402

from ncclcheck.launch.proctree import kill_tree  # noqa: E402


def soak(shape: Shape, minutes: float) -> tuple[int, str, float]:
    """watch's exit code, its last line and the seconds it ran, on ``shape`` for ``minutes``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RUN_S": str(int(minutes * 60)), **dict(shape.env)}
    load = [busy_loop() for _ in range(shape.load)]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as out:
        watch = subprocess.Popen(
            [
                sys.executable, "-m", "ncclcheck", "watch", "--after", "10", "--every", "2",
                "--out", out, "--nproc-per-node", "2", str(SCRIPTS / shape.script),
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            _, err = watch.communicate(timeout=minutes * 60 + 300)
        finally:
            kill_tree(watch.pid)
            for proc in load:
                kill_tree(proc.pid)
                proc.wait(timeout=30)
    said = [line for line in err.splitlines() if line.startswith("ncclcheck watch:")]
    return watch.returncode, said[-1] if said else err[-300:], time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--shape", action="append", choices=[s.name for s in SHAPES])
    args = parser.parse_args()
    print(f"watch --after 10 --every 2 on healthy 2-rank gloo jobs, {args.minutes:g} min each")
    alarms = 0
    for shape in SHAPES:
        if args.shape and shape.name not in args.shape:
            continue
        code, last, seconds = soak(shape, args.minutes)
        alarm = code == 1
        alarms += alarm
        print(
            f"{shape.name:<20} exit {code}  {seconds:6.0f} s  {'ALARM ' if alarm else ''}{last}", flush=True
        )
    print(f"alarms on healthy jobs: {alarms}")


if __name__ == "__main__":
    main()
