"""ncclcheck.guard.watchdog on real torchrun ranks: a hung collective is reported with its
site, phase and what the other ranks do, in seconds; a late one is reported, then cleared."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from ncclcheck.runtime.watchdog import ABORT_EXIT_CODE, describe_waits

from ..conftest import JOB_BOUND_S, REPO, SCRIPTS, run_bounded, torchrun_argv

SCRIPT = SCRIPTS / "watchdog_hang.py"


def line_of(fragment: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if fragment in text)


def run(mode: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        "MODE": mode,
        "PYTHONPATH": str(REPO),
        "NCCLCHECK_WATCHDOG_DIR": str(tmp_path / "reports"),
    }
    result = run_bounded(torchrun_argv(SCRIPT, 2), JOB_BOUND_S, env=env, cwd=tmp_path)
    reports = {
        rank: (tmp_path / "reports" / f"rank-{rank:05d}.txt").read_text()
        for rank in (0, 1)
        if (tmp_path / "reports" / f"rank-{rank:05d}.txt").exists()
    }
    return result, reports


@pytest.mark.ranks
def test_ranks_in_different_collectives_are_named_with_their_sites(tmp_path: Path) -> None:
    result, reports = run("mismatch", tmp_path)
    assert result.returncode not in (0, None), result.output  # abort=True ended the job
    assert f"exits with {ABORT_EXIT_CODE}" in result.output
    # ended by the watchdog's abort (2 s), not by the backend's timeout (600 s)
    assert result.elapsed < 500, result.elapsed
    evaluate_line = line_of("dist.all_reduce(metric)")
    barrier_line = line_of("dist.barrier()")
    rank0, rank1 = reports[0], reports[1]
    assert "rank 0 has waited" in rank0 and "in all_reduce (call #2 on group 0, ranks 0-1)" in rank0
    assert f"watchdog_hang.py:{evaluate_line} in evaluate()" in rank0
    assert "phase:  eval" in rank0 and "shapes: [1] float32 cpu" in rank0
    assert "stack of the waiting thread:" in rank0
    assert f"rank 1: barrier #2 on group 0 at {SCRIPT}:{barrier_line} in main()" in rank0
    assert "likely: rank 0 still in evaluation while rank 1 left it" in rank0
    assert "(uneven-eval-batches, rank-conditional-collective)" in rank0
    assert "in barrier" in rank1 and "phase:  train" in rank1


@pytest.mark.ranks
def test_a_late_rank_is_reported_then_cleared(tmp_path: Path) -> None:
    result, reports = run("slow", tmp_path)
    assert result.returncode == 0, result.output
    assert result.output.count(": done") == 2
    rank0 = reports[0]
    assert "rank 0 has waited" in rank0 and "phase:  eval" in rank0  # the aligned_phase's name
    assert "rank 1: not waiting in a collective" in rank0 and "(straggler)" in rank0
    site = f"watchdog_hang.py:{line_of('dist.all_reduce(torch.ones(3))')} in main()"
    assert f"rank 0: all_reduce at {SCRIPT.parent}/{site} returned after" in rank0
    assert 1 not in reports  # rank 1 never waited


@pytest.mark.ranks
def test_an_asynchronous_call_that_never_completes_is_named_from_its_work(tmp_path: Path) -> None:
    result, reports = run("async", tmp_path)
    assert result.returncode not in (0, None)
    rank0 = reports[0]
    assert f"watchdog_hang.py:{line_of('work = dist.all_reduce')} in main()" in rank0
    assert "the collective was queued and has not completed; the host thread is now at:" in rank0
    assert "time.sleep(0.05)" in rank0  # where the host thread is now
    assert "rank 1: not waiting in a collective" in rank0


@pytest.mark.ranks
def test_tracking_completion_reports_a_synchronous_call_as_queued(tmp_path: Path) -> None:
    # What the watchdog does for GPU tensors, on gloo: the call issued async, then waited.
    result, reports = run("converted", tmp_path)
    assert result.returncode not in (0, None)
    rank0 = reports[0]
    assert "the collective was queued and has not completed" in rank0
    assert f"watchdog_hang.py:{line_of('dist.all_reduce(metric)')} in evaluate()" in rank0
    assert "rank 1: barrier #2" in rank0


def where(
    op: str, seq: int, site: str = "train.py:10", shapes: str = "[1] float32 cpu", phase: str = "train"
) -> dict[str, object]:
    return {"op": op, "group": "0", "seq": seq, "site": site, "shapes": shapes, "phase": phase}


@pytest.mark.parametrize(
    ("said", "cause"),
    [
        ({0: where("all_reduce", 5), 1: where("barrier", 5)}, "rank-conditional-collective"),
        ({0: where("all_reduce", 5, phase="eval"), 1: where("barrier", 5)}, "rank 0 still in evaluation"),
        ({0: where("all_reduce", 6), 1: where("all_reduce", 5)}, "uneven-eval-batches"),
        ({0: where("all_reduce", 5)}, "rank-crashed"),
        ({0: where("all_reduce", 5, "a.py:1"), 1: where("all_reduce", 5, "b.py:2")}, "order-mismatch"),
        ({0: where("all_gather", 5, shapes="[3]"), 1: where("all_gather", 5, shapes="[4]")}, "shape-"),
        ({0: where("all_reduce", 5), 1: where("all_reduce", 5)}, "transport-hang"),
    ],
)
def test_the_pattern_of_waits_names_a_cause(said: dict[int, dict[str, object]], cause: str) -> None:
    lines = describe_waits(said, world=2)  # type: ignore[arg-type]
    (likely,) = [line for line in lines if line.strip().startswith("likely:")]
    assert cause in likely


def test_stop_puts_torch_back() -> None:
    import torch.distributed as dist

    from ncclcheck.guard import watchdog

    original = dist.all_reduce
    with watchdog(timeout=60) as guard:
        assert dist.all_reduce.__ncclcheck_watchdog__ is original  # type: ignore[attr-defined]
        assert guard.interval == 5.0
    assert dist.all_reduce is original


def test_a_blocking_call_is_reported_once_then_said_to_return(tmp_path: Path) -> None:
    # One process, no process group: a stand-in collective that blocks for 1 s.
    from ncclcheck.runtime.watchdog import Watchdog

    def all_reduce(tensor: object, op: object = None, group: object = None, async_op: bool = False) -> str:
        time.sleep(1.0)
        return "done"

    guard = Watchdog(0.2, tmp_path, 0.05, None, False)
    watched = guard._wrap("all_reduce", all_reduce)
    thread = threading.Thread(target=guard._watch, daemon=True)
    thread.start()
    try:
        assert watched(None) == "done"
    finally:
        guard._stop.set()
        thread.join(5)
    report, returned = guard.reports[0], guard.reports[-1]
    assert len([r for r in guard.reports if "has waited" in r]) == 1
    assert "in all_reduce (call #1 on group" in report
    assert f"test_watchdog.py:{_line_of_call()} in test_a_blocking_call_is_reported_once" in report
    assert re.search(r"all_reduce at .*test_watchdog\.py:\d+ in \w+\(\) returned after [\d.]+ s", returned)
    assert guard._waiting == {}
    assert (tmp_path / "rank-00000.txt").read_text().count("has waited") == 1


def _line_of_call() -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if "assert watched(None) ==" in text)
