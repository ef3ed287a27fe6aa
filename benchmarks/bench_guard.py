"""The cost of ncclcheck.guard.check_aligned per call, next to a small gloo all_reduce
measured in the same processes (python benchmarks/bench_guard.py)."""

from __future__ import annotations

from workers import run_worker


def main() -> None:
    for ranks in (2, 4):
        result = run_worker("guard_loop.py", ranks)
        ratio = result["check_aligned"] / result["all_reduce"]
        print(
            f"{ranks} ranks: check_aligned {result['check_aligned']:.0f} us per call, "
            f"small all_reduce {result['all_reduce']:.0f} us ({ratio:.1f}x; once per phase, not per step)"
        )


if __name__ == "__main__":
    main()
