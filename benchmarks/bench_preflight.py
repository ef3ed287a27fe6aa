"""preflight's figures, measured side by side in one run (python benchmarks/bench_preflight.py).

1. The recorder's cost per collective: the same loop of small gloo all_reduces on
   2 ranks, plain, under ncclcheck's recorder, and under
   TORCH_DISTRIBUTED_DEBUG=DETAIL; runs interleaved, medians compared.
2. Time to a verdict on a hanging reproducer with 4 ranks, next to the backend
   timeouts it replaces (gloo 30 min, NCCL 10 min by default).
3. --warm-start against torchrun: the machine's busy CPU-seconds (/proc/stat, every
   process the dry run starts, the killed ones included) and the wall time of a
   2-rank dry run of a playbook's fixed.py and repro.py, the two launches
   alternating; medians and their ratio. On an idle machine: another load adds to it.
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

from workers import timed_preflight

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LOOP = HERE / "allreduce_loop.py"


def run_loop(mode: str, iterations: int, backend: str = "gloo", ranks: int = 2) -> dict[str, float]:
    env = {**os.environ, "BENCH_MODE": mode, "OMP_NUM_THREADS": "1", "BENCH_BACKEND": backend}
    if mode == "detail":
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if mode == "flight_recorder":
        env["TORCH_FR_BUFFER_SIZE"] = "20000"  # PyTorch's own record of every collective
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={ranks}",
        str(LOOP),
        str(iterations),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=True)
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return {k: float(v) for k, v in json.loads(line[len("RESULT ") :]).items()}


def recorder_overhead(repeats: int, iterations: int, backend: str, ranks: int) -> dict[str, list[float]]:
    """Per-call microseconds: plain and recorder from the same processes (alternating
    blocks), and plain, DETAIL and Flight Recorder runs one after the other, repeated."""
    samples: dict[str, list[float]] = {
        "plain": [],
        "recorder": [],
        "paired_ratio": [],
        "python_ratio": [],
        "python_cpu_us": [],
        "fast_path": [],
        "spin10_ratio": [],
        "wrapper_ratio": [],
        "write_ratio": [],
        "cpu_us": [],
        "work_in_loop_us": [],
        "work_alone_us": [],
        "detail_plain": [],
        "detail": [],
        "flight_recorder": [],
    }
    for _ in range(repeats):
        both = run_loop("interleaved", iterations, backend, ranks)
        for key in (
            "plain",
            "recorder",
            "paired_ratio",
            "python_ratio",
            "python_cpu_us",
            "fast_path",
            "spin10_ratio",
            "wrapper_ratio",
            "write_ratio",
            "cpu_us",
            "work_in_loop_us",
            "work_alone_us",
        ):
            samples[key].append(both[key])
        samples["detail_plain"].append(run_loop("plain", iterations, backend, ranks)["plain"])
        samples["detail"].append(run_loop("detail", iterations, backend, ranks)["detail"])
        samples["flight_recorder"].append(
            run_loop("flight_recorder", iterations, backend, ranks)["flight_recorder"]
        )
    return samples


def time_to_verdict() -> tuple[float, dict[str, object]]:
    script = REPO / "playbooks" / "uneven-eval-batches" / "repro.py"
    elapsed, report = timed_preflight("--nproc-per-node=4", str(script))
    return elapsed, report["findings"][0]


def busy_cpu_s() -> float:
    """The machine's CPU-seconds not idle since boot (user, nice, system, irq, softirq, steal)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def warm_start_against_torchrun(repeats: int) -> dict[str, dict[str, list[float]]]:
    """(script -> launch -> [cpu_s, ...] and [wall_s, ...]) over ``repeats`` alternating runs."""
    scripts = {
        "fixed.py": REPO / "playbooks" / "rank-conditional-collective" / "fixed.py",
        "repro.py": REPO / "playbooks" / "rank-conditional-collective" / "repro.py",
    }
    samples: dict[str, dict[str, list[float]]] = {}
    for name, script in scripts.items():
        for _ in range(repeats):
            for launch in ("--no-warm-start", "--warm-start"):
                cpu_before, wall_before = busy_cpu_s(), time.monotonic()
                argv = [sys.executable, "-m", "ncclcheck", "preflight", launch, "--nproc-per-node=2"]
                subprocess.run(
                    [*argv, str(script)],
                    capture_output=True,
                    check=False,
                    cwd=REPO,
                    timeout=600,
                )
                wall = time.monotonic() - wall_before
                cpu = busy_cpu_s() - cpu_before
                runs = samples.setdefault(f"{name} {launch}", {"cpu": [], "wall": []})
                runs["cpu"].append(cpu)
                runs["wall"].append(wall)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--nproc", type=int, default=2, help="ranks (nccl: one GPU each)")
    parser.add_argument("--no-verdict", action="store_true", help="skip the time-to-verdict run")
    parser.add_argument("--warm-repeats", type=int, default=3, help="runs of each launch in part 3 (0: skip)")
    args = parser.parse_args()

    samples = recorder_overhead(args.repeats, args.iterations, args.backend, args.nproc)
    median = {k: statistics.median(v) for k, v in samples.items()}
    ratios = samples["paired_ratio"]
    print(
        f"small {args.backend} all_reduce, {args.nproc} rank(s), "
        f"{args.repeats} runs x {args.iterations} calls "
        f"(plain and recorded calls alternate in ABBA blocks of 20 in the same processes; "
        f"ratio = median of neighbouring blocks)"
    )
    print(f"  {'mode':<34}{'us/call':>9}{'vs plain':>10}")
    print(f"  {'plain torch.distributed':<34}{median['plain']:>9.1f}{1:>9.2f}x")
    fast = "C fast path" if min(samples["fast_path"]) == 1 else "NOT BUILT: Python"
    print(
        f"  {'ncclcheck recorder (' + fast + ')':<34}{median['recorder']:>9.1f}"
        f"{statistics.median(ratios):>9.2f}x   (per run: " + ", ".join(f"{r:.2f}" for r in ratios) + ")"
    )
    python_ratios = samples["python_ratio"]
    print(
        f"  {'the same recorder in Python alone':<34}{'':>9}{statistics.median(python_ratios):>9.2f}x"
        "   (per run: " + ", ".join(f"{r:.2f}" for r in python_ratios) + ")"
    )
    print(
        f"  {'10 us busy-wait, then plain':<34}{'':>9}{median['spin10_ratio']:>9.2f}x"
        f"   (a wall-clock wait: what the latency adds when work costs no more)"
    )
    print(
        f"  {'empty Python wrapper (no record)':<34}{'':>9}{median['wrapper_ratio']:>9.2f}x"
        f"   (the floor of any recorder written in Python)"
    )
    print(
        f"  {'one trace-line write, then plain':<34}{'':>9}{median['write_ratio']:>9.2f}x"
        f"   (a write(2) per call; the recorder stores into a mapping instead)"
    )
    print(
        f"  {'recorder work alone (no network)':<34}{median['cpu_us']:>9.1f}"
        f"{median['cpu_us'] / median['plain']:>9.2f}x   (around a collective that returns at once; "
        f"Python alone: {median['python_cpu_us']:.1f} us)"
    )
    print(
        f"  {'Python recorder work, timed inside:':<34}{median['work_in_loop_us']:>9.1f}"
        f"{median['work_in_loop_us'] / median['plain']:>9.2f}x   (median per call in the loop; "
        f"{median['work_alone_us']:.1f} us alone)"
    )
    detail_ratio = median["detail"] / median["detail_plain"]
    print(
        f"  {'TORCH_DISTRIBUTED_DEBUG=DETAIL':<34}{median['detail']:>9.1f}{detail_ratio:>9.2f}x"
        f"   (vs separate plain runs: {median['detail_plain']:.1f} us)"
    )
    fr_ratio = median["flight_recorder"] / median["detail_plain"]
    print(
        f"  {'Flight Recorder (TORCH_FR_BUFFER_SIZE)':<34}{median['flight_recorder']:>9.1f}{fr_ratio:>9.2f}x"
        f"   (vs the same separate plain runs)"
    )

    if not args.no_verdict:
        elapsed, finding = time_to_verdict()
        print("\ntime to a verdict, uneven-eval-batches repro, 4 ranks (stall timeout 15 s)")
        print(f"  preflight: {elapsed:.1f} s -> {finding['cause']} at {finding['site']}")
        for backend, timeout_s in (("gloo default timeout", 1800), ("NCCL default timeout", 600)):
            print(f"  {backend}: {timeout_s} s ({timeout_s / elapsed:.0f}x longer)")

    if args.warm_repeats:
        warm = warm_start_against_torchrun(args.warm_repeats)
        print(
            f"\n--warm-start against torchrun, rank-conditional-collective, 2 ranks, {args.warm_repeats} "
            "alternating runs each (busy CPU-s of the whole machine, medians)"
        )
        for name in ("fixed.py", "repro.py"):
            cold, hot = warm[f"{name} --no-warm-start"], warm[f"{name} --warm-start"]
            cold_cpu, hot_cpu = statistics.median(cold["cpu"]), statistics.median(hot["cpu"])
            print(
                f"  {name:<9} torchrun {cold_cpu:5.1f} CPU-s {statistics.median(cold['wall']):5.1f} s wall | "
                f"--warm-start {hot_cpu:5.1f} CPU-s {statistics.median(hot['wall']):5.1f} s wall | "
                f"CPU ratio {hot_cpu / cold_cpu:.2f}"
            )


if __name__ == "__main__":
    main()
