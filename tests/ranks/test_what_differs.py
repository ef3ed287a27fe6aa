"""The same call on every rank, with another value: preflight names what differs and where
it comes from (source/origins.py), on real ranks, each with its fixed twin. A loop over a
set meets its items in each process's own order (a collective-order-mismatch, fixed by
sorting), as does a dict filled on first sight (fixed by creating its keys up front), a
tensor cut by each rank's own mask has each rank's own length (a
collective-shape-mismatch, fixed by padding to the gathered longest). And where only the
groups' order seems to differ, a cycle across a side group and the default one, a rank
test that sent one rank to the side group's call alone is the answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..conftest import SCRIPTS, line_in
from .test_preflight import preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)


def test_a_loop_over_a_set_of_names_is_an_order_mismatch_traced_to_the_set() -> None:
    script = SCRIPTS / "metrics_over_a_set.py"
    # ten names: two processes' hash seeds order them alike about never; asked warm, torchrun
    # starts them all the same (below)
    proc, report = preflight("--warm-start", "--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-order-mismatch", finding
    assert (
        finding["site"] == f"tests/scripts/metrics_over_a_set.py:{line_in(script, 'dist.all_reduce(matrix)')}"
    )
    assert "whose items come from a set (`set(CLASSES) - set(" in finding["message"], finding
    (came,) = [e for e in finding["evidence"] if e.startswith("where the loop's items come from")]
    built = line_in(script, "enabled = set(CLASSES)")
    assert f"at tests/scripts/metrics_over_a_set.py:{built}" in came, came
    assert "sorted(" in finding["fix"], finding["fix"]
    # forked ranks would share one string-hash seed, and so the set's order: torchrun's
    assert report["summary"]["launcher"].startswith(
        f"--warm-start not used: tests/scripts/metrics_over_a_set.py:{line_in(script, 'confusions = {task')}"
    ), report["summary"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_dict_that_takes_each_head_on_first_sight_is_an_order_mismatch_traced_to_its_filling() -> None:
    """A dict keeps its keys in insertion order: created on first sight (setdefault), the
    per-head counts are in the order each rank's own shard met the heads. Its twin creates
    every head's counts up front."""
    script = SCRIPTS / "heads_met_in_data_order.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-order-mismatch", finding
    reduced = line_in(script, "dist.all_reduce(slots)")
    assert finding["site"] == f"tests/scripts/heads_met_in_data_order.py:{reduced}"
    filled = line_in(script, "counts.setdefault(head")
    assert "takes each key the first time the process meets it (`counts.setdefault(head" in finding["message"]
    assert f"heads_met_in_data_order.py:{filled}" in finding["message"], finding["message"]
    assert "up front" in finding["fix"], finding["fix"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_gather_of_each_ranks_masked_rows_names_the_mask_and_its_padded_twin_is_aligned() -> None:
    script = SCRIPTS / "gather_masked_predictions.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-shape-mismatch", finding
    masked = line_in(script, "kept = predictions[labels >= 0]")
    assert any(
        e.startswith("`kept` comes from `kept = predictions[labels >= 0]` at ")
        and f"gather_masked_predictions.py:{masked}" in e
        for e in finding["evidence"]
    ), finding["evidence"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_masked_pieces_joined_in_a_helper_are_named_through_its_return_and_the_padded_twin_aligned() -> None:
    """The gathered tensor is unpacked from a helper's result (`scores, seen =
    labelled_scores(batches)`), whose `return torch.cat(kept), seen` joins pieces each cut
    by the rank's own mask: the message names the mask, the deepest origin the source shows."""
    script = SCRIPTS / "masked_scores_helper.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    gathered = line_in(script, "dist.all_gather(parts, t)")
    assert (finding["cause"], finding["site"]) == (
        "collective-shape-mismatch",
        f"tests/scripts/masked_scores_helper.py:{gathered}",
    ), finding
    cut = line_in(script, "kept.append(scores[labelled])")
    assert (
        f"`t` comes from `kept.append(scores[labelled])` at tests/scripts/masked_scores_helper.py:{cut}, "
        "a size each rank's own data gives" in finding["message"]
    ), finding["message"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_sharded_models_forward_on_rank_zero_alone_is_named_at_the_model_call_and_its_twin_aligned() -> (
    None
):
    """fully_shard: a forward all-gathers the parameters from every rank, so a preview on
    rank 0 alone is a rank-conditional collective, sited at the model's call in the user's
    code (not in FSDP's internals); the twin previews on every rank."""
    script = SCRIPTS / "fsdp2_preview_on_rank0.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    forward = line_in(script, "predicted = model(samples)")
    assert finding["site"] == f"tests/scripts/fsdp2_preview_on_rank0.py:{forward}", finding
    assert "FSDP2 (fully_shard)" in finding["message"], finding

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_save_on_the_main_process_that_totals_on_a_side_group_is_the_rank_test_not_an_order(
    tmp_path: Path,
) -> None:
    """Rank 0 alone saves, and its save all-reduces on a gloo side group while rank 1 went on
    to the next epoch's gradients: a cycle across the two groups, but no order differs; the
    `if self.is_main` that sent rank 0 there decided (fresh w01). Its twin totals on every
    rank and writes on rank 0 alone, with the broken path kept behind MODE and without it."""
    script = SCRIPTS / "side_group_save_on_main.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    where = "tests/scripts/side_group_save_on_main.py"
    assert finding["site"] == f"{where}:{line_in(script, 'dist.all_reduce(t, group=self.side)')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    guard = line_in(script, "elif self.is_main:")
    assert f"`if self.is_main` at {where}:{guard} sends rank 0 to it" in finding["evidence"], finding
    assert "each side waits for the other in a different process group: a cycle" in finding["evidence"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)
    fixed = tmp_path / "totals_on_every_rank.py"
    fixed.write_text(
        script.read_text().replace(
            """                elif self.is_main:
                    self.save(loss, self.total(self.seen))
""",
            "",
        )
    )
    proc, report = preflight("--nproc-per-node=2", str(fixed), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_meters_states_built_in_init_from_a_modules_set_are_an_order_mismatch(tmp_path: Path) -> None:
    """The loop in sync() iterates self.states, which __init__ builds from a module-level
    set through a conditional: followed back to the set, and warm forking (one shared hash
    seed, one order) declined for it. Its twin builds the states sorted, on every path (a
    switch that sorts on one path leaves the set on the other: partial, as lint reads it)."""
    script = SCRIPTS / "meter_states_from_a_set.py"
    proc, report = preflight("--warm-start", "--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-order-mismatch", finding
    assert (
        finding["site"]
        == f"tests/scripts/meter_states_from_a_set.py:{line_in(script, 'dist.all_reduce(state)')}"
    )
    (came,) = [e for e in finding["evidence"] if e.startswith("where the loop's items come from")]
    for built in ("self.states = {name", "names = sorted(STATE_NAMES)", "STATE_NAMES = {"):
        assert f"meter_states_from_a_set.py:{line_in(script, built)}" in came, came
    assert report["summary"]["launcher"].startswith("--warm-start not used"), report["summary"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (5, "partial"), (proc.stderr[-2000:], report)
    fixed = tmp_path / "meter_states_sorted.py"
    fixed.write_text(
        script.read_text().replace(
            'sorted(STATE_NAMES) if os.environ.get("MODE") == "fixed" else STATE_NAMES', "sorted(STATE_NAMES)"
        )
    )
    proc, report = preflight("--nproc-per-node=2", str(fixed))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_skip_on_a_step_functions_none_is_sited_at_the_data_test_that_returned_it() -> None:
    """`if loss is None: continue` passes on the step's `if not all_finite(batch): return
    None`, a test of the data through a helper of the file: that test decides. Its twin keeps
    every rank in the step."""
    script = SCRIPTS / "step_returns_none_on_bad_data.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    decided = line_in(script, "if not all_finite(batch)")
    assert finding["site"] == f"tests/scripts/step_returns_none_on_bad_data.py:{decided}", finding
    assert any("after a None returned under `if not all_finite(batch)" in e for e in finding["evidence"]), (
        finding
    )

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_buffers_a_property_names_as_a_set_part_the_ranks_at_other_branches_of_one_loop(
    tmp_path: Path,
) -> None:
    """Float buffers all-reduced and counters broadcast, in the order of a set a property
    returns: the ranks are at one pass of the loop with other items, one in all_reduce, the
    other in broadcast. Where their orders agree (one PYTHONHASHSEED for all), the run is
    partial, the loop named as what it could not vouch for; the sorted twin is aligned."""
    script = SCRIPTS / "buffers_named_by_a_property.py"
    # five floats and five counters: two hash seeds give one pattern of the two about 1 in 252
    _report, finding = _first_error(script, "collective-order-mismatch")
    loop = line_in(script, "for name in self.buffer_names")
    assert (
        f"loop over `self.buffer_names` at tests/scripts/buffers_named_by_a_property.py:{loop}"
        in (finding["message"])
    ), finding["message"]
    assert "take other branches" in finding["message"], finding["message"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"PYTHONHASHSEED": "0"})
    assert (proc.returncode, report["verdict"]) == (5, "partial"), (proc.stderr[-2000:], report)
    reduced = line_in(script, "dist.all_reduce(tensor)")
    assert any(
        gap.startswith(f"tests/scripts/buffers_named_by_a_property.py:{reduced}:") and "by chance" in gap
        for gap in report["summary"]["not_run"]
    ), report["summary"]

    fixed = tmp_path / "buffers_named_sorted.py"
    fixed.write_text(
        script.read_text()
        .replace("return set(", "return sorted(set(")
        .replace("named_parameters()}\n", "named_parameters()})\n")
    )
    proc, report = preflight("--nproc-per-node=2", str(fixed))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_a_record_a_rank_skips_in_its_except_is_forced_and_named_at_the_except(tmp_path: Path) -> None:
    """No record fails in the dry run, so no rank enters the `except ...: continue`; the
    run in which rank 1 alone catches an error there parts the ranks at the all-reduce the
    `continue` skips: rank-exception at the except. The twin that contributes a zero for the
    failed record and still calls the collective is aligned."""
    script = SCRIPTS / "skips_a_record_that_fails.py"
    report, finding = _first_error(script, "rank-exception")
    assert finding["site"] == f"tests/scripts/{script.name}:{line_in(script, 'except ValueError')}"
    assert any("raised on rank 1 alone" in said for said in report["summary"]["forced"]), report["summary"]

    fixed = tmp_path / "contributes_a_zero.py"
    fixed.write_text(
        script.read_text().replace("            continue\n", "            value = torch.zeros(4)\n")
    )
    proc, report = preflight("--nproc-per-node=2", str(fixed))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def _first_error(script: Path, cause: str) -> tuple[dict, dict]:  # type: ignore[type-arg]
    """preflight on ``script`` at two ranks: exit 1, its first finding of ``cause``."""
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    return report, finding
