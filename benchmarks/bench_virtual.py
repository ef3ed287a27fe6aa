"""What a virtual world costs (python benchmarks/bench_virtual.py).

preflight on the rank-conditional-collective repro: a real 4-rank run under torchrun
(gloo), then ``--world-size 64, 256, 1024`` on the default subset of ranks, and
``--all-ranks`` at 64 and 256, all in one go on this machine; the wall time of each,
the ranks that ran and the time per rank. Targets (issue 24, a 2-core machine): 256
ranks on the default subset under 60 s, all 256 under 5 minutes.
"""

from __future__ import annotations

import argparse

from preflight_runs import REPO, timed_preflight

SCRIPT = REPO / "playbooks" / "rank-conditional-collective" / "repro.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="leave out --all-ranks at 256")
    args = parser.parse_args()
    runs = [
        ("real, 4 ranks (torchrun, gloo)", ["--nproc-per-node=4"]),
        ("virtual 64, default subset", ["--world-size=64"]),
        ("virtual 256, default subset", ["--world-size=256"]),
        ("virtual 1024, default subset", ["--world-size=1024"]),
        ("virtual 64, --all-ranks", ["--world-size=64", "--all-ranks"]),
    ]
    if not args.quick:
        runs.append(("virtual 256, --all-ranks", ["--world-size=256", "--all-ranks"]))
    print(f"{'run':<34}{'wall s':>8}{'ranks':>7}{'s/rank':>8}  verdict / cause")
    for name, flags in runs:
        wall, report = timed_preflight(SCRIPT, *flags)
        ranks = len(report.get("ranks") or [])  # type: ignore[arg-type]
        findings = report.get("findings") or [{}]
        cause = findings[0].get("cause") if isinstance(findings, list) else None  # type: ignore[union-attr]
        print(
            f"{name:<34}{wall:>8.1f}{ranks:>7}{wall / max(ranks, 1):>8.2f}  {report.get('verdict')} / {cause}"
        )


if __name__ == "__main__":
    main()
