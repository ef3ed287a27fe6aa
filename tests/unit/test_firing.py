"""record/firing.py: a periodic action's periodic part is true at its first test, and only
that part: the rest of the test (a rank test) is the script's."""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ncclcheck.lint.periodic import actions_to_fire
from ncclcheck.record.firing import Firing

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
