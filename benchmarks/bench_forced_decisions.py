"""What forcing a decision on a rank's own value costs (python benchmarks/bench_forced_decisions.py).

tests/scripts/patience_on_local_loss.py: early stopping on each rank's own validation loss,
whose patience runs out on no rank within a dry run. preflight with its defaults (the
decision forced on rank 1 in a run of its own: the hang found, exit 1) and with
--no-force-decisions (the dry run alone: the decision listed as not checked, exit 5), side
by side in one go; then the fixed twin (decides on the all-reduced loss: nothing to force)
both ways. The wall time of each, their ratios and the verdicts. The target (issue 48): at
most one more short dry run per decision, so the broken script's ratio at most about 2,
and the twin's about 1.
"""

from __future__ import annotations

from preflight_runs import REPO, timed_preflight

SCRIPTS = REPO / "tests" / "scripts"


def main() -> None:
    rows = []
    for name in ("patience_on_local_loss.py", "patience_on_reduced_loss.py"):
        forced, forced_report = timed_preflight(SCRIPTS / name)
        plain, plain_report = timed_preflight(SCRIPTS / name, "--no-force-decisions")
        rows.append((name, forced, forced_report, plain, plain_report))
    print(f"{'script':<30} {'forced s':>9} {'verdict':<8} {'plain s':>8} {'verdict':<8} {'ratio':>6}")
    for name, forced, forced_report, plain, plain_report in rows:
        print(
            f"{name:<30} {forced:>9.1f} {forced_report.get('verdict')!s:<8} {plain:>8.1f} "
            f"{plain_report.get('verdict')!s:<8} {forced / plain:>6.2f}"
        )
        summary = forced_report.get("summary") or {}
        assert isinstance(summary, dict)
        for line in summary.get("forced", []):
            print(f"    forced: {str(line)[:150]}")


if __name__ == "__main__":
    main()
