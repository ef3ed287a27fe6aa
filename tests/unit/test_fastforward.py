"""Eval fast-forward (record/fastforward.py): the agreement through a real TCPStore, with
ranks as threads of this process, and the skip at a real DataLoader's sampler."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed import TCPStore
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from ncclcheck.record.fastforward import (
    Agreement,
    FastForward,
    VirtualFastForward,
    batches_yielded,
    iterate_from,
    read_ahead,
)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> TCPStore:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(master.port))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "fastforward-test")
    return master


def agree_on_threads(
    lengths: dict[int, int | None], keep: int, loader: str = "val_loader"
) -> dict[int, Agreement]:
    """Each rank on a thread of its own, as each would in its process."""
    found: dict[int, Agreement] = {}

    def rank_side(rank: int) -> None:
        found[rank] = FastForward(keep, 5.0, rank, len(lengths)).agree(loader, lengths[rank], 0)

    threads = [threading.Thread(target=rank_side, args=(rank,)) for rank in lengths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return found


def test_every_rank_skips_the_smallest_length_minus_k(store: TCPStore) -> None:
    found = agree_on_threads({0: 2501, 1: 2500, 2: 2500, 3: 2500}, keep=8)
    assert {a.skip for a in found.values()} == {2492}  # rank 0 then runs 9, the others 8
    assert all(a.told == {0: 2501, 1: 2500, 2: 2500, 3: 2500} for a in found.values())


def test_an_unknown_length_or_a_short_set_skips_nothing(store: TCPStore) -> None:
    found = agree_on_threads({0: 100, 1: None}, keep=8)
    assert {a.skip for a in found.values()} == {0}
    assert "no length on rank(s) [1]" in str(found[0].why_not)
    short = agree_on_threads({0: 5, 1: 6}, keep=8, loader="test_loader")
    assert {(a.skip, a.why_not) for a in short.values()} == {(0, None)}


def test_a_rank_that_never_starts_the_pass_costs_a_bounded_wait_and_no_skip(store: TCPStore) -> None:
    """Only rank 0 evaluates: it gives up after the wait and nobody skips; a rank that
    comes later still reads that decision, never one of its own."""
    alone = FastForward(8, 1.0, 0, 2).agree("val_loader", 100, 0)
    assert (alone.skip, alone.why_not) == (0, "1 of 2 ranks had not started the pass 1 s after this one")
    late = FastForward(8, 1.0, 1, 2).agree("val_loader", 100, 0)
    assert late.skip == 0 and late.why_not == alone.why_not


def test_a_pass_one_rank_starts_alone_reads_the_same_decision_as_its_real_one(store: TCPStore) -> None:
    """Rank 0 peeks at a batch to log (next(iter(val_loader))) before evaluating, rank 1
    only evaluates: the peek completes no pass, so both of rank 0's passes and rank 1's
    meet under one key and skip alike."""
    found: dict[str, Agreement] = {}

    def rank_zero() -> None:
        side = FastForward(8, 5.0, 0, 2)
        found["peek"] = side.agree("val_loader", 100, 0)
        found["rank 0"] = side.agree("val_loader", 100, 0)

    def rank_one() -> None:
        found["rank 1"] = FastForward(8, 5.0, 1, 2).agree("val_loader", 100, 0)

    threads = [threading.Thread(target=rank_zero), threading.Thread(target=rank_one)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert {name: a.skip for name, a in found.items()} == {"peek": 92, "rank 0": 92, "rank 1": 92}


class Counted(Dataset[Any]):
    def __init__(self, size: int) -> None:
        self.size = size
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        self.loaded.append(index)
        return torch.tensor([index])


def test_skipped_batches_are_never_loaded_and_the_loader_is_left_as_it_was() -> None:
    data = Counted(100)
    loader = DataLoader(data, batch_size=4)
    sampler = loader.batch_sampler
    batches = list(iterate_from(loader, 20, lambda: DataLoader.__iter__(loader)))
    assert [int(b[0]) for b in batches] == [80, 84, 88, 92, 96]
    assert data.loaded == list(range(80, 100))
    assert loader.batch_sampler is sampler and len(loader) == 25


def test_a_train_pass_runs_its_head_then_its_tail_and_loads_nothing_between() -> None:
    data = Counted(100)
    loader = DataLoader(data, batch_size=4, num_workers=0)
    batches = list(iterate_from(loader, 18, lambda: DataLoader.__iter__(loader), head=5))
    assert [int(b[0]) for b in batches] == [0, 4, 8, 12, 16, 92, 96]  # 5 batches, then the last 2 of 25
    assert data.loaded == [*range(0, 20), *range(92, 100)]
    assert len(loader) == 25


class Stream(IterableDataset[int]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Any:
        return iter(range(self.size))


class EstimatedBuckets:
    """A bucketing batch sampler of the user's own: its len() is an estimate, and it draws
    from the global random state as it shuffles its buckets."""

    def __init__(self, batches: int, estimate: int) -> None:
        self.batches, self.estimate = batches, estimate

    def __iter__(self) -> Any:
        order = torch.randperm(self.batches).tolist()
        return iter([[i] for i in order])

    def __len__(self) -> int:
        return self.estimate


def test_a_sampler_of_the_users_own_is_counted_and_the_random_state_put_back() -> None:
    loader = DataLoader(Counted(50), batch_sampler=EstimatedBuckets(37, estimate=40))  # type: ignore[arg-type]
    torch.manual_seed(3)
    assert batches_yielded(loader, 5.0) == 37  # not the 40 len() says
    after_count = torch.rand(1)
    torch.manual_seed(3)
    assert torch.equal(after_count, torch.rand(1))  # the count drew nothing the script sees


def test_torchs_own_samplers_are_taken_at_their_length_without_drawing() -> None:
    data = TensorDataset(torch.arange(10))
    generator = torch.Generator().manual_seed(0)
    shuffled = DataLoader(data, batch_size=3, shuffle=True, generator=generator)
    state = generator.get_state()
    assert batches_yielded(shuffled, 5.0) == 4
    assert torch.equal(generator.get_state(), state)
    stream = DataLoader(Stream(7), batch_size=2)
    assert batches_yielded(stream, 5.0) is None  # no index sampler: a stream is not counted


def test_the_skip_follows_a_distributed_shard_and_a_loader_without_batching() -> None:
    data = TensorDataset(torch.arange(40))
    shard = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, 2, 1, shuffle=False))
    first = next(iterate_from(shard, 8, lambda: DataLoader.__iter__(shard)))
    assert first[0].tolist() == [33, 35]  # rank 1's 9th batch: samples 1, 3, 5, ... of its shard
    single = DataLoader(data, batch_size=None)
    assert [int(x[0]) for x in iterate_from(single, 37, lambda: DataLoader.__iter__(single))] == [37, 38, 39]


def test_a_stream_is_read_to_its_end_keeping_its_last_batches_only() -> None:
    """An IterableDataset's 2,501 batches: counted, the last 16 (2 K) held; after the agreed
    2,492 the loop gets batches 2,492-2,500, positions the stream's own."""
    said: list[int] = []
    ahead = read_ahead(iter(range(2501)), 16, 30.0, said.append)
    assert (ahead.count, ahead.ended, list(ahead.held)) == (2501, True, list(range(2485, 2501)))
    skipped, rest = ahead.tail(2492)
    assert (skipped, list(rest)) == (2492, list(range(2492, 2501)))
    # more than 2 K beyond the agreed skip: the held 16, still more than the shortest's K
    skipped, rest = read_ahead(iter(range(3000)), 16, 30.0, said.append).tail(2492)
    assert (skipped, list(rest)) == (2984, list(range(2984, 3000)))
    short = read_ahead(iter(range(3)), 16, 30.0, said.append)  # shorter than K: all of it
    assert short.tail(0)[0] == 0 and list(short.tail(0)[1]) == [0, 1, 2]


def test_an_endless_stream_is_read_for_its_bound_only() -> None:
    said: list[int] = []
    start = time.monotonic()
    ahead = read_ahead(itertools.count(), 16, 1.2, said.append)
    # read for its whole bound; that it stopped at all is its return (no upper bound on the
    # time: a loaded machine is slower, not wrong)
    assert time.monotonic() - start > 1.2 and not ahead.ended and not ahead.held
    assert said and said == sorted(said)  # progress about once a second while reading


def test_a_rank_that_told_waits_for_ranks_still_reading_ahead(store: TCPStore) -> None:
    """Rank 1 reads its stream for 2.5 s, far past the 1 s agreement wait: rank 0 told at
    once, sees every rank reading, and waits for it instead of deciding "no skip"."""
    found: dict[int, Agreement] = {}

    def rank_side(rank: int, reading_s: float) -> None:
        side = FastForward(8, 1.0, rank, 2, read_s=10.0)
        side.reading("val_loader", 0)
        time.sleep(reading_s)
        found[rank] = side.agree("val_loader", 2500, 0)

    threads = [threading.Thread(target=rank_side, args=(r, s)) for r, s in ((0, 0.0), (1, 2.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert {r: (a.skip, a.why_not) for r, a in found.items()} == {0: (2492, None), 1: (2492, None)}


def test_a_virtual_world_takes_rank_0s_skip_and_each_rank_keeps_its_own_length(tmp_path: Path) -> None:
    """Virtual ranks never run together: rank 0 (first, alone) writes its skip, the others
    read it; a shorter rank never skips past its own end; a pass rank 0 never started
    skips nothing."""
    reference = str(tmp_path / "virtual-reference.jsonl")
    assert VirtualFastForward(8, 0, 48, 30.0, reference).agree("val_loader", 1001, 0).skip == 993
    assert VirtualFastForward(8, 0, 48, 30.0, reference).agree("val_loader", 1001, 1).skip == 993
    later = VirtualFastForward(8, 16, 48, 30.0, reference)
    assert (later.agree("val_loader", 1000, 0).skip, later.agree("val_loader", 1000, 1).skip) == (993, 993)
    assert later.agree("val_loader", 1000, 0).told == {0: 1001, 16: 1000}
    assert VirtualFastForward(8, 47, 48, 30.0, reference).agree("val_loader", 500, 0).skip == 500
    alone = VirtualFastForward(8, 5, 48, 30.0, reference).agree("test_loader", 1000, 0)
    assert (alone.skip, alone.why_not) == (0, "rank 0, the reference, did not start this pass")
