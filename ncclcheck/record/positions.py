"""enumerate() over a fast-forwarded train pass counts the loader's own positions.

A train pass whose middle the dry run skips (record/fastforward.py, --train-end-batches)
yields its first batches, then its last ones. A loop that counts with ``enumerate``
(``for i, batch in enumerate(loader)``) would see ``i`` go on from the head, so what the
script decides on ``i`` at the epoch's end (``if i == len(loader) - 1:``, an
accumulation boundary, a last-batch log) would not happen where it does in the job.
While a dry run fast-forwards train passes, ``enumerate`` is this class: over a pass
with a jump in it, it gives each batch its position in the loader; over anything else
it is the builtin, made by the builtin. Counters the script keeps itself (``step +=
1``) count the batches that ran, not their positions; the periodic actions they decide
are made to fire (record/firing.py).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any

from ncclcheck.record.loaders import TrackedIterator

_BUILTIN = builtins.enumerate


class _Positions:
    """(position in the loader, batch) for each batch of a fast-forwarded pass."""

    def __init__(self, tracked: Any, start: int) -> None:
        self.tracked = tracked
        self.start = start

    def __iter__(self) -> _Positions:
        return self

    def __next__(self) -> tuple[int, Any]:
        batch = next(self.tracked)
        return self.start + self.tracked.index - 1, batch


class _EnumerateType(type):
    """isinstance(x, enumerate) holds for the builtin's objects and for these."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _BUILTIN | _Positions)


class PositionedEnumerate(metaclass=_EnumerateType):
    def __new__(cls, iterable: Any, start: int = 0) -> Iterator[tuple[int, Any]]:  # type: ignore[misc]
        iterator = iter(iterable)
        if isinstance(iterator, TrackedIterator) and iterator.head:
            return _Positions(iterator, start)
        return _BUILTIN(iterator, start)


def install() -> None:
    builtins.enumerate = PositionedEnumerate  # type: ignore[misc,assignment]
