"""Line evidence on real ranks: preflight replays the dry run up to the divergence,
traces the functions on its call chains, and names the construct that decided with
the value or exception that decided it (explain/lines.py, record/lines.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..conftest import SCRIPTS, line_in
from .test_preflight import preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)


def evidence_of(finding: dict[str, object]) -> str:
    return "\n".join(finding["evidence"])  # type: ignore[arg-type]


def test_an_exception_a_handler_swallowed_in_the_eval_loop_is_named_with_its_message() -> None:
    script = SCRIPTS / "eval_decode_error.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-exception", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert finding["site"] == f"tests/scripts/eval_decode_error.py:{line_in(script, 'dist.all_reduce(loss)')}"
    handler = f"tests/scripts/eval_decode_error.py:{line_in(script, 'except ValueError as exc')}"
    assert finding["message"].startswith(
        f"rank 1 entered the `except ValueError` at {handler} with ValueError: record 2: truncated JPEG"
    )
    raised = f"tests/scripts/eval_decode_error.py:{line_in(script, 'raise ValueError')}"
    text = evidence_of(finding)
    assert f"rank 1 raised ValueError: record 2: truncated JPEG at {raised} in decode() (once)" in text
    assert f"the handler `except ValueError` at {handler} ran once on rank 1, 0 times on rank 0" in text
    assert "the error was swallowed" in text
    assert finding["fix"].startswith("Keep the collective outside the try")  # rank-exception's own


def test_an_early_return_on_the_data_two_calls_below_the_loop_shows_the_value_it_read() -> None:
    script = SCRIPTS / "helper_return_on_data.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    # the source reads the test as one on the data (a reduction of the batch); the line
    # evidence shows which side each rank took and the values it read there
    assert finding["cause"] == "data-dependent-branch", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    exit_line = line_in(script, "        return")
    where = f"tests/scripts/helper_return_on_data.py:{exit_line}"
    assert finding["message"].startswith(f"rank 1 left step() early through the `return` at {where}")
    text = evidence_of(finding)
    assert (
        f"`return` under `if batch.abs().max() > 100` at {where} ran once on rank 1, 0 times on rank 0"
        in text
    )
    assert "batch = tensor float32[4, 4], from" in text and "to 1e+06" in text


def test_an_exception_swallowed_one_module_away_is_traced_to_the_line_that_raised() -> None:
    folder = SCRIPTS / "swallowed_elsewhere"
    proc, report = preflight("--nproc-per-node=2", str(folder / "train.py"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-exception", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    helpers = folder / "eval_utils.py"
    raised = f"tests/scripts/swallowed_elsewhere/eval_utils.py:{line_in(helpers, '- record[')}"
    handler = f"tests/scripts/swallowed_elsewhere/eval_utils.py:{line_in(helpers, 'except KeyError')}"
    text = evidence_of(finding)
    assert f"rank 1 raised KeyError: 'target' at {raised} in score()" in text
    assert f"the handler `except KeyError` at {handler} ran once on rank 1" in text


def test_a_skipped_step_shows_the_loss_that_was_not_finite() -> None:
    script = SCRIPTS / "skip_step_on_nonfinite_loss.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    skip = f"tests/scripts/skip_step_on_nonfinite_loss.py:{line_in(script, 'continue')}"
    text = evidence_of(finding)
    assert (
        f"`continue` under `if not torch.isfinite(loss)` at {skip} ran once on rank 1, 0 times on rank 0"
        in text
    )
    assert "loss = tensor([inf]) float32" in text


def test_a_batch_count_computed_from_the_rank_is_named_at_the_loop_whose_length_differs() -> None:
    script = SCRIPTS / "per_rank_batch_count.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    loop = f"tests/scripts/per_rank_batch_count.py:{line_in(script, 'for _ in range(num_batches)')}"
    text = evidence_of(finding)
    assert (
        f"the loop `for _ in range(num_batches)` at {loop} ran 5 passes on rank 0, 4 passes on rank 1" in text
    )
    assert "rank 0: num_batches = 5; rank 1: num_batches = 4" in text
    assert "computed from the rank" in text


def test_a_script_that_does_not_replay_the_same_is_told_and_its_lines_are_not_used(tmp_path: Path) -> None:
    script = SCRIPTS / "replays_differently.py"
    runs = tmp_path / "runs"
    proc, report = preflight("--nproc-per-node=2", str(script), env={"REPRO_RUNS_FILE": str(runs)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert runs.read_text() == "2"  # the first run and its replay
    finding = report["findings"][0]
    text = evidence_of(finding)
    assert (
        "line evidence not used: the replay did not run as the first run did (rank 1's call #3 was barrier"
        in (text)
    ), text
    assert "line evidence from a replay" not in text
    assert not any(name.startswith("lines-") for name in os.listdir(tmp_path))
