"""``preflight --perturb``: make rank-local values differ on purpose.

A decision taken on a value that was never synchronised across ranks (early
stopping on the local validation loss, "new best" checkpoints, a wall-clock
budget) hangs only when the ranks' values happen to differ, which a short dry
run on identical data may never show. Under --perturb, in the user's own code:

- ``Tensor.item()`` and ``float(tensor)`` on a floating scalar, during
  evaluation, return the value times a random factor between 0.5 and 2 drawn
  per rank (rank 0 keeps its values), so two ranks compare different numbers;
- ``time.time()``, ``time.monotonic()`` and ``time.perf_counter()`` run
  ``1 + 10_000_000 * rank`` times faster on each rank from the first reading, so a
  budget check fires on one rank long before another (a day's budget passes on rank 1
  in 9 ms of a dry run's training: at 100,000 an hour's took 36 ms, and a dry run of
  11 quick steps sometimes ended first).

Library code (torch, ncclcheck) sees true values. Each perturbed site is written
to the trace once (``{"t": "perturb", "kind": ..., "site": ...}``) and listed in
the report, so a divergence can be traced to what was perturbed.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from ncclcheck import frames
from ncclcheck.record.recorder import Recorder

ENV_PERTURB = "NCCLCHECK_PERTURB"
CLOCK_SPEED_PER_RANK = 10_000_000.0  # a real second is 116 days on rank 1


def install(recorder: Recorder, rank: int) -> None:
    import torch

    if rank == 0:
        return  # the reference: its values stay true, every other rank's differ from them
    noise = random.Random(1000 + rank)

    def user_caller(kind: str) -> bool:
        frame: Any = frames.past_own_wrappers(sys._getframe(2))
        if not frames.is_user_code(frame.f_code):
            return False
        recorder.note_site("perturb", kind, frame)
        return True

    original_item = torch.Tensor.item
    original_float = torch.Tensor.__float__

    def perturbed(value: Any) -> Any:
        if isinstance(value, float) and math.isfinite(value):
            return value * math.exp(noise.uniform(-math.log(2), math.log(2)))
        return value

    @frames.patched_method
    def item(self: torch.Tensor) -> Any:
        value = original_item(self)
        if recorder.phase == "eval" and self.is_floating_point() and user_caller(".item() (eval)"):
            return perturbed(value)
        return value

    @frames.patched_method
    def to_float(self: torch.Tensor) -> float:
        value = original_float(self)
        if recorder.phase == "eval" and self.is_floating_point() and user_caller("float(tensor) (eval)"):
            return float(perturbed(value))
        return float(value)

    torch.Tensor.item = item
    torch.Tensor.__float__ = to_float

    speed = 1.0 + CLOCK_SPEED_PER_RANK * rank

    def faster(name: str, clock: Callable[[], float]) -> Callable[[], float]:
        first: list[float] = []

        def read() -> float:
            now = clock()
            if not user_caller(f"time.{name}()"):
                return now
            if not first:
                first.append(now)
            return first[0] + (now - first[0]) * speed

        return read

    for name in ("time", "monotonic", "perf_counter"):
        setattr(time, name, faster(name, getattr(time, name)))
