"""enumerate() over a fast-forwarded train pass (record/positions.py): the loader's own
positions, and the builtin's behaviour everywhere else."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ncclcheck.record import positions
from ncclcheck.record.fastforward import iterate_from
from ncclcheck.record.loaders import TrackedIterator


class Host:
    """The recorder's side a tracked pass talks to, for a pass fast-forwarded by hand."""

    def __init__(self) -> None:
        self.loader_hints: dict[int, tuple[str, str]] = {}

    fast_forward = None
    phase = "train"
    eval_passes_done = 0
    budget_spent = False
    train_steps = 3

    def framework_role(self) -> None:
        return None

    def wants_pass_end(self, loader: str) -> bool:
        return False

    def train_passes_of(self, loader: str) -> int:
        return 0

    def write(self, record: dict[str, Any]) -> None: ...
    def pass_started(self, tracked: Any) -> None: ...
    def pass_ended(self, tracked: Any, exhausted: bool) -> None: ...
    def batch_drawn(self, tracked: Any) -> None: ...
    def budget_check(self, tracked: Any) -> None: ...


@pytest.fixture
def enumerate_installed() -> Iterator[None]:
    builtin = builtins.enumerate
    positions.install()
    try:
        yield
    finally:
        builtins.enumerate = builtin


def fast_forwarded(loader: DataLoader[Any], head: int, skip: int) -> TrackedIterator:
    """A train pass whose head and skip were agreed: what loaders.TrackedIterator sets."""
    tracked = TrackedIterator(Host(), loader, lambda: DataLoader.__iter__(loader), "train_loader")  # type: ignore[arg-type]
    tracked._inner = iterate_from(loader, skip, lambda: DataLoader.__iter__(loader), head=head)
    tracked.head, tracked.skipped, tracked.index, tracked.fast_forwarded = head, skip, 0, True
    return tracked


def test_a_fast_forwarded_pass_counts_the_loaders_positions(enumerate_installed: None) -> None:
    loader = DataLoader(TensorDataset(torch.arange(20)), batch_size=2)
    seen = [(i, int(batch[0][0])) for i, batch in enumerate(fast_forwarded(loader, head=3, skip=5))]
    # batches 0-2, then the last 2 of 10: positions 8 and 9, as the loader has them
    assert seen == [(0, 0), (1, 2), (2, 4), (8, 16), (9, 18)]
    assert seen[-1][0] == len(loader) - 1  # `if i == len(loader) - 1:` holds at the last batch
    started = [i for i, _ in enumerate(fast_forwarded(loader, head=3, skip=5), start=1)]
    assert started == [1, 2, 3, 9, 10]


def test_anything_else_is_the_builtins_own(enumerate_installed: None) -> None:
    assert type(enumerate("ab")) is positions._BUILTIN  # made by the builtin, at its speed
    assert list(enumerate("ab", 1)) == [(1, "a"), (2, "b")]
    assert list(enumerate(iter([5, 6]))) == [(0, 5), (1, 6)]
    assert isinstance(enumerate([]), enumerate)
    with pytest.raises(TypeError):
        enumerate(3)
