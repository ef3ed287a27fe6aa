"""record/firing.py: a periodic action's periodic part is true at its first test, and only
that part: the rest of the test (a rank test) is the script's."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ncclcheck.lint.periodic import actions_to_fire
from ncclcheck.record.firing import Decisions, Firing

SOURCE = """\
import torch.distributed as dist

def run(rank, steps):
    saved, logged = [], []
    for step in range(1, steps + 1):
        if step % 1000 == 0:
            dist.barrier()
            saved.append(step)
        if rank == 0 and not step % 500:
            dist.all_reduce(None)
            logged.append(step)
    return saved, logged
"""


@pytest.fixture
def script(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "train.py"
    path.write_text(SOURCE)
    yield path
    if hasattr(builtins, "__ncclcheck_fire__"):
        delattr(builtins, "__ncclcheck_fire__")


def _run(
    script: Path, rank: int, steps: int
) -> tuple[tuple[list[int], list[int]], list[tuple[int, str, bool]]]:
    noted: list[tuple[int, str, bool]] = []
    firing = Firing(
        actions_to_fire(script), lambda file, line, function, forced: noted.append((line, function, forced))
    )
    code = firing.compile(script.read_text(), str(script))
    assert code is not None
    builtins.__ncclcheck_fire__ = firing.fire  # type: ignore[attr-defined]
    namespace: dict[str, object] = {"__name__": "train"}
    exec(code, namespace)
    # no process group here: the module's dist is swapped for one that does nothing
    namespace["dist"] = SimpleNamespace(barrier=lambda: None, all_reduce=lambda _: None)
    return namespace["run"](rank, steps), noted  # type: ignore[operator]


def test_both_periodic_actions_are_found_before_the_run(script: Path) -> None:
    assert actions_to_fire(script) == [(str(script.resolve()), 6), (str(script.resolve()), 9)]


def test_the_periodic_part_fires_once_at_its_first_test_then_keeps_its_own_value(script: Path) -> None:
    (saved, logged), noted = _run(script, rank=0, steps=3)
    assert (saved, logged) == ([1], [1])  # made to fire at step 1, never again within 3 steps
    assert noted == [(6, "run", True), (9, "run", True)]


def test_the_rank_test_around_a_periodic_part_is_left_as_written(script: Path) -> None:
    (saved, logged), noted = _run(script, rank=1, steps=3)
    assert (saved, logged) == ([1], [])  # rank 1 never logs: its rank test is the script's
    assert noted == [(6, "run", True)]


def test_a_part_true_at_its_first_test_is_said_to_have_fired_of_itself(script: Path) -> None:
    script.write_text(SOURCE.replace("range(1, steps + 1)", "range(steps)"))
    (saved, logged), noted = _run(script, rank=0, steps=3)
    assert (saved, logged) == ([0], [0])
    assert noted == [(6, "run", False), (9, "run", False)]


def test_a_file_that_lists_no_action_is_compiled_as_always(script: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    firing = Firing(actions_to_fire(script), lambda *_: None)
    assert firing.compile(other.read_text(), str(other)) is None


DECIDING = """\
def run(losses, stopper):
    seen = []
    for loss in losses:
        seen.append(loss)
        if stopper(loss):
            break
    return seen
"""


def _decide(
    tmp_path: Path, force: tuple[str, int] | None, losses: list[float]
) -> tuple[list[float], list[tuple[int, bool, bool]], list[tuple[int, str, bool]]]:
    path = tmp_path / "decide.py"
    path.write_text(DECIDING)
    noted: list[tuple[int, bool, bool]] = []
    reads: list[tuple[int, str, bool]] = []
    decisions = Decisions(
        [(str(path), 5)],
        (str(path), 5) if force else None,
        lambda file, line, function, taken, forced: noted.append((line, taken, forced)),
        note_read=lambda file, line, count, digest, fraction: reads.append((count, digest, fraction)),
    )
    code = Firing([], lambda *_: None, decisions).compile(path.read_text(), str(path))
    assert code is not None
    builtins.__ncclcheck_decide__ = decisions.decide  # type: ignore[attr-defined]
    builtins.__ncclcheck_read__ = decisions.read  # type: ignore[attr-defined]
    try:
        namespace: dict[str, object] = {"__name__": "decide"}
        exec(code, namespace)
        seen = namespace["run"](losses, lambda loss: loss > 100.0)  # type: ignore[operator]
    finally:
        del builtins.__ncclcheck_decide__  # type: ignore[attr-defined]
        del builtins.__ncclcheck_read__  # type: ignore[attr-defined]
    return seen, noted, reads


def test_a_watched_decision_notes_each_side_the_first_time_and_keeps_its_value(tmp_path: Path) -> None:
    seen, noted, reads = _decide(tmp_path, None, [1.0, 2.0, 200.0, 3.0])
    assert seen == [1.0, 2.0, 200.0]  # the script's own stop, unchanged
    assert noted == [(5, False, False), (5, True, False)]
    assert [count for count, _, _ in reads] == [1, 2]  # what it read, after 1 and 2 evaluations (of 3)


def test_a_forced_decision_takes_the_other_side_at_every_test(tmp_path: Path) -> None:
    seen, noted, _ = _decide(tmp_path, ("forced", 5), [1.0, 2.0, 3.0])
    assert seen == [1.0]  # stopped at its first test, which was false
    assert noted[0] == (5, True, True)  # noted as forced once, the first time
    # a test true at first and false after: turned each time, it is false then true
    seen, noted, _ = _decide(tmp_path, ("forced", 5), [200.0, 300.0, 1.0])
    assert seen == [200.0, 300.0, 1.0] and noted[0] == (5, False, True)


def test_what_a_test_read_is_the_same_only_for_the_same_values(tmp_path: Path) -> None:
    first = _decide(tmp_path, None, [1.5, 2.0])[2]
    same = _decide(tmp_path, None, [1.5, 2.0])[2]
    other = _decide(tmp_path, None, [1.5, 2.5])[2]
    counts = _decide(tmp_path, None, [1.0, 2.0])[2]
    assert first == same and first[0] == other[0] and first[1] != other[1]  # the second loss differs
    assert all(fraction for _, _, fraction in first)  # 1.5 is a fraction: no coincidence
    assert not any(fraction for _, _, fraction in counts)  # whole numbers agree by chance often


CATCHING = """\
def load(record):
    return record["label"]

def run(records):
    kept = []
    for record in records:
        try:
            kept.append(load(record))
        except KeyError:
            continue
    return kept
"""


def test_a_handler_notes_the_first_error_it_catches_and_where_it_was_raised(tmp_path: Path) -> None:
    path = tmp_path / "catch.py"
    path.write_text(CATCHING)
    noted: list[tuple[int, str, str, tuple[str, int, str] | None]] = []
    decisions = Decisions(
        [],
        None,
        lambda *_: None,
        [str(path)],
        lambda file, line, function, error, raised: noted.append((line, function, error, raised)),
    )
    code = Firing([], lambda *_: None, decisions).compile(path.read_text(), str(path))
    assert code is not None
    builtins.__ncclcheck_caught__ = decisions.caught  # type: ignore[attr-defined]
    try:
        namespace: dict[str, object] = {"__name__": "catch"}
        exec(code, namespace)
        kept = namespace["run"]([{"label": 1}, {}, {"other": 2}])  # type: ignore[operator]
    finally:
        del builtins.__ncclcheck_caught__  # type: ignore[attr-defined]
    assert kept == [1]  # the handler still continues
    assert noted == [(9, "run", "KeyError: 'label'", (str(path), 2, "load"))]  # once, the first
