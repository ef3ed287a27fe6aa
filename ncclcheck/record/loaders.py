"""The recorder's view of a DataLoader: each pass over it, its batches, its role (train
or eval), its sampler and dataset, and the sample ids that tell overlapping shards."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ncclcheck.frames import is_user_file
from ncclcheck.record.fastforward import Agreement, FastForward, batches_yielded, iterate_from, read_ahead

# a loader whose variable name holds one of these is an eval loader (unless its mode says otherwise)
_EVAL_NAME_HINTS = ("val", "eval", "test", "dev")
# numbers every pass over a loader in this process, whatever the loader
_pass_counter = itertools.count()


class DryRunComplete(BaseException):
    """Raised on every rank at the same logical point to end the dry run.

    A BaseException, so that a script's ``except Exception`` does not swallow it.
    """


def name_of(loader: Any, scope: dict[str, Any]) -> str | None:
    """The variable in ``scope`` bound to ``loader``, or to a wrapper of it
    (accelerate's DataLoaderShard keeps the real loader as ``base_dataloader``)."""
    for var, value in scope.items():
        if var.startswith("_") or var == "self":
            continue
        if value is loader:
            return var
        if "DataLoader" in type(value).__name__ and (getattr(value, "base_dataloader", None) is loader):
            return var
    return None


class LoaderHost(Protocol):
    """What a tracked pass reports to and reads from: the rank's recorder
    (record/recorder.py), which owns the budget, the phase and the trace."""

    loader_hints: dict[int, tuple[str, str]]
    fast_forward: FastForward | None
    framework_role: Callable[[], str | None]  # what a framework says a loader is for

    @property
    def phase(self) -> str: ...
    @property
    def eval_passes_done(self) -> int: ...
    @property
    def budget_spent(self) -> bool: ...
    @property
    def train_steps(self) -> int: ...
    def wants_pass_end(self, loader: str) -> bool: ...
    def train_passes_of(self, loader: str) -> int: ...
    def write(self, record: dict[str, Any]) -> None: ...
    def pass_started(self, tracked: TrackedIterator) -> None: ...
    def pass_ended(self, tracked: TrackedIterator, exhausted: bool) -> None: ...
    def batch_drawn(self, tracked: TrackedIterator) -> None: ...
    def budget_check(self, tracked: TrackedIterator) -> None: ...


class TrackedIterator:
    """Wraps a DataLoader iterator: counts batches, knows its role, applies the budget."""

    def __init__(
        self, recorder: LoaderHost, loader: Any, make: Callable[[], Iterator[Any]], name: str
    ) -> None:
        self._recorder = recorder
        self._loader = loader
        self.name = name
        self.pass_index = next(_pass_counter)
        self.hinted = False  # the role came from the framework that made the loader
        self.role = self._guess_role()
        self.length = self._safe_len()
        self.yields: int | None = None  # what a train pass's sampler yields, where len() may not say
        self.head = 0  # a fast-forwarded train pass: the batches run before the skipped ones
        self.read = False  # the skipped batches were read ahead (no length), not skipped
        self.agreement: Agreement | None = None
        fast_forward = recorder.fast_forward
        if self.role == "eval" and fast_forward is not None and fast_forward.keep is not None:
            self._inner = self._eval_pass(fast_forward, make)
        elif self.role == "train" and not self.hinted and recorder.wants_pass_end(self.name):
            assert fast_forward is not None
            self._inner = self._train_pass(fast_forward, make)
        else:
            self._inner = make()
        self.skipped = self.agreement.skip if self.agreement is not None else 0
        if self.read:
            self.skipped = self._read_skip
        # positions stay the loader's own: batch 4 is the 4th (a train pass's jump to its
        # tail comes after its head, in __next__)
        self.index = 0 if self.head else self.skipped
        self.counted = False  # counted as a complete eval pass already
        self.cut_by_budget = False  # ended after --train-steps batches, not by the loader
        self.fast_forwarded = self.head > 0  # its end runs: never cut by the budget
        self._ended = False
        recorder.pass_started(self)

    def _eval_pass(self, fast_forward: FastForward, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """--eval-batches: every rank skips the same leading batches (record/fastforward.py)."""
        recorder, name = self._recorder, self.name
        assert fast_forward.keep is not None
        ahead = None
        if self.length is None and not recorder.budget_spent:
            fast_forward.reading(name, recorder.eval_passes_done)
            ahead = read_ahead(make(), 2 * fast_forward.keep, fast_forward.read_s, self._still_reading)
        told = ahead.count if ahead is not None and ahead.ended else self.length
        self.agreement = fast_forward.agree(name, told, recorder.eval_passes_done)
        if ahead is not None and ahead.ended and not self.agreement.why_not:
            self._read_skip, inner = ahead.tail(self.agreement.skip)
            self.length, self.read = ahead.count, True
            return inner
        # nothing agreed for a stream read ahead: a new iterator, from its start
        return iterate_from(self._loader, self.agreement.skip, make)

    def _train_pass(self, fast_forward: FastForward, make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """--train-end-batches: the pass's head (--train-steps batches) runs, then every
        rank skips alike to the last batches of the shortest rank, and the pass ends as
        the loader ends it. Nothing agreed: the pass is cut after its head, as always."""
        recorder = self._recorder
        # counted within half the agreement's wait, so the others never give up on this rank
        self.yields = batches_yielded(self._loader, max(1.0, fast_forward.wait_s / 2))
        head = recorder.train_steps
        agreement = fast_forward.agree(
            f"{self.name}@train",
            self.yields,
            recorder.train_passes_of(self.name),
            keep=head + fast_forward.train_end,
        )
        self.agreement = agreement
        if agreement.why_not:
            return make()
        self.head = head
        return iterate_from(self._loader, agreement.skip, make, head=head)

    def _still_reading(self, batches: int) -> None:
        self._recorder.write(
            {"t": "reading", "loader": self.name, "pass": self.pass_index, "batches": batches}
        )

    def _guess_role(self) -> str:
        hint = self._recorder.loader_hints.get(id(self._loader))
        role = hint[1] if hint is not None else self._recorder.framework_role()
        if role is not None:
            self.hinted = True
            return role
        if self._recorder.phase == "eval":
            return "eval"
        lowered = self.name.lower()
        return "eval" if any(hint in lowered for hint in _EVAL_NAME_HINTS) else "train"

    def facts(self) -> dict[str, Any]:
        from torch.utils.data import IterableDataset
        from torch.utils.data.distributed import DistributedSampler

        loader = self._loader
        sampler = getattr(loader, "sampler", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        inner_sampler = getattr(batch_sampler, "sampler", None)
        dataset = getattr(loader, "dataset", None)
        # DistributedSampler, or a framework's own sharding (accelerate's
        # BatchSamplerShard / IterableDatasetShard, DistributedBatchSampler, ...),
        # which evens the shards out; a class of the user's own named "Shard" is the
        # hand-made split this looks for, not one of those.
        distributed = (
            isinstance(sampler, DistributedSampler)
            or isinstance(inner_sampler, DistributedSampler)
            or any(
                ("Shard" in type(part).__name__ or "Distributed" in type(part).__name__)
                and not _defined_in_user_code(type(part))
                for part in (sampler, batch_sampler, dataset)
                if part is not None
            )
        )
        length = self.length if self.read else self._safe_len()
        return {
            "loader": self.name,
            "pass": self.pass_index,
            "role": self.role,
            "batches": self.index,
            "budget_cut": self.cut_by_budget,
            "len": length,
            "sampler": type(sampler).__name__ if sampler is not None else None,
            "batch_sampler": type(batch_sampler).__name__ if batch_sampler is not None else None,
            "distributed_sampler": distributed,
            "dataset": type(dataset).__name__,
            "dataset_len": _whole_set_len(dataset),
            # no sampler shards an IterableDataset: its own __iter__ splits the stream
            "iterable": isinstance(dataset, IterableDataset),
            "sample_ids": _sample_ids(loader) if self.role == "eval" else None,
            **({"yields": self.yields} if self.yields is not None and self.yields != length else {}),
            **({"head": self.head} if self.head else {}),
            **(
                {
                    "skipped": self.skipped,
                    "read": self.read,
                    "told": {str(r): n for r, n in self.agreement.told.items()},
                    "why_not": self.agreement.why_not,
                }
                if self.agreement is not None
                else {}
            ),
        }

    def __iter__(self) -> TrackedIterator:
        return self

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if self.role == "train" and not self.hinted and self._recorder.phase == "eval":
            self.role = "eval"  # iterated before model.eval(): the first batch tells
        try:
            self._recorder.budget_check(self)
            if self.head and self.index == self.head:
                self.index += self.skipped  # the batches left out come between head and tail
            batch = next(self._inner)
        except StopIteration:
            # what the sampler was counted to yield, where len() is only an estimate
            expected = self.yields if self.yields is not None else self._safe_len()
            self._end(exhausted=self.index >= (expected or self.index))
            raise
        except DryRunComplete:
            self._end(exhausted=False)
            raise
        self.index += 1
        self._recorder.batch_drawn(self)
        return batch

    def _safe_len(self) -> int | None:
        # TypeError for a dataset without __len__; a user's __len__ may raise anything,
        # and the recorder must not raise into the loop it watches.
        try:
            return len(self._loader)
        except Exception:
            return None

    def _end(self, exhausted: bool) -> None:
        if not self._ended:
            self._ended = True
            self._recorder.pass_ended(self, exhausted)


def _defined_in_user_code(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    filename = getattr(module, "__file__", None)
    return cls.__module__ == "__main__" or (isinstance(filename, str) and is_user_file(filename))


def _sample_ids(loader: Any, limit: int = 256) -> list[int] | None:
    """The first dataset indices this rank's eval loader visits, for overlap checks.

    Only for samplers that need no random state (iterating a RandomSampler would
    change the script's random numbers), and not for an IterableDataset: its loader's
    sampler yields None forever, the dataset shards itself. Never raises: a sampler
    of the user's own that yields something else than indices gives None.
    """
    from torch.utils.data import IterableDataset, RandomSampler, Subset

    sampler = getattr(loader, "sampler", None)
    dataset = getattr(loader, "dataset", None)
    if sampler is None or isinstance(sampler, RandomSampler) or isinstance(dataset, IterableDataset):
        return None
    if getattr(sampler, "shuffle", False) and not hasattr(sampler, "seed"):
        return None
    try:
        indices = [int(i) for i in itertools.islice(iter(sampler), limit)]
        while isinstance(dataset, Subset):
            indices = [int(dataset.indices[i]) for i in indices]
            dataset = dataset.dataset
    except Exception:
        return None
    return indices


def _whole_set_len(dataset: Any) -> int | None:
    """The size of the whole set behind a loader's dataset: a hand split's Subset (or any
    wrapper with .dataset) gives its parent's, for the ranks a virtual world picks
    where the split changes its count (launch/virtual.py)."""
    parent = getattr(dataset, "dataset", None)
    for candidate in (parent, dataset) if parent is not None else (dataset,):
        try:
            return len(candidate)
        except Exception:  # an IterableDataset, or a __len__ that fails
            continue
    return None
