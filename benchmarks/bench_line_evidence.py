"""What line evidence costs (python benchmarks/bench_line_evidence.py).

Every playbook repro and the line-evidence test scripts, preflight run side by side
with and without ``--line-evidence`` (2 gloo ranks, --stall-timeout 6), each pair in
one go: the wall time of each, their ratio, whether a replay ran (only where the
source alone was not certain why the ranks parted) and the cause each reports.
The target (issue 23): a replay adds under 30% to the wall time of a dry run that
hangs.
"""

from __future__ import annotations

import argparse
import statistics

from preflight_runs import REPO, timed_preflight

SCRIPTS = [
    *sorted((REPO / "playbooks").glob("*/repro.py")),
    *(
        REPO / "tests" / "scripts" / name
        for name in (
            "eval_decode_error.py",
            "helper_return_on_data.py",
            "swallowed_elsewhere/train.py",
            "skip_step_on_nonfinite_loss.py",
            "per_rank_batch_count.py",
        )
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="a substring of the scripts to run")
    args = parser.parse_args()
    print(f"{'script':<52} {'verdict':<10} {'off s':>6} {'on s':>6} {'ratio':>6}  replay  cause")
    ratios = []
    for script in SCRIPTS:
        if args.only and args.only not in str(script):
            continue
        off, _ = timed_preflight(script, "--no-line-evidence", timeout=300)
        on, report = timed_preflight(script, "--line-evidence", timeout=300)
        findings = report.get("findings") or [{}]
        first = findings[0] if isinstance(findings, list) else {}
        evidence = "\n".join(first.get("evidence", []))
        replayed = "line evidence" in evidence
        name = str(script.relative_to(REPO))
        verdict = str(report.get("verdict"))
        said = "yes" if replayed else "no"
        print(
            f"{name:<52} {verdict:<10} {off:6.1f} {on:6.1f} {on / off:6.2f}  {said:<6}  {first.get('cause')}"
        )
        if replayed and verdict == "hang":
            ratios.append(on / off)
    if ratios:
        print(
            f"\nhangs with a replay: {len(ratios)}; wall time with line evidence / without: "
            f"median {statistics.median(ratios):.2f}, max {max(ratios):.2f}"
        )


if __name__ == "__main__":
    main()
