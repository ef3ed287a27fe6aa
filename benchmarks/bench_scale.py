"""Scale on this machine (python benchmarks/bench_scale.py): a dry run of 10k and 100k
collectives per rank (trace size, the ranks' and the analysis' peak memory), the
analysis alone on written traces of 10k to 1M calls per rank (streamed, next to
holding every call), and preflight of a 16-rank job. doctor at 4-64 ranks is
bench_doctor.py."""

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


# Trace lines in the recorder's format: a training loop of two call sites, and a
# divergence at the very end (rank 1 calls from another line), so nothing is skipped.
WRITE_TRACE = """
import json, sys
folder, rank, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(f"{folder}/rank-{rank:05d}.jsonl", "w") as out:
    out.write(json.dumps({"t": "hello", "rank": rank, "world_size": 2, "pid": rank, "host": "h"}) + "\\n")
    out.write(json.dumps({"t": "init", "backend": "gloo", "world_size": 2}) + "\\n")
    for site, line in enumerate((10, 11, 30)):  # each call site's fields, once
        out.write(
            f'{{"t":"site","id":{site},"op":"all_reduce","group":"0","group_ranks":[0,1],"shapes":[[1024]],'
            f'"dtypes":["float32"],"device":"cpu","async":false,"phase":"train","src":"python",'
            f'"stack":[["train.py",{line},"step"]]}}\\n'
        )
    for n in range(1, calls + 1):
        site = 2 if n == calls and rank == 1 else n % 2
        out.write(
            f'{{"t":"call","n":{n},"seq":{n - 1},"ns":{n}000000000,'
            f'"pos":{{"loader":"train","pass":0,"batch":{n % 500},"role":"train"}},"site":{site}}}\\n'
        )
"""
# The same traces held whole (every call, one object each) and aligned, as before streaming.
WHOLE = (
    "import sys; from pathlib import Path; from ncclcheck.evidence.traces import load_rank_trace; "
    "from ncclcheck.evidence.align import divergences; "
    "files = sorted(Path(sys.argv[1]).glob('rank-*.jsonl')); "
    "h = {r: load_rank_trace(p).calls for r, p in enumerate(files)}; "
    "print(len(divergences(h)))"
)


def analysis_alone(calls: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as folder:
        for rank in (0, 1):
            subprocess.run([sys.executable, "-c", WRITE_TRACE, folder, str(rank), str(calls)], check=True)
        size = sum(p.stat().st_size for p in Path(folder).glob("rank-*.jsonl")) / 2 / 2**20
        _code, streamed = peak_of(
            [sys.executable, "-m", "ncclcheck", "preflight", "--json", "--from", folder]
        )
        _code, whole = peak_of([sys.executable, "-c", WHOLE, folder])
        print(
            f"  {calls:>8} calls/rank, trace {size:6.1f} MiB/rank: --from (streamed) peak RSS "
            f"{streamed:5.0f} MiB, every call held (load_rank_trace, no CLI loaded) {whole:5.0f} MiB"
        )
        return streamed, whole


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
    print("the analysis alone, on written traces of 2 ranks (a divergence at the last call)")
    sizes = (10_000, 100_000, 1_000_000)
    peaks = [analysis_alone(calls) for calls in sizes]
    more = 2 * (sizes[-1] - sizes[0])
    print(
        f"  growth over {more:,} more calls: streamed {peaks[-1][0] - peaks[0][0]:+.1f} MiB, "
        f"held {peaks[-1][1] - peaks[0][1]:+.1f} MiB"
    )
    sixteen_ranks()


if __name__ == "__main__":
    main()
