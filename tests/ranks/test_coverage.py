"""preflight says aligned only for what it ran (explain/coverage.py), on real ranks: a
checkpoint every N steps past the dry run's budget (made to fire within it, record/firing.py,
or said as not run), and train passes that end at
different steps on different ranks, each with its fixed twin."""

from __future__ import annotations

import pytest

from ..conftest import SCRIPTS, line_in
from .test_preflight import preflight

pytestmark = pytest.mark.ranks

CHECKPOINT = SCRIPTS / "checkpoint_every_n_steps.py"
TOKEN_BUDGET = SCRIPTS / "token_budget_batches.py"


def test_a_checkpoint_every_n_steps_past_the_budget_is_partial_when_not_made_to_fire() -> None:
    # 5 steps a pass, a save every 200, --no-fire-periodic: the save and its barrier never ran
    proc, report = preflight(
        "--nproc-per-node=2", "--no-fire-periodic", str(CHECKPOINT), env={"MODE": "broken"}
    )
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert (report["verdict"], report["findings"]) == ("partial", []), report
    if_line = line_in(CHECKPOINT, "if step % SAVE_EVERY == 0:")
    (gap,) = report["summary"]["not_run"]
    assert gap.startswith(
        f"`if step % SAVE_EVERY == 0` at tests/scripts/checkpoint_every_n_steps.py:{if_line} never fired "
        "in the dry run: it reaches dist.barrier (save_checkpoint() called at"
    ), gap


@pytest.mark.parametrize(("mode", "code"), [("broken", 1), ("fixed", 0)])
def test_a_checkpoint_every_n_steps_is_made_to_fire_the_broken_save_is_found_and_the_fixed_is_aligned(
    mode: str, code: int
) -> None:
    # the default budget (5 steps) and a save every 200: the save fires at its first test
    proc, report = preflight("--nproc-per-node=2", str(CHECKPOINT), env={"MODE": mode})
    assert proc.returncode == code, (proc.stderr[-2000:], report)
    fired = line_in(CHECKPOINT, "if step % SAVE_EVERY == 0:")
    assert (
        f"`if step % SAVE_EVERY == 0` at tests/scripts/checkpoint_every_n_steps.py:{fired} was made to fire "
        "at its first test (its own step was not reached): its collectives ran"
        in report["summary"]["covered"]
    ), report["summary"]
    if mode == "fixed":
        assert report["verdict"] == "aligned", report
        assert "not_run" not in report["summary"], report["summary"]
        return
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    assert finding["cause"] == "rank-exception", finding
    assert (
        finding["site"]
        == f"tests/scripts/checkpoint_every_n_steps.py:{line_in(CHECKPOINT, 'dist.barrier()  #')}"
    )
    assert finding["absent_ranks"] == [1], finding


def test_train_passes_that_end_at_different_steps_are_found_before_the_end_runs() -> None:
    proc, report = preflight("--nproc-per-node=2", str(TOKEN_BUDGET), env={"MODE": "broken"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    assert finding["cause"] == "uneven-eval-batches", finding
    assert "different numbers of batches per rank (rank 0: 249, rank 1: 237)" in finding["message"], finding

    proc, report = preflight("--nproc-per-node=2", str(TOKEN_BUDGET), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), report
    assert any(
        "of 242 batches a pass ran; the same length on every rank" in line
        for line in report["summary"]["covered"]
    )
