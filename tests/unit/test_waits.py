"""Ranks outside every collective while others wait (evidence/waits.py) and what the
report says of such a wait (explain/rules/quiet.py kept_waiting), on synthetic stacks."""

from __future__ import annotations

from pathlib import Path

from ncclcheck.evidence.waits import OutsideWait, standoff, timeout_limit, waits_on
from ncclcheck.explain.rules.quiet import kept_waiting
from ncclcheck.model import Severity

from .factories import TORCH, diagnoser, script, stack, trace, waiting_in

PYTHON = "/usr/lib/python3.11"


def test_a_rank_outside_while_another_waits_in_a_barrier_is_a_standoff() -> None:
    sleeping = stack(("/job/train.py", 12, "download"), ("/job/train.py", 30, "main"))
    barrier = waiting_in("barrier", ("/job/train.py", 31, "main"))
    found = standoff({0: sleeping, 1: barrier}, set())
    assert found is not None and (found.outside, found.waiting) == ([0], [1])


def test_no_standoff_where_every_rank_waits_on_a_peer_or_a_rank_is_frozen() -> None:
    barrier = waiting_in("barrier", ("/job/train.py", 31, "main"))
    assert standoff({0: barrier, 1: barrier}, set()) is None
    frozen = stack(("/job/train.py", 12, "download"), status="stopped")
    assert standoff({0: frozen, 1: barrier}, set()) is None  # SIGSTOPped: waits on nothing outside


def test_no_standoff_where_nobody_waits_and_a_rank_has_left_the_job() -> None:
    """Rank 1 ended, rank 0 is busy on its own: no peer is held, and waiting for what
    rank 0 does next would last its whole work."""
    busy = stack(("/job/train.py", 12, "upload"), ("/job/train.py", 30, "main"))
    done = stack(("/job/train.py", 40, "main"))
    assert standoff({0: busy, 1: done}, {1}) is None
    found = standoff({0: busy, 1: busy}, set())  # every rank busy on its own, none ended
    assert found is not None and found.waiting == []


def test_what_a_rank_outside_waits_on_is_read_from_its_library_frames_or_its_thread() -> None:
    fetching = stack(
        (f"{PYTHON}/socket.py", 720, "readinto"),
        (f"{PYTHON}/http/client.py", 300, "_read_status"),
        ("/job/data.py", 8, "fetch"),
    )
    assert waits_on(fetching) == "a network read"
    child = stack((f"{PYTHON}/subprocess.py", 2053, "_try_wait"), ("/job/data.py", 9, "convert"))
    assert waits_on(child) == "a subprocess"
    loader = stack((f"{TORCH}/utils/data/dataloader.py", 1100, "_next_data"), ("/job/train.py", 40, "main"))
    assert waits_on(loader) == "its DataLoader"
    idle = stack(("/job/train.py", 12, "download"))
    assert waits_on(idle).startswith("a blocking call (idle")
    idle.threads[0].active = True
    assert waits_on(idle).startswith("compute (on the CPU)")


def test_the_limit_leaves_a_margin_before_the_timeout() -> None:
    assert timeout_limit(20.0) == 15.0  # a quarter of a short timeout
    assert timeout_limit(600.0) == 595.0  # five seconds of a long one


def test_a_wait_that_ended_is_a_warning_naming_both_sides_and_the_timeout(tmp_path: Path) -> None:
    path = script(tmp_path, "import time\n\ndef download():\n    time.sleep(40)\n")
    sleeping = stack((path, 4, "download"), (path, 9, "main"))
    barrier = waiting_in("barrier", (path, 10, "main"))
    ranks = {0: trace(0, []), 1: trace(1, [])}
    for rank_trace in ranks.values():
        rank_trace.timeout_s = 600.0
    d = diagnoser(tmp_path, traces=ranks)
    wait = OutsideWait([0], [1], began_s=3.0, seconds=40.0, over=True, stacks={0: sleeping, 1: barrier})
    said = kept_waiting(d, wait)
    assert said is not None and said.severity is Severity.WARNING
    assert (said.ranks, said.absent_ranks, said.site) == ([1], [0], "train.py:10")
    assert said.message.startswith("rank 0 kept rank 1 waiting 40 s: rank 1 waited in barrier at train.py:10")
    assert "`time.sleep(40)` at train.py:4 in download()" in said.message
    assert "the job's collectives wait 600 s for a peer" in said.message
    # a wait as long as the timeout is no warning: the job failed there, as its ends say
    assert kept_waiting(d, OutsideWait([0], [1], 3.0, 600.0, True, {0: sleeping, 1: barrier})) is None
    # a wait nobody made in a collective is nothing the collectives would time out
    assert kept_waiting(d, OutsideWait([0, 1], [], 3.0, 40.0, True, {0: sleeping, 1: sleeping})) is None
