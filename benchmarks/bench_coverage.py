"""What covering a long epoch's periodic actions costs a dry run (python benchmarks/bench_coverage.py).

tests/scripts/long_epoch_periodic.py: a 10,000-step epoch on 2 gloo ranks, a checkpoint
every 1,000 steps, an evaluation every 2,500, and an epoch end that saves and evaluates.
preflight with its defaults (periodic actions made to fire, record/firing.py; the epoch's
last batches run, record/fastforward.py) and with --no-fire-periodic --train-end-batches 0
(the dry run as it was: 5 train steps, the actions never reached, the pass cut before its
end), side by side in one go: the wall time of each and their ratio, the verdict, and
what each says it covered. The target (issue 38): the epoch end, the first checkpoint and
the first evaluation covered in at most 1.5 times the old default's time.
"""

from __future__ import annotations

from preflight_runs import REPO, timed_preflight

SCRIPT = REPO / "tests" / "scripts" / "long_epoch_periodic.py"


def covered(report: dict[str, object]) -> list[str]:
    summary = report.get("summary") or {}
    assert isinstance(summary, dict)
    return [str(line) for line in summary.get("covered", [])] + [
        f"NOT RUN: {line}" for line in summary.get("not_run", [])
    ]


def main() -> None:
    fire, fire_report = timed_preflight(SCRIPT)
    old, old_report = timed_preflight(SCRIPT, "--no-fire-periodic", "--train-end-batches=0")
    print(f"{'':<22} {'seconds':>8}  verdict")
    print(f"{'defaults':<22} {fire:>8.1f}  {fire_report.get('verdict')}")
    print(f"{'as it was':<22} {old:>8.1f}  {old_report.get('verdict')}")
    print(f"ratio {fire / old:.2f}")
    for name, report in (("defaults", fire_report), ("as it was", old_report)):
        print(f"\n{name}:")
        for line in covered(report):
            print(f"    {line[:160]}")


if __name__ == "__main__":
    main()
