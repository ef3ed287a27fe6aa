"""preflight says aligned only for what it ran (explain/coverage.py), on real ranks: a
checkpoint every N steps past the dry run's budget (made to fire within it, record/firing.py,
or said as not run), train passes that end at different steps on different ranks, what
runs at an epoch's end (its last, uneven batch; a test on its last step), and a
collective reached by formatting a value, each with its fixed twin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import SCRIPTS, aligned_but_for_decisions, line_in
from .test_preflight import preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)

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


def test_train_passes_that_end_at_different_steps_part_at_the_epoch_end_the_dry_run_ran() -> None:
    # batches packed to a token budget after the sampler's split: rank 1 has 12 fewer.
    # The pass is fast-forwarded to its end, where the ranks part for real.
    proc, report = preflight("--nproc-per-node=2", str(TOKEN_BUDGET), env={"MODE": "broken"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert "different numbers of batches per rank (rank 0: 249, rank 1: 237)" in finding["message"], finding
    assert "the dry run ran the epoch's end" in finding["message"], finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert (
        finding["site"] == f"tests/scripts/token_budget_batches.py:{line_in(TOKEN_BUDGET, 'loss.backward()')}"
    )

    # the pass cut after its head, as before: the lengths the loaders told decide
    proc, report = preflight(
        "--nproc-per-node=2", "--train-end-batches=0", str(TOKEN_BUDGET), env={"MODE": "broken"}
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    assert "(the dry run stopped each pass before its end; the lengths" in finding["message"], finding

    proc, report = preflight("--nproc-per-node=2", str(TOKEN_BUDGET), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), report
    assert any(
        line.startswith("train loader loader: the first 5 and the last batches of 242 of its first pass ran")
        and line.endswith("to its end on every rank")
        for line in report["summary"]["covered"]
    ), report["summary"]


def found_in_broken_and_fixed_aligned(script: Path) -> dict[str, Any]:
    """The first finding on ``script`` with MODE=broken (exit 1); its MODE=fixed twin aligned,
    but for the broken side's decision the file still holds (aligned_but_for_decisions)."""
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "broken"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    fixed_proc, fixed = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    aligned_but_for_decisions(fixed_proc.returncode, fixed)
    finding: dict[str, Any] = report["findings"][0]
    return finding


def test_a_batch_sampler_whose_len_is_an_estimate_is_counted_and_its_end_run() -> None:
    # len() is the same estimate on both ranks; what the samplers yield differs
    finding = found_in_broken_and_fixed_aligned(SCRIPTS / "bucketed_estimated_len.py")
    assert finding["cause"] == "uneven-eval-batches", finding
    assert "(rank 0: 261, rank 1: 273)" in finding["message"], finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    assert any("its len() is an estimate" in line for line in finding["evidence"]), finding


def test_the_last_uneven_batch_runs_and_its_gather_of_another_shape_is_found() -> None:
    script = SCRIPTS / "last_batch_gather.py"
    finding = found_in_broken_and_fixed_aligned(script)
    assert finding["cause"] == "collective-shape-mismatch", finding
    gather = line_in(script, "dist.all_gather(parts, predictions)")
    assert finding["site"] == f"tests/scripts/last_batch_gather.py:{gather}"
    assert any("loader batch 401" in line for line in finding["evidence"]), finding


def test_enumerate_gives_the_loaders_positions_so_the_last_step_test_runs() -> None:
    # `if i == len(loader) - 1:` runs at the epoch's end only: enumerate counts the
    # positions of a fast-forwarded pass, so the summary only rank 0 reduces is reached
    script = SCRIPTS / "epoch_summary_last_step.py"
    finding = found_in_broken_and_fixed_aligned(script)
    assert finding["cause"] == "rank-conditional-collective", finding
    reduce = line_in(script, "# the others are already")
    assert finding["site"] == f"tests/scripts/epoch_summary_last_step.py:{reduce}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


def test_a_collective_reached_by_formatting_a_meter_on_rank_0_is_named_with_its_chain() -> None:
    # print(f"... {meter}") on rank 0: __format__ -> __str__ -> the global_avg property ->
    # all_reduce. The rank test is the cause, not a straggler, and the chain is shown.
    script = SCRIPTS / "meter_logged_on_rank0.py"
    finding = found_in_broken_and_fixed_aligned(script)
    assert finding["cause"] == "rank-conditional-collective", finding
    reduce = line_in(script, "dist.all_reduce(both)")
    assert finding["site"] == f"tests/scripts/meter_logged_on_rank0.py:{reduce}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    chain = next(line for line in finding["evidence"] if line.startswith("call chain on rank 0"))
    assert "__str__()" in chain and "global_avg()" in chain, chain
    assert any(line.startswith("`if rank == 0` at") for line in finding["evidence"]), finding


def test_a_decision_on_a_rank_seeded_random_draw_is_named_with_what_each_rank_drew() -> None:
    # random.seed(1234 + rank), then `if draw < LOG_PROBABILITY:` around an all_gather:
    # the replay shows the test and the value each rank read
    script = SCRIPTS / "random_sample_logging.py"
    finding = found_in_broken_and_fixed_aligned(script)
    assert finding["cause"] == "unsynchronized-decision", finding
    gather = line_in(script, "dist.all_gather(samples")
    assert finding["site"] == f"tests/scripts/random_sample_logging.py:{gather}"
    assert (
        "under `if draw < LOG_PROBABILITY`, a test each rank answers for itself (a random draw"
        in (finding["message"])
    ), finding
    read = next(line for line in finding["evidence"] if line.startswith("what the test read last:"))
    assert "draw = " in read and "on rank 0" in read and "on rank 1" in read, read


def test_doctor_names_the_same_random_decision_on_the_hung_job() -> None:
    # the same script hung under plain torchrun: doctor reads the draw's assignment
    from .test_doctor import doctor_on_hung

    script = SCRIPTS / "random_sample_logging.py"
    code, report = doctor_on_hung(script, 2)
    assert code == 1, report
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision", finding
    assert finding["site"].endswith(
        f"tests/scripts/random_sample_logging.py:{line_in(script, 'dist.all_gather(samples')}"
    )
    assert "a test each rank answers for itself (a random draw" in finding["message"], finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


def test_an_early_stop_on_each_ranks_own_loss_is_forced_on_one_rank_and_its_twin_aligned() -> None:
    """The patience counter runs out on no rank within the dry run's budget: the ranks did
    not part, but a real run's ranks can. preflight runs again with rank 1 made to take the
    stop alone, at the test's first evaluation: rank 1 leaves the epoch loop, rank 0 waits
    in the next epoch's gradient all-reduce. The decision is the cause and its test the
    site. The twin decides on the all-reduced loss: nothing to force, aligned."""
    broken = SCRIPTS / "patience_on_local_loss.py"
    decided = line_in(broken, "if stopper.should_stop(loss.item()):")
    proc, report = preflight("--nproc-per-node=2", str(broken))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"]) == (
        "unsynchronized-decision",
        f"tests/scripts/patience_on_local_loss.py:{decided}",
    ), finding
    forced = "its test made true on rank 1 alone, from its first test in main() on"
    assert forced in finding["message"], finding
    backward = line_in(SCRIPTS / "patience_trainer.py", ".backward()")
    assert (
        finding["evidence"][0] == f"the ranks then parted at tests/scripts/patience_trainer.py:{backward}"
    ), finding
    assert "rank 1: no call (it ran to the end of the script)" in finding["evidence"], finding
    (forced,) = report["summary"]["forced"]
    assert forced.startswith(
        f"tests/scripts/patience_on_local_loss.py:{decided}: its test made true on rank 1"
    ), forced
    assert "not_run" not in report["summary"], report["summary"]

    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "patience_on_reduced_loss.py"))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
    assert "forced" not in report["summary"], report["summary"]


def test_a_stop_on_each_ranks_own_epoch_mean_is_a_decision_forced_on_one_rank_and_its_twin_aligned() -> None:
    """`if math.isfinite(epoch_loss) and epoch_loss < TARGET: break`, the epoch's mean of
    each rank's own batches: a data test in form, a decision in fact (never met in a dry
    run). Forced on rank 1, it parts the ranks at the next epoch's gradient all-reduce, the
    cause a decision, not a test of the batch. The twin all-reduces the sum and count first."""
    broken = SCRIPTS / "stops_at_its_epoch_mean.py"
    decided = line_in(broken, "if math.isfinite(epoch_loss) and epoch_loss < TARGET_LOSS:")
    proc, report = preflight("--nproc-per-node=2", str(broken))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"]) == (
        "unsynchronized-decision",
        f"tests/scripts/stops_at_its_epoch_mean.py:{decided}",
    ), finding
    assert "its test made true on rank 1 alone" in finding["message"], finding

    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "stops_at_the_reduced_epoch_mean.py"))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
    assert "forced" not in report["summary"], report["summary"]


def test_a_callbacks_stop_flag_set_from_each_ranks_own_metrics_is_forced_and_named_twin_aligned() -> None:
    """A class trainer reads `if self.should_stop: break`; an early-stopping callback, handed
    the metrics of a validate() that all-reduces nothing, sets `trainer.should_stop = True`
    when its patience runs out. The flag's test is the decision preflight forces; the line
    that decided it, the callback's, is named. The twin all-reduces the loss in validate()."""
    broken = SCRIPTS / "callback_stops_the_trainer.py"
    tested = line_in(broken, "if self.should_stop:")
    decided = line_in(broken, "trainer.should_stop = True")
    proc, report = preflight("--nproc-per-node=2", str(broken))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"]) == (
        "unsynchronized-decision",
        f"tests/scripts/callback_stops_the_trainer.py:{tested}",
    ), finding
    assert "its test made true on rank 1 alone" in finding["message"], finding
    assert (
        f"`should_stop` is set at tests/scripts/callback_stops_the_trainer.py:{decided} in "
        "EarlyStopping.on_validation_end() under `self.bad_epochs >= self.patience`"
    ) in finding["message"], finding

    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "callback_stops_the_trainer_on_the_mean.py"))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
    assert "forced" not in report["summary"], report["summary"]


def test_an_early_stop_on_the_loss_of_a_holdout_slice_chosen_by_rank_is_forced_and_its_twin_aligned() -> None:
    """`if stopper.should_stop(loss): break` where the loss is scored on `rows[rank * n:
    (rank + 1) * n]`: lint reads the test through the rank (rank-early-exit), but it tests
    a value computed from what the rank holds, which moves as the model trains: forced on
    rank 1 like any decision on a rank's own value, never taken for a rank test that the
    dry run took as the real run will. Its twin averages the loss over the ranks first."""
    broken = SCRIPTS / "holdout_shard_patience.py"
    decided = line_in(broken, "if stopper.should_stop(loss):")
    proc, report = preflight("--nproc-per-node=2", str(broken))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"], finding["ranks"], finding["absent_ranks"]) == (
        "rank-early-exit",
        f"tests/scripts/holdout_shard_patience.py:{decided}",
        [1],
        [0],
    ), finding
    assert "its test made true on rank 1 alone" in finding["message"], finding
    (forced,) = report["summary"]["forced"]
    assert forced.startswith(f"tests/scripts/holdout_shard_patience.py:{decided}: its test made true"), forced

    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "holdout_shard_patience_mean.py"))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_an_early_stop_not_forced_is_listed_with_the_side_each_rank_took() -> None:
    """--no-force-decisions: the decision is said not checked (partial, exit 5), with what
    its test did on each rank in the dry run, never aligned."""
    broken = SCRIPTS / "patience_on_local_loss.py"
    proc, report = preflight("--nproc-per-node=2", "--no-force-decisions", str(broken))
    assert proc.returncode == 5, (proc.stderr[-2000:], report)
    assert report["verdict"] == "partial" and not report["findings"], report
    decided = line_in(broken, "if stopper.should_stop(loss.item()):")
    (gap,) = [g for g in report["summary"]["not_run"] if "a decision each rank takes" in g]
    assert gap.startswith(f"tests/scripts/patience_on_local_loss.py:{decided}: a decision each rank takes"), (
        gap
    )
    assert "in the dry run its test was false each time on ranks 0-1" in gap, gap


def test_a_patience_count_kept_from_each_ranks_own_loss_is_forced_and_its_twin_on_the_mean_aligned() -> None:
    """`bad += 1` under `if val_loss < best`: the count takes the difference of each rank's
    loss (lint reads it through the test it is kept under), though the test that stops
    reads only the count, alike on every rank within a dry run (0 at first). Forced on
    rank 1, the stop parts the ranks; the twin counts on the loss averaged over every rank:
    nothing to force."""
    broken = SCRIPTS / "patience_counter.py"
    proc, report = preflight("--nproc-per-node=2", str(broken))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"]) == (
        "unsynchronized-decision",
        f"tests/scripts/patience_counter.py:{line_in(broken, 'if bad >= patience:')}",
    ), finding
    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "patience_counter_on_mean.py"))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_skip_harmless_at_its_first_test_is_forced_on_to_the_micro_batch_that_synchronises(
    tmp_path: Path,
) -> None:
    """No loss is non-finite in the dry run. The forced run makes rank 1 take the `continue`
    at every test from the first on: at the first micro-batch (under no_sync) it skips no
    collective, at the fourth it skips the gradient all-reduce, and the ranks part. Turned
    once, at the first test only, the run would stay aligned. The twin without the skip is
    aligned."""
    script = SCRIPTS / "accumulates_and_skips_a_nonfinite_loss.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, (proc.stderr[-2000:], report)
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    assert finding["site"] == f"tests/scripts/{script.name}:{line_in(script, 'if not torch.isfinite(loss):')}"
    fixed = tmp_path / script.name
    skip = "            if not torch.isfinite(loss):\n                continue\n"
    assert skip in script.read_text()
    fixed.write_text(script.read_text().replace(skip, ""))
    proc, report = preflight("--nproc-per-node=2", str(fixed))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
