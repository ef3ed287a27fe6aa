"""doctor's wall time on hung jobs of 4, 8, 16, 32 and 64 ranks (python benchmarks/bench_doctor.py).

Each job is the rank-conditional-collective reproducer under torchrun with gloo on
this machine: rank 0 waits in an all_reduce, the others in a barrier. Once it
hangs, ``ncclcheck doctor --json --pid <agent>`` runs several times; the figure is
the median wall time of the whole command (interpreter start, discovery, one
py-spy dump per rank in parallel, merge, source reading, diagnosis), then the
growth per added rank from a least-squares line through the sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ncclcheck.launch.proctree import kill_tree  # noqa: E402

SCRIPT = REPO / "playbooks" / "rank-conditional-collective" / "repro.py"


def doctor(pid: int, interval: float = 0.0) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    done = subprocess.run(
        # 0: one look; doctor's default (1) adds a second look that far apart: one more dump
        [
            sys.executable,
            "-m",
            "ncclcheck",
            "doctor",
            "--json",
            "--interval",
            str(interval),
            "--pid",
            str(pid),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - start
    return elapsed, json.loads(done.stdout) if done.stdout.strip() else {}


def hung_job(ranks: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "REPRO_TIMEOUT_S": "900", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(SCRIPT),
        ],
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_hang(agent: subprocess.Popen[bytes], ranks: int, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        time.sleep(2)
        children = psutil.Process(agent.pid).children()
        if len(children) < ranks:
            continue
        _elapsed, report = doctor(agent.pid)
        states = [r.get("state") for r in report.get("ranks", [])]  # type: ignore[union-attr]
        if len(states) == ranks and all(s == "in-collective" for s in states):
            return
    raise SystemExit(f"the {ranks}-rank job did not settle into its hang within {bound_s:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--interval", type=float, default=0.0, help="doctor's --interval (0: one look; its default is 1)"
    )
    args = parser.parse_args()
    print(
        f"ncclcheck doctor --interval {args.interval:g} on a hung gloo job, {os.cpu_count()} CPUs, "
        f"median of {args.repeats} runs"
    )
    print(f"  {'ranks':>5}  {'wall s':>7}  {'min s':>6}  {'max s':>6}  finding")
    points: list[tuple[int, float]] = []
    for ranks in args.sizes:
        agent = hung_job(ranks)
        try:
            wait_for_hang(agent, ranks, bound_s=60 + 10 * ranks)
            times = []
            report: dict[str, object] = {}
            for _ in range(args.repeats):
                elapsed, report = doctor(agent.pid, args.interval)
                times.append(elapsed)
        finally:
            kill_tree(agent.pid)
            agent.wait(timeout=60)
        finding = report["findings"][0]  # type: ignore[index]
        median = statistics.median(times)
        points.append((ranks, median))
        print(
            f"  {ranks:>5}  {median:>7.2f}  {min(times):>6.2f}  {max(times):>6.2f}  "
            f"{finding['cause']} at {finding['site']}"  # type: ignore[index]
        )
    if len(points) > 1:
        mean_x = statistics.fmean(x for x, _ in points)
        mean_y = statistics.fmean(y for _, y in points)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
            (x - mean_x) ** 2 for x, _ in points
        )
        print(f"  growth: {slope * 1000:.0f} ms per added rank (least squares over {len(points)} sizes)")


if __name__ == "__main__":
    main()
