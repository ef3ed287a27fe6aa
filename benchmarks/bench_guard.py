"""The cost of ncclcheck.guard per call: check_aligned and the watchdog on a small gloo
all_reduce, next to the plain all_reduce in the same processes, and the watchdog
wrapper's own cost on a no-op collective (python benchmarks/bench_guard.py)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from workers import run_worker

from ncclcheck.runtime.watchdog import Watchdog


def wrapper_own_cost_us(calls: int = 200_000) -> tuple[float, float]:
    """A no-op with all_reduce's signature, bare and wrapped: the watchdog's own work."""

    def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None:
        return None

    watched = Watchdog(300, None, None, None, False)._wrap("all_reduce", all_reduce)
    bare: list[float] = []
    wrapped: list[float] = []
    for _ in range(5):
        for fn, into in ((all_reduce, bare), (watched, wrapped)):
            start = time.perf_counter()
            for _ in range(calls):
                fn(None)
            into.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(bare), statistics.median(wrapped)


def main() -> None:
    bare, wrapped = wrapper_own_cost_us()
    print(
        f"watchdog wrapper, no-op collective: {bare:.2f} us bare, {wrapped:.2f} us wrapped "
        f"({wrapped - bare:.2f} us own work)"
    )
    for ranks in (2, 4):
        result = run_worker("guard_loop.py", ranks)
        plain, watched, check = result["all_reduce"], result["watched_all_reduce"], result["check_aligned"]
        print(
            f"{ranks} ranks: small all_reduce {plain:.0f} us plain, {watched:.0f} us watched "
            f"({watched / plain:.2f}x); check_aligned {check:.0f} us per call "
            f"({check / plain:.1f}x an all_reduce; once per phase, not per step)"
        )


if __name__ == "__main__":
    main()
