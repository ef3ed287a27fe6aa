"""Scale on this machine (python benchmarks/bench_scale.py): a dry run of 10k and 100k
collectives per rank (trace size, the ranks' and the analysis' peak memory), and
preflight of a 16-rank job. doctor at 4-64 ranks is bench_doctor.py."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from workers import timed_preflight

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent

# A child that runs a command and reports its own children's peak memory (KiB).
PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True); "
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_of(argv: list[str]) -> tuple[int, float]:
    done = subprocess.run([sys.executable, "-c", PEAK, *argv], capture_output=True, text=True, check=True)
    code, kib = done.stdout.split()
    return int(code), int(kib) / 1024


def long_run(calls: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        traces = Path(folder) / "traces"
        wall, report = timed_preflight(
            "--trace-dir", str(traces), str(HERE / "many_collectives.py"), env={"CALLS": str(calls)}
        )
        log = (traces / "torchrun.log").read_text()
        peaks = [int(kib) / 1024 for kib in re.findall(r"PEAK rank \d+ (\d+)", log)]
        size = sum(p.stat().st_size for p in traces.glob("rank-*.jsonl")) / 2 / 2**20
        analyse = [sys.executable, "-m", "ncclcheck", "preflight", "--json", "--from", str(traces)]
        code, analysis = peak_of(analyse)
        print(
            f"  {calls:>7} calls/rank: {wall:6.1f} s, verdict {report['verdict']}, "
            f"trace {size:6.1f} MiB/rank, ranks' peak RSS {max(peaks):6.0f} MiB, "
            f"analysis (--from) peak RSS {analysis:6.0f} MiB (exit {code})"
        )


def sixteen_ranks() -> None:
    script = REPO / "playbooks" / "rank-conditional-collective" / "repro.py"
    wall, report = timed_preflight("--nproc-per-node=16", str(script))
    finding = report["findings"][0]
    print(
        f"  preflight, 16 ranks, rank-conditional-collective repro: {wall:.1f} s, "
        f"{finding['cause']} at {finding['site']}, ranks {finding['ranks']} "
        f"vs {len(finding['absent_ranks'])} absent"
    )


def main() -> None:
    print("a long dry run: small gloo all_reduces in one loop, 2 ranks")
    for calls in (10_000, 100_000):
        long_run(calls)
    sixteen_ranks()


if __name__ == "__main__":
    main()
