"""Time to a verdict on a hang whose records already disagree (python benchmarks/bench_verdict.py).

The 4-rank uneven-eval-batches and rank-conditional-collective repros, preflight run
side by side in one go: as before this round (records that disagree were read only
after the full --stall-timeout of quiet, 15 s) and now (after a 2 s grace), each
with its floor: the seconds from the start until the last record any rank wrote,
that is until the ranks reached the calls they wait in. Everything after the floor
is preflight's own: the wait, the stacks, the diagnosis. The target (issue 25):
at most half of the time before, under 12 s here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from preflight_runs import REPO

from ncclcheck.commands.preflight import run_preflight
from ncclcheck.launch.torchrun import TorchrunOptions
from ncclcheck.settings import DryRunSettings

REPROS = ["uneven-eval-batches", "rank-conditional-collective"]


def last_record_at(folder: Path) -> float:
    """The wall-clock time of the last record any rank wrote."""
    latest = 0.0
    for path in folder.glob("rank-*.jsonl"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "ns" in record:
                latest = max(latest, record["ns"] / 1e9)
            elif isinstance(record.get("time"), float):
                latest = max(latest, record["time"])
    return latest


def timed(script: Path, settings: DryRunSettings, nproc: int) -> tuple[float, float, str, str]:
    with tempfile.TemporaryDirectory() as folder:
        started = time.time()
        torchrun = TorchrunOptions(nproc_per_node=nproc)
        outcome = run_preflight(str(script), [], torchrun, settings, Path(folder))
        wall = time.time() - started
        floor = last_record_at(Path(folder)) - started
    report = outcome.report
    cause = report.findings[0].cause if report.findings else "-"
    return wall, floor, report.verdict.value, cause


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each, the median is shown")
    parser.add_argument("--nproc", type=int, default=4)
    args = parser.parse_args()
    now = DryRunSettings(line_evidence=False)  # a replay is bench_line_evidence's to time
    before = replace(now, disagree_grace=now.stall_timeout)
    print(f"{'repro':<30} {'before s':>9} {'now s':>7} {'ratio':>6} {'floor s':>8}  verdict  cause")
    for name in REPROS:
        script = REPO / "playbooks" / name / "repro.py"
        runs = {"before": [], "now": []}  # type: dict[str, list[tuple[float, float, str, str]]]
        for _ in range(args.repeat):
            for label, settings in (("before", before), ("now", now)):
                runs[label].append(timed(script, settings, args.nproc))
        old = statistics.median(run[0] for run in runs["before"])
        new = statistics.median(run[0] for run in runs["now"])
        floor = statistics.median(run[1] for run in runs["now"])
        verdicts = {run[2] for run in runs["before"] + runs["now"]}
        causes = {run[3] for run in runs["before"] + runs["now"]}
        print(
            f"{name:<30} {old:>9.1f} {new:>7.1f} {new / old:>6.2f} {floor:>8.1f}  "
            f"{'/'.join(sorted(verdicts)):<8} {'/'.join(sorted(causes))}"
        )


if __name__ == "__main__":
    main()
