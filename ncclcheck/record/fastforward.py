"""Fast-forward (preflight --eval-batches K, --train-end-batches T): the dry run's cost
stays the same whatever the size of the eval set, and a train epoch's end runs whatever
its length.

When an eval pass starts, every rank tells the others through torchrun's store (a
client of it, never a collective: a rank that does not come costs a bounded wait, not
a hang; ranks the script spawned itself use their process group's store, every wait
bounded all the same) how many batches its loader will yield. The last rank to arrive decides for
all: every rank skips the same number of leading batches, the smallest length minus
K, so the last K batches of the shortest rank, and every extra batch of the longer
ones, run for real and an uneven end still shows as a real divergence. The decision
is one store key, set once (compare_set): a rank that gave up waiting sets "no skip"
in the same key unless the decision came first, so no two ranks ever skip differently.

The batches are skipped at the sampler: the loader's index sampler is wrapped for the
one ``iter()`` that makes the pass's iterator, so skipped samples are never loaded (nor
sent to a DataLoader worker). A loader whose ranks did not all start the pass within
the wait runs in full. A virtual world's ranks, which never run together, take rank
0's skip instead (``VirtualFastForward``).

A loader without a length (an IterableDataset: it shards itself, no sampler can skip
for it) is *read ahead*: the rank draws its batches to the end before the loop body
sees any, keeping the last ``2 K`` of them, and tells the count it read. Skipping the
agreed leading batches then costs reading them (the loop body, the model and its
collectives, never run for them); the report says they were read, not skipped. The
reading is bounded in time (a stream may never end: a loop that breaks after N
batches of an endless stream): past the bound the rank tells "unknown" and nobody
skips. Where nothing was agreed (that, or a rank that did not start the pass within
the wait), the loop gets a new iterator over the loader, from its start, as every
eval pass of the real job does: the pass runs in full, at the cost of the read.

A train pass is fast-forwarded the same way, with a head: its first ``--train-steps``
batches run, then every rank skips alike to the last T batches of the shortest rank,
which run with the pass's end (the last, uneven batch; DDP's last all-reduce; what the
script does at the epoch's end). Its ranks agree on what their samplers *yield*, not on
what ``len()`` says: the index sampler is drawn once before the pass (indices only,
nothing loaded; the random states it draws from are put back), so a batch sampler whose
``len()`` is an estimate (batches packed to a token budget) shows its real count. Where
nothing is agreed, the pass is cut after its head as before, and the report says its
end did not run. Only the first pass of each train loader is fast-forwarded: one epoch's
end is the epoch end of them all.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ncclcheck.record import rendezvous
from ncclcheck.record.virtual import ENV_VIRTUAL
from ncclcheck.settings import DryRunSettings

ENV_EVAL_BATCHES = "NCCLCHECK_EVAL_BATCHES"  # K: the batches run for real; unset or "all": every batch
ENV_TRAIN_END = "NCCLCHECK_TRAIN_END_BATCHES"  # T: a train pass's last batches run; unset or 0: cut
ENV_AGREE_WAIT = "NCCLCHECK_EVAL_AGREE_S"  # how long a rank waits for the others' lengths
ENV_READ_S = "NCCLCHECK_EVAL_READ_S"  # how long a rank reads a loader without a length ahead
UNKNOWN = "unknown"
_NO_GROUP = "no process group to meet in when the pass began"


@dataclass
class Agreement:
    """What the ranks agreed for one eval pass: the batches every rank skips, the length
    each rank told (None: unknown), and why nothing was skipped when nothing was."""

    skip: int
    told: dict[int, int | None] = field(default_factory=dict)
    why_not: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            {"skip": self.skip, "told": {str(r): n for r, n in self.told.items()}, "why_not": self.why_not}
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Agreement:
        data = json.loads(text)
        told = {int(r): (None if n is None else int(n)) for r, n in data.get("told", {}).items()}
        return cls(int(data["skip"]), told, data.get("why_not"))


class FastForward:
    """One rank's side: the passes of each loader it started, and the store. ``keep``: the
    eval batches run (None: every one); ``train_end``: a train pass's last batches run
    (0: train passes are cut after their head, not fast-forwarded)."""

    def __init__(
        self,
        keep: int | None,
        wait_s: float,
        rank: int | None,
        world: int | None,
        read_s: float = 30.0,
        train_end: int = 0,
    ) -> None:
        # the launcher's store, as the launcher named it: before the script (or srun's
        # emulation, launch/launchers.py) can change the variables. No rank (a rank the
        # script started itself, mp.spawn): its process group's store, once it has one.
        self.address = (os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "0"))
        self.namespace = rendezvous.namespaced("eval")
        self.keep = keep
        self.wait_s = wait_s
        self.rank = rank
        self.world = world
        self.read_s = read_s
        self.train_end = train_end
        self._store: Any = None

    @classmethod
    def from_environment(cls) -> FastForward | None:
        env = os.environ
        raw_keep = env.get(ENV_EVAL_BATCHES, "all")
        keep = None if raw_keep == "all" else int(raw_keep)
        train_end = int(env.get(ENV_TRAIN_END, "0"))
        if keep is None and train_end <= 0:
            return None
        defaults = DryRunSettings()  # a rank started without preflight's environment
        read_s = float(env.get(ENV_READ_S, defaults.eval_read_ahead_s))
        wait_s = float(env.get(ENV_AGREE_WAIT, defaults.eval_agree_wait_s))
        if "RANK" not in env or "MASTER_ADDR" not in env:  # the script starts its ranks itself
            return cls(keep, wait_s, None, None, read_s, train_end)
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        if env.get(ENV_VIRTUAL):  # its ranks run one at a time, with no store to meet in
            return VirtualFastForward(keep, rank, world, read_s, env[ENV_VIRTUAL], train_end)
        return cls(keep, wait_s, rank, world, read_s, train_end)

    def _connected(self) -> Any:
        """The store to meet in, or None: a rank of the script's own with no process group."""
        if self._store is None and self.rank is not None:
            self._store = rendezvous.launcher_store(self.wait_s, *self.address)
        elif self._store is None:
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_initialized()):
                return None
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            # a store, never a collective; its own timeout is the job's: every wait says its own
            self._store = dist.PrefixStore("ncclcheck/", dist.distributed_c10d._get_default_store())
        return self._store

    def reading(self, loader: str, passes_done: int) -> None:
        """Say this rank reads its pass over ``loader`` ahead before telling its length: a
        rank that told already waits for the readers (up to their bound) once every rank
        has said so, not just the agreement's short wait."""
        store = self._connected() if self.world != 1 else None
        if store is not None and self.world != 1:
            store.add(f"{self.namespace}{loader}/{passes_done}/reading", 1)

    def agree(self, loader: str, length: int | None, passes_done: int, keep: int | None = None) -> Agreement:
        """Tell this rank's length for a pass over ``loader`` after ``passes_done`` complete
        passes; the agreement: every rank skips the smallest length minus ``keep`` (the
        eval batches by default). Keyed by complete passes, not by passes started: a
        pass some rank starts alone (``next(iter(val_loader))`` on rank 0 for a logged
        sample) completes nothing, so it meets the others' real pass and that rank's
        real pass reads the same decision again."""
        keep = self.keep if keep is None else keep
        assert keep is not None, "an eval pass agreed on with --eval-batches all"
        store = self._connected() if self.world != 1 else None
        if self.world == 1:
            return _decide({0: length}, keep)
        if store is None or self.rank is None or self.world is None:
            return Agreement(0, {}, _NO_GROUP)
        rank, world = self.rank, self.world
        base = f"{self.namespace}{loader}/{passes_done}/"
        store.set(f"{base}len/{rank}", UNKNOWN if length is None else str(length))
        if store.add(f"{base}arrived", 1) == world:  # the last to arrive decides for all
            told = {r: _length(store.get(f"{base}len/{r}")) for r in range(world)}
            return Agreement.from_json(store.compare_set(f"{base}skip", "", _decide(told, keep).to_json()))
        try:
            try:
                store.wait([f"{base}skip"], datetime.timedelta(seconds=self.wait_s))
            except Exception:
                if int(store.add(f"{base}reading", 0)) < world:
                    raise  # some rank has not even started the pass
                store.wait([f"{base}skip"], datetime.timedelta(seconds=self.read_s))
            return Agreement.from_json(store.get(f"{base}skip"))
        except Exception:  # the timeout: whoever sets the key first decides for every rank
            arrived = int(store.add(f"{base}arrived", 0))
            why = (
                f"{world - arrived} of {world} ranks had not started the pass "
                f"{self.wait_s:.0f} s after this one"
            )
            return Agreement.from_json(store.compare_set(f"{base}skip", "", Agreement(0, {}, why).to_json()))


class VirtualFastForward(FastForward):
    """A virtual world's side (launch/virtual.py): rank 0 runs first, alone, and its skip
    (its length minus K) is every rank's, read from a file beside rank 0's reference
    results. A rank with another length still shows it: fewer batches than rank 0 run
    fewer than K (none, below the skip), more run more. A pass rank 0 never started
    skips nothing."""

    def __init__(
        self,
        keep: int | None,
        rank: int,
        world: int,
        read_s: float,
        reference_path: str,
        train_end: int = 0,
    ) -> None:
        super().__init__(keep, 0.0, rank, world, read_s, train_end)
        self.virtual_rank = rank
        self.path = os.path.join(os.path.dirname(reference_path), "virtual-eval.jsonl")
        self._decided: dict[str, Agreement] | None = None

    def reading(self, loader: str, passes_done: int) -> None:
        return None  # nobody to wait for

    def agree(self, loader: str, length: int | None, passes_done: int, keep: int | None = None) -> Agreement:
        keep = self.keep if keep is None else keep
        assert keep is not None, "an eval pass agreed on with --eval-batches all"
        key = f"{loader}/{passes_done}"
        if self.virtual_rank == 0:
            decided = _decide({0: length}, keep)
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, "agreement": decided.to_json()}) + "\n")
            return decided
        if self._decided is None:
            self._decided = {}
            if os.path.exists(self.path):
                with open(self.path, encoding="utf-8") as saved:
                    for line in saved:
                        record = json.loads(line)
                        self._decided.setdefault(record["key"], Agreement.from_json(record["agreement"]))
        reference = self._decided.get(key)
        if reference is None:
            return Agreement(0, {self.virtual_rank: length}, "rank 0, the reference, did not start this pass")
        told = {**reference.told, self.virtual_rank: length}
        if length is None or reference.why_not:
            return Agreement(0, told, reference.why_not or f"no length on rank {self.virtual_rank}")
        return Agreement(min(reference.skip, length), told)


def _length(raw: bytes) -> int | None:
    text = raw.decode()
    return None if text == UNKNOWN else int(text)


def _decide(told: dict[int, int | None], keep: int) -> Agreement:
    lengths = [n for n in told.values() if n is not None]
    if len(lengths) < len(told):
        unknown = sorted(r for r, n in told.items() if n is None)
        return Agreement(
            0,
            told,
            f"no length on rank(s) {unknown}: an IterableDataset not read to its end within the bound",
        )
    return Agreement(max(0, min(lengths) - keep), told)  # a short set: nothing to skip, and that is all


class _Skipped:
    """An index sampler whose iterator yields its first ``head`` batches, then leaves out
    ``skip``: the DataLoader fetches (and its workers load) only the batches it yields."""

    def __init__(self, sampler: Any, skip: int, head: int = 0) -> None:
        self.sampler = sampler
        self.skip = skip
        self.head = head

    def __iter__(self) -> Iterator[Any]:
        indices = iter(self.sampler)
        # chain exhausts the head before it starts the tail, so the one iterator serves both
        return itertools.chain(
            itertools.islice(indices, self.head), itertools.islice(indices, self.skip, None)
        )

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)


def iterate_from(loader: Any, skip: int, make: Callable[[], Iterator[Any]], head: int = 0) -> Iterator[Any]:
    """The loader's iterator for a pass that leaves out ``skip`` batches after its first
    ``head`` (none: it starts ``skip`` batches in). DataLoader makes
    its index iterator inside ``__iter__`` (and in a persistent iterator's reset), from
    ``batch_sampler`` when it batches, else from ``sampler``: that attribute stands in for
    the call. DataLoader refuses to have them set after construction, hence object's own
    setattr, and the original is back before the loop sees the loader again."""
    if skip <= 0:
        return make()
    attribute = "batch_sampler" if getattr(loader, "batch_sampler", None) is not None else "sampler"
    original = getattr(loader, attribute)
    object.__setattr__(loader, attribute, _Skipped(original, skip, head))
    try:
        return make()
    finally:
        object.__setattr__(loader, attribute, original)


@dataclass
class ReadAhead:
    """A pass over a loader without a length, read before the loop body saw a batch: how
    many batches it had (when it ended within the bound) and the last of them."""

    count: int
    held: deque[Any]
    ended: bool

    def tail(self, skip: int) -> tuple[int, Iterator[Any]]:
        """The batches the loop gets after ``skip`` leading ones, and how many it does not
        get: those past what was held start later (a rank that has more than 2 K batches
        beyond the shortest runs 2 K, still more than the shortest's K)."""
        run = min(len(self.held), self.count - skip)
        return self.count - run, iter(list(self.held)[len(self.held) - run :])


def read_ahead(
    iterator: Iterator[Any], hold: int, bound_s: float, progress: Callable[[int], None]
) -> ReadAhead:
    """Draw ``iterator`` to its end (at most ``bound_s`` seconds), keeping the last
    ``hold`` batches; ``progress(count)`` about once a second, so a long read is never
    taken for a quiet, hung rank."""
    held: deque[Any] = deque(maxlen=hold)
    start = said = time.monotonic()
    count = 0
    for batch in iterator:
        held.append(batch)
        count += 1
        now = time.monotonic()
        if now - said >= 1.0:
            said = now
            progress(count)
        if now - start > bound_s:
            return ReadAhead(count, deque(), False)
    return ReadAhead(count, held, True)


def batches_yielded(loader: Any, bound_s: float) -> int | None:
    """How many batches this pass over ``loader`` will yield, where its ``len()`` may say
    otherwise: a sampler of the user's own (a batch sampler that packs to a token budget
    often gives an estimate). Its index iterator is drawn once, indices only, nothing
    loaded, with the random states it may draw from put back, so the pass that follows
    yields the same batches. None: a stream (no index sampler), or not counted within
    ``bound_s``. torch's own samplers, and a list of batches, are exact: not drawn."""
    from torch.utils.data import IterableDataset

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return None
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = batch_sampler if batch_sampler is not None else getattr(loader, "sampler", None)
    if sampler is None:
        return None
    if _exact_length(sampler):
        try:
            return len(sampler)
        except Exception:
            return None
    start = time.monotonic()
    count = 0
    with _random_states_kept([loader, sampler, getattr(sampler, "sampler", None)]):
        try:
            for _ in sampler:
                count += 1
                if count % 1024 == 0 and time.monotonic() - start > bound_s:
                    return None
        except Exception:  # the user's sampler failing here fails in the pass itself, where it shows
            return None
    return count


def _exact_length(sampler: Any) -> bool:
    """torch's samplers (and a plain list of batches) yield what their len() says."""
    if isinstance(sampler, list | tuple):
        return True
    module = type(sampler).__module__
    if not module.startswith("torch.utils.data"):
        return False
    inner = getattr(sampler, "sampler", None)
    return inner is None or _exact_length(inner) or isinstance(inner, range | list | tuple)


@contextlib.contextmanager
def _random_states_kept(holders: list[Any]) -> Iterator[None]:
    """Put back the random states a sampler draws from: torch's, Python's, numpy's where
    it is loaded, and the generators the loader and its samplers hold."""
    import random

    import torch

    torch_state, python_state = torch.get_rng_state(), random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    generators = [
        (g, g.get_state())
        for g in (getattr(h, "generator", None) for h in holders if h is not None)
        if isinstance(g, torch.Generator)
    ]
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(python_state)
        if numpy is not None and numpy_state is not None:
            numpy.random.set_state(numpy_state)
        for generator, state in generators:
            generator.set_state(state)
