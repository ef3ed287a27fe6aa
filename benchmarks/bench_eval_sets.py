"""What an eval set's size costs a dry run (python benchmarks/bench_eval_sets.py).

tests/scripts/large_eval.py (a per-batch all_reduce over a validation set, 2 gloo
ranks) with 200, 20,000 and 2,000,000 samples, preflight with the default
--eval-batches (8) and with --eval-batches all, side by side in one go: the wall time
of each and their ratio; for a loader with a sampler (skipped at the sampler) and for
a stream (an IterableDataset: read ahead without the loop body). Then every playbook
repro both ways, with the cause each reports: fast-forward must not change a finding.
The target (issue 25): flat in the eval set's size with the default, the same findings
as `all` on every repro.
"""

from __future__ import annotations

import argparse
import os

from preflight_runs import REPO, timed_preflight

SIZES = [200, 20_000, 2_000_000]


def cause_of(report: dict[str, object]) -> str:
    findings = report.get("findings") or []
    assert isinstance(findings, list)
    errors = [f["cause"] for f in findings if f.get("severity") == "error"]
    return ",".join(errors) or str(report.get("verdict", "-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-playbooks", action="store_true")
    args = parser.parse_args()
    script = REPO / "tests" / "scripts" / "large_eval.py"
    header = f"{'loader':<8} {'eval samples':>12} {'default s':>10} {'all s':>8} {'ratio':>6}"
    print(f"{header}  eval batches per rank")
    for kind in ("sampler", "stream"):
        os.environ["STREAM"] = "1" if kind == "stream" else "0"
        for size in SIZES:
            os.environ["SAMPLES"] = str(size)
            fast, report = timed_preflight(script, timeout=3600)
            full, _ = timed_preflight(script, "--eval-batches", "all", timeout=3600)
            batches = (report.get("summary") or {}).get("eval_batches")  # type: ignore[union-attr]
            print(f"{kind:<8} {size:>12,} {fast:>10.1f} {full:>8.1f} {fast / full:>6.2f}  {batches}")
    os.environ.pop("SAMPLES", None)
    os.environ.pop("STREAM", None)
    if args.skip_playbooks:
        return
    print(f"\n{'playbook repro':<32} {'default':<28} {'all':<28} same")
    for repro in sorted((REPO / "playbooks").glob("*/repro.py")):
        _, fast_report = timed_preflight(repro)
        _, full_report = timed_preflight(repro, "--eval-batches", "all")
        fast, full = cause_of(fast_report), cause_of(full_report)
        print(f"{repro.parent.name:<32} {fast:<28} {full:<28} {'yes' if fast == full else 'NO'}")


if __name__ == "__main__":
    main()
