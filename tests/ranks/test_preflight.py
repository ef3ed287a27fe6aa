"""preflight on real torchrun ranks (gloo, CPU): every playbook, the acceptance
scripts, bad input, and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import psutil
import pytest

from ncclcheck.catalogue import load_catalogue
from ncclcheck.evidence.traces import load_traces

from ..conftest import (
    PLAYBOOKS,
    PREFLIGHT_BOUND_S,
    REPO,
    SCRIPTS,
    WAIT_S,
    aligned_but_for_decisions,
    is_this_tests,
    line_in,
    run_bounded,
)

SCHEMA = json.loads((REPO / "ncclcheck" / "schemas" / "report.schema.json").read_text())
PLAYBOOK_IDS = load_catalogue(PLAYBOOKS).ids
# preflight runs at its own stall timeout: a shorter one called ranks that were still
# importing torch on a loaded machine hung
BOUND_S = PREFLIGHT_BOUND_S

# what the ranks do and what preflight makes of it, forked from a warm interpreter; how
# torchrun starts, stops and reaps them: the tests marked warm_start(False)
pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]
TORCHRUN_STARTS = pytest.mark.warm_start(False)


def preflight(*args: str, cwd: Path = REPO, bound: float = BOUND_S, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    argv = [
        sys.executable,
        "-m",
        "ncclcheck",
        "preflight",
        "--json",
        *args,
    ]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=bound,
        check=False,
        env={**os.environ, **(env or {})},
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else None
    if report is not None:
        jsonschema.validate(report, SCHEMA)
    return proc, report


def users_tmp(tmp_path: Path) -> Path:
    """A TMPDIR of the user's own for the dry run: what preflight leaves there is checked."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return folder


# what a plain torchrun run of a script leaves in TMPDIR too: torch's compile cache, reused
# by design, and rank-early-exit's checkpoint, that script's own output
SCRIPTS_OWN_TEMP_FILES = ("torchinductor_", "early-exit-")


def assert_nothing_left(script: Path, user_tmp: Path) -> None:
    """No process of the script outlives preflight and no file is left in the user's
    TMPDIR (torchrun's agent makes a torchelastic_* folder there at each start, and
    leaves it), save what the script itself leaves there."""
    assert not leftover_ranks(str(script))
    assert [p.name for p in user_tmp.iterdir() if not p.name.startswith(SCRIPTS_OWN_TEMP_FILES)] == []


def leftover_ranks(marker: str) -> list[psutil.Process]:
    """This test's processes whose command line names the script, or a warm server's
    (--warm-start: its forked ranks carry its command line): what preflight must not
    leave (another test may run the same script meanwhile)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        named = marker in cmdline or "ncclcheck.launch.replay" in cmdline
        if named and proc.pid != os.getpid() and is_this_tests(proc):
            found.append(proc)
    return found


@TORCHRUN_STARTS
@pytest.mark.parametrize("cause", PLAYBOOK_IDS)
def test_every_repro_is_diagnosed_with_its_cause_site_and_ranks(
    catalogue, cause: str, tmp_path: Path
) -> None:
    playbook = catalogue.get(cause)
    expect = playbook.repro
    script = playbook.repro_path.relative_to(REPO)
    user_tmp = users_tmp(tmp_path)
    proc, report = preflight(f"--nproc-per-node={expect.nproc}", str(script), env={"TMPDIR": str(user_tmp)})
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report is not None and report["verdict"] != "aligned"
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors, report
    finding = errors[0]
    assert finding["cause"] == cause, json.dumps(finding, indent=1)
    site_file = (playbook.folder / expect.site_file).relative_to(REPO)
    assert finding["site"] == f"{site_file}:{expect.site_line(playbook.folder)}", finding
    assert finding["ranks"] == expect.ranks, finding
    assert finding["absent_ranks"] == expect.absent_ranks, finding
    assert finding["fix"] == playbook.fix.direct
    assert_nothing_left(playbook.repro_path, user_tmp)


@pytest.mark.parametrize("cause", PLAYBOOK_IDS)
def test_every_fixed_script_is_aligned(catalogue, cause: str, tmp_path: Path) -> None:
    """Warm (the ranks forked): the repro's test above holds torchrun's start, stop and
    clean-up to the same script's broken twin, and test_virtual each fix at 64 ranks."""
    playbook = catalogue.get(cause)
    user_tmp = users_tmp(tmp_path)
    # The straggler's simulated slow write lasts 1.2x the process-group timeout,
    # in the background once fixed: a short timeout keeps it under the stall timeout.
    # The other scripts keep their own timeout: a short one would fail a collective that
    # is only slow (a loaded machine).
    # A budget past the script's own end: aligned is said only of what ran, and a fix's
    # barrier after its epochs (unsynchronized-decision) runs only at the end
    proc, report = preflight(
        f"--nproc-per-node={playbook.repro.nproc}",
        "--train-steps=100000",
        "--eval-passes=1000",
        str(playbook.fixed_path),
        env={"TMPDIR": str(user_tmp), **({"REPRO_TIMEOUT_S": "3"} if cause == "straggler" else {})},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report is not None and report["verdict"] == "aligned", report
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert report["summary"]["backend"] == "gloo"
    # the ground truth the playbook promises: the fix runs to its end, exit 0 on every rank
    assert report["summary"]["stopped"] == "the script ran to its end on every rank", report["summary"]
    assert [state["exit_code"] for state in report["ranks"]] == [0] * playbook.repro.nproc, report["ranks"]
    assert_nothing_left(playbook.fixed_path, user_tmp)


def test_uneven_repro_reports_exact_eval_batches() -> None:
    proc, report = preflight("--nproc-per-node=4", str(SCRIPTS / "eval_shards_4_3_3_3.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    assert [r["eval_batches"] for r in report["ranks"]] == [4, 3, 3, 3]
    warnings = {f["cause"]: f for f in report["findings"]}
    assert warnings["uneven-eval-batches"]["severity"] == "warning"
    assert "rank 0: 4, rank 1: 3, rank 2: 3, rank 3: 3" in warnings["uneven-eval-batches"]["message"]
    assert warnings["missing-distributed-sampler"]["severity"] == "warning"


def test_self_sharding_iterable_eval_set_is_counted_and_diagnosed() -> None:
    # The loader of an IterableDataset has a sampler that yields None forever and no
    # len(): the recorder must count its batches without reading indices from it.
    script = SCRIPTS / "eval_iterable_uneven.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["verdict"] == "hang"
    assert [r["eval_batches"] for r in report["ranks"]] == [3, 2]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    line = line_in(script, "dist.all_reduce(loss)")
    assert finding["site"] == f"tests/scripts/eval_iterable_uneven.py:{line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    evidence = "\n".join(finding["evidence"])
    assert "eval loader val_loader: dataset RankStream is an IterableDataset" in evidence
    # no sampler to blame: a stream has none
    assert "missing-distributed-sampler" not in {f["cause"] for f in report["findings"]}
    assert not leftover_ranks(str(script))


def test_rank0_only_eval_through_ddp_hangs_on_its_buffer_broadcast() -> None:
    # No collective in the user's evaluate(): DDP's forward() broadcasts BatchNorm's
    # buffers, and the finding must say what that call is and where forward() ran.
    script = SCRIPTS / "ddp_buffers_rank0_eval.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert finding["op"] == "_broadcast_coalesced"
    line = line_in(script, "DDP broadcasts the BatchNorm buffers")
    assert finding["site"] == f"tests/scripts/ddp_buffers_rank0_eval.py:{line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "DDP's broadcast of parameters and buffers" in finding["message"]
    assert "`if dist.get_rank() == 0`" in finding["message"]
    assert not leftover_ranks(str(script))  # the ranks and their loader workers


@pytest.mark.skipif(
    not os.path.realpath(sys.prefix).startswith(str(REPO) + os.sep),
    reason="the virtualenv is not inside the repository: the layout under test is absent",
)
def test_a_script_next_to_its_virtualenv_is_sited_in_the_script_not_in_torch() -> None:
    # project/train.py with project/.venv, as `make install` lays out this repository:
    # the script's folder holds torch too, and torch's frames must stay library frames.
    script = REPO / f"ncclcheck_layout_test_{os.getpid()}.py"
    script.write_text((SCRIPTS / "ddp_buffers_rank0_eval.py").read_text())
    try:
        proc, report = preflight("--nproc-per-node=2", script.name)
    finally:
        script.unlink()
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert (
        finding["site"]
        == f"{script.name}:{line_in(SCRIPTS / 'ddp_buffers_rank0_eval.py', 'BatchNorm buffers')}"
    )
    chain = next(line for line in finding["evidence"] if line.startswith("call chain"))
    assert "site-packages" not in chain and "bootstrap.py" not in chain, chain


def test_collective_in_a_helper_module_is_sited_at_the_helper_with_the_chain() -> None:
    project = SCRIPTS / "helper_project"
    proc, report = preflight("--nproc-per-node=2", "train.py", cwd=project)
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"] == f"metrics.py:{line_in(project / 'metrics.py', 'dist.all_reduce(stats)')}"
    chain = next(line for line in finding["evidence"] if line.startswith("call chain"))
    assert "main() at train.py" in chain and "log_validation() at metrics.py" in chain
    assert "mean_loss() at metrics.py" in chain
    assert any("`if is_main`" in line for line in finding["evidence"])


@TORCHRUN_STARTS
def test_a_package_run_with_dash_m_is_checked_as_torchrun_m_runs_it() -> None:
    # `torchrun -m trainer`: its __main__.py, whose relative import works only as a module.
    project = SCRIPTS / "module_project"
    proc, report = preflight("--nproc-per-node=2", "-m", "trainer", "--steps", "2", cwd=project)
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    line = line_in(project / "trainer" / "evaluation.py", "dist.all_reduce(correct)")
    assert finding["site"] == f"trainer/evaluation.py:{line}"
    chain = next(line for line in finding["evidence"] if line.startswith("call chain"))
    assert "main() at trainer/__main__.py" in chain and "runpy" not in chain
    assert any("`if dist.get_rank() == 0`" in line for line in finding["evidence"])
    # its arguments reached it: 2 steps of 2 gradient all_reduces, then one call each
    assert [r["collectives"] for r in report["ranks"]] == [5, 5]
    assert not leftover_ranks("-m trainer")


def test_tensors_that_differ_by_design_are_not_a_shape_mismatch() -> None:
    # gather/scatter lists on the root only, all_to_all_single's uneven splits, object
    # collectives of per-rank sizes: correct code, 3 ranks.
    script = SCRIPTS / "rooted_and_uneven_by_design.py"
    proc, report = preflight("--nproc-per-node=3", str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert [r["collectives"] for r in report["ranks"]] == [5, 5, 5]


def test_an_error_caught_around_a_step_function_is_a_rank_exception() -> None:
    # The try is in the loop, around train_step(); the skipped all_reduce is DDP's,
    # inside train_step's backward: the handler that swallowed the OOM is the cause.
    script = SCRIPTS / "oom_skip_step.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-exception", finding
    step_line, try_line = line_in(script, "simulate_oom="), line_in(script, "try:")
    assert finding["site"] == f"tests/scripts/oom_skip_step.py:{step_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    except_line, raise_line = (
        line_in(script, "except torch.cuda.OutOfMemoryError"),
        line_in(script, "raise torch"),
    )
    evidence = "\n".join(finding["evidence"])
    assert (
        f"the call is inside a try at tests/scripts/oom_skip_step.py:{try_line} whose handler "
        f"(at tests/scripts/oom_skip_step.py:{except_line}) swallows" in evidence
    ), evidence
    # what the handler caught on rank 1, as the run noted it: the error and where it was raised
    assert (
        "rank 1 caught OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB, raised at "
        f"tests/scripts/oom_skip_step.py:{raise_line} in train_step(), in "
        f"`except torch.cuda.OutOfMemoryError` at tests/scripts/oom_skip_step.py:{except_line}"
    ) in evidence, evidence

    # the twin's handler still makes the step's all-reduce (of zeros)
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


def test_decoding_that_stops_at_each_ranks_own_end_of_sequence_is_a_data_dependent_branch() -> None:
    script = SCRIPTS / "generate_until_eos.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    # the stop tests the model's output; `rank, world = ...` must not make that rank-derived
    assert finding["cause"] == "data-dependent-branch", finding
    stop_line = line_in(script, "break  # out of the loop on this rank alone")
    assert finding["site"] == f"tests/scripts/generate_until_eos.py:{stop_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    # the decoding loop is found below the comprehension that runs generate()
    loop = f"tests/scripts/generate_until_eos.py:{line_in(script, 'for _ in range')}"
    assert any(e.startswith(f"rank 1 left the loop at {loop}") for e in finding["evidence"]), finding

    assert "synced_gpus=True" in finding["fix"]

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "synced"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    assert report["summary"]["note"].startswith("no eval loader was seen: the collectives made in eval mode")


def test_a_loop_ended_by_each_ranks_own_clock_is_an_unsynchronized_decision() -> None:
    script = SCRIPTS / "wallclock_budget.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision", finding
    assert finding["site"] == f"tests/scripts/wallclock_budget.py:{line_in(script, 'while time.time()')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    assert any("when `time.time() - start < budget_s` turned false" in e for e in finding["evidence"])

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "synced"})
    aligned_but_for_decisions(proc.returncode, report)


def test_a_reduce_result_read_on_a_rank_that_is_not_its_dst_is_named_as_such() -> None:
    script = SCRIPTS / "reduce_to_rank0.py"
    reduce_line = line_in(script, "dist.reduce(")
    read_line = line_in(script, "if mean_loss.item() < stop_below")

    # rank 1 stops on its own partial mean; rank 0 goes on to the next epoch
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision", finding
    assert finding["site"] == f"tests/scripts/reduce_to_rank0.py:{read_line + 1}"  # the break
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    assert (
        f"it reads what dist.reduce at tests/scripts/reduce_to_rank0.py:{reduce_line} left on rank 1, "
        "not the result, which only rank 0 receives" in finding["message"]
    )
    assert "rank 1: no call (it ran to the end of the script)" in finding["evidence"]

    # both ranks happen to decide alike: no divergence, the read said as a warning, and the
    # decision listed as not checked (partial): the ranks did not part, which is not that
    # they cannot (not forced here: the warning is what this part checks)
    proc, report = preflight(
        "--nproc-per-node=2", "--no-force-decisions", str(script), env={"STOP_BELOW": "100"}
    )
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert report["verdict"] == "partial"
    assert any(
        gap.startswith(f"tests/scripts/reduce_to_rank0.py:{read_line}: a decision each rank takes")
        for gap in report["summary"]["not_run"]
    ), report["summary"]["not_run"]
    (finding,) = [f for f in report["findings"] if f["cause"] == "unsynchronized-decision"]
    assert finding["severity"] == "warning"
    assert finding["site"] == f"tests/scripts/reduce_to_rank0.py:{read_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([1], [0])
    # read from `mean_loss = epoch_loss / world`: computed from the reduced tensor
    assert finding["message"].startswith("rank 1 read `mean_loss` with .item()")
    assert "sent the result to rank 0 only" in finding["message"]
    assert "`if mean_loss.item() < stop_below` decides on it" in finding["message"]
    reduced_at = f"dist.reduce(..., dst=0) at tests/scripts/reduce_to_rank0.py:{reduce_line}"
    assert reduced_at in finding["evidence"][0]
    assert finding["evidence"][1].startswith("call chain of the read: <module>() at")

    # read on rank 0 alone, and decided on after a broadcast: nothing to say
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "careful"})
    aligned_but_for_decisions(proc.returncode, report)
    assert not [f for f in report["findings"] if f["cause"] == "unsynchronized-decision"], report["findings"]


def test_a_rank_killed_by_its_empty_eval_shard_is_traced_to_the_shard() -> None:
    script = SCRIPTS / "empty_eval_shard.py"
    proc, report = preflight("--nproc-per-node=3", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-crashed", finding
    assert finding["absent_ranks"] == [2]
    assert finding["message"].startswith("rank 2 died after an eval pass with no batch")
    assert (
        finding["site"] == f"tests/scripts/empty_eval_shard.py:{line_in(script, 'dist.all_reduce(val_loss)')}"
    )
    assert (
        "rank 2's eval loader val_loader yielded no batch in its last pass (the other ranks: rank 0: 1, "
        "rank 1: 1)" in " ".join(finding["evidence"])
    )
    assert finding["fix"].startswith("An empty eval shard killed rank 2")
    assert [r["eval_batches"] for r in report["ranks"]] == [1, 1, 0]


def test_a_file_each_rank_checks_for_itself_while_rank_zero_writes_it_is_an_unsynchronized_decision(
    tmp_path: Path,
) -> None:
    script = SCRIPTS / "resume_file_race.py"
    proc, report = preflight("--nproc-per-node=2", str(script), env={"CKPT_DIR": str(tmp_path / "race")})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "unsynchronized-decision", finding
    assert (
        finding["site"]
        == f"tests/scripts/resume_file_race.py:{line_in(script, 'dist.broadcast(start, src=0)')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert (
        "under `if should_resume(local_copy, synced)`, a test each rank answers for itself"
        in finding["message"]
    )
    assert any("is a file check each rank makes for itself" in line for line in finding["evidence"])

    proc, report = preflight(
        "--nproc-per-node=2", str(script), env={"MODE": "synced", "CKPT_DIR": str(tmp_path / "synced")}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"


def test_a_distributed_checkpoint_saved_on_rank_zero_alone_is_named_for_what_it_is() -> None:
    script = SCRIPTS / "dcp_rank0_save.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert finding["site"] == f"tests/scripts/dcp_rank0_save.py:{line_in(script, 'dcp.save(')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "(torch.distributed.checkpoint coordinating a save or load across the ranks)" in finding["message"]
    assert any(
        e.startswith("torch.distributed.checkpoint's save() and load() are collective")
        for e in finding["evidence"]
    )


@TORCHRUN_STARTS  # how a rank's abort ends the run: the launcher's part
def test_rank_aborting_in_a_mismatched_all_gather_leaves_its_record() -> None:
    script = PLAYBOOKS / "collective-shape-mismatch" / "repro.py"
    _proc, report = preflight("--nproc-per-node=2", str(script))
    assert report["verdict"] == "crash"
    finding = report["findings"][0]
    assert finding["cause"] == "collective-shape-mismatch"
    shapes = [line for line in finding["evidence"] if "all_gather" in line]
    assert len(shapes) == 2  # each rank's write-ahead record, with its own shape
    assert shapes[0] != shapes[1]
    exited = {r["rank"]: r["exit_code"] for r in report["ranks"]}
    assert -6 in exited.values()  # gloo's abort: SIGABRT


def test_train_shards_of_different_lengths_are_an_error_though_the_budget_cut_the_passes_first() -> None:
    # --train-end-batches 0: the dry run never reaches the end of a pass, where the ranks
    # part; the lengths the loaders told as the pass began decide: never "aligned" with a
    # warning (by default the pass's end runs: test_coverage.py)
    proc, report = preflight(
        "--nproc-per-node=2", "--train-end-batches=0", str(SCRIPTS / "uneven_train_shards.py")
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["verdict"] == "misaligned"
    (finding,) = report["findings"]
    # shards cut by hand under a plain sampler: a DistributedSampler would even them out
    assert (finding["cause"], finding["severity"]) == ("missing-distributed-sampler", "error")
    assert (
        "train loader loader yields different numbers of batches per rank (rank 0: 6, rank 1: 5)"
        in (finding["message"])
    )
    assert "(the dry run stopped each pass before its end; the lengths" in finding["message"]


def test_uneven_train_shards_under_ddp_join_pair_with_joins_stand_ins() -> None:
    script = SCRIPTS / "ddp_join_uneven.py"
    # Join's stand-ins come from the `with` line on rank 1, DDP's calls from the step on
    # rank 0: paired by op and shape, aligned, and no uneven-batches warning either
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert not report["findings"], report["findings"]

    # a collective of the loop body's own: nothing on the joined rank answers it
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "log_loss"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert finding["site"] == f"tests/scripts/ddp_join_uneven.py:{line_in(script, 'dist.all_reduce(logged)')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    with_line = line_in(script, "with Join([model]):")
    assert finding["message"].startswith(
        f"rank 1 ran out of batches and joined at tests/scripts/ddp_join_uneven.py:{with_line} (DDP's Join)"
    )
    assert "batches drawn per rank: rank 0: 5, rank 1: 3" in finding["evidence"]
    assert any("a stand-in DDP's Join makes" in line for line in finding["evidence"])


def test_one_call_in_a_loop_over_meters_met_in_another_order_per_rank_is_an_order_mismatch() -> None:
    script = SCRIPTS / "meters_in_the_order_seen.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "collective-order-mismatch", finding
    loop_line = line_in(script, "for kind, meter in meters.items():")
    assert (
        f"in the loop over `meters.items()` at tests/scripts/meters_in_the_order_seen.py:{loop_line}"
        in (finding["message"])
    )


def test_a_step_function_returning_before_its_backward_is_the_reason_of_the_skipped_step() -> None:
    script = SCRIPTS / "step_returns_on_nonfinite_loss.py"
    proc, report = preflight("--nproc-per-node=2", "--train-steps=8", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    name = "tests/scripts/step_returns_on_nonfinite_loss.py"
    assert (finding["cause"], finding["site"], finding["absent_ranks"]) == (
        "data-dependent-branch",
        f"{name}:{line_in(script, 'loss.backward()')}",
        [0],
    )
    skip = f"`return` under `if not torch.isfinite(loss)` at {name}:{line_in(script, 'return None')}"
    assert skip in "\n".join(finding["evidence"])


def test_a_rank_working_on_after_destroying_its_process_group_is_stopped_and_aligned() -> None:
    # rank 0 uploads for an hour after destroy_process_group: nothing it does can wait on
    # a peer. Before, the dry run waited for it until its own time limit (10 min).
    started = time.monotonic()
    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "upload_after_training.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned" and not report["findings"], report
    # stopped by preflight after the quiet spell, or by torchrun when rank 1's process
    # aborted at its exit (torch 2.13's gloo teardown, now and then): said alike
    stopped = report["summary"]["stopped"]
    assert "every rank had ended its distributed work" in stopped
    assert "rank 0 still ran" in stopped or "rank 0 was then ended by the launcher" in stopped
    # after the quiet spell, not at the dry run's own time limit (600 s) as before
    assert time.monotonic() - started < 500
    assert not leftover_ranks("upload_after_training.py")


def test_a_rank_quiet_outside_any_collective_after_the_others_ended_is_incomplete_not_a_straggler() -> None:
    """The straggler playbook's first fixed twin joined its checkpoint writer at each
    epoch's end, before its next collectives: run as a user runs it (a 36-minute write),
    rank 1 had exited and rank 0 waited in that join, and preflight called it a straggler
    that rank 1 waited for. Nothing waited on a peer: incomplete, with what decides."""
    script = SCRIPTS / "join_writer_at_epoch_end.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 4, proc.stderr[-2000:]
    assert report["verdict"] == "incomplete", report
    assert not [f for f in report["findings"] if f["severity"] == "error"], report
    if "the launcher ended rank 0" in report["summary"]["incomplete"]:
        # torch 2.13's gloo teardown aborted rank 1 after its script returned, and torchrun
        # then stopped rank 0 in its join before the stall was seen: said as such
        assert "after rank 1's process failed" in report["summary"]["incomplete"]
        return
    (finding,) = [f for f in report["findings"] if f["severity"] == "warning"]
    assert "no rank was inside a collective" in finding["message"]
    assert finding["fix"].startswith("What decides") and not finding["ranks"]
    assert "quiet outside any collective" in report["summary"]["incomplete"]


def test_a_group_created_on_its_members_only_is_named_though_the_job_goes_on() -> None:
    script = SCRIPTS / "new_group_on_members.py"
    proc, report = preflight("--nproc-per-node=3", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    members_line = line_in(script, "            eval_group = dist.new_group(eval_ranks)")
    assert finding["site"] == f"tests/scripts/new_group_on_members.py:{members_line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0, 1], [2])
    assert "under `if rank in eval_ranks`" in finding["message"]
    assert any("Groups are named by a count of new_group calls" in line for line in finding["evidence"])

    proc, report = preflight("--nproc-per-node=3", str(script), env={"MODE": "everyone"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]


def test_zero_consolidate_state_dict_on_rank_zero_alone_is_named_with_its_fix() -> None:
    script = SCRIPTS / "zero_consolidate.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    site = line_in(script, "            optimizer.consolidate_state_dict(to=0)")
    assert finding["site"] == f"tests/scripts/zero_consolidate.py:{site}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "broadcast (ZeroRedundancyOptimizer gathering its state shards" in finding["message"]
    assert any("call it on every rank, then save optimizer.state_dict()" in e for e in finding["evidence"])

    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "everyone"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]


def test_code_after_the_point_where_the_budget_stopped_is_said_not_checked(tmp_path: Path) -> None:
    script = SCRIPTS / "final_barrier.py"
    env = {"CKPT_DIR": str(tmp_path)}
    barrier_line = line_in(script, "dist.barrier()")

    # the fixed twin: nothing wrong in what ran, the barrier after the loop did not run and
    # nothing decides it: partial, not aligned
    fixed = SCRIPTS / "final_barrier_on_every_rank.py"
    proc, report = preflight("--nproc-per-node=2", str(fixed), env=env)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert report["verdict"] == "partial", report["findings"]
    (not_run,) = report["summary"]["not_run"]
    fixed_barrier = line_in(fixed, "dist.barrier()")
    name = "tests/scripts/final_barrier_on_every_rank.py"
    assert f"and it reaches dist.barrier at {name}:{fixed_barrier}" in not_run, not_run
    assert not_run.startswith(
        f"the budget stopped the dry run at {name}:{line_in(fixed, 'for (x,) in train_loader:')} in "
        f"<module>(): what the script does after that did not run (lines "
        f"{line_in(fixed, 'if rank == 0:')}-{fixed_barrier} of <module>() in {name})"
    )  # the print before and destroy_process_group() after wait for nothing: left out

    # the broken script: the same lines did not run, and the source decides them
    proc, report = preflight("--nproc-per-node=2", str(script), env=env)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["verdict"] == "misaligned", report["findings"]
    (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert (finding["cause"], finding["site"]) == (
        "rank-conditional-collective",
        f"tests/scripts/final_barrier.py:{barrier_line}",
    )
    assert (
        "the dry run never ran it (the budget stopped the run before it): the source decides"
        in (finding["evidence"])
    )
    assert report["summary"]["not_run"]

    # one epoch: the loop ends within the budget, and what follows it runs and is found
    proc, report = preflight("--nproc-per-node=2", str(script), env={**env, "EPOCHS": "1"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert (finding["cause"], finding["site"]) == (
        "rank-conditional-collective",
        f"tests/scripts/final_barrier.py:{barrier_line}",
    )
    assert "not_run" not in report["summary"]


def test_collectives_each_rank_calls_from_its_own_branch_by_design_are_aligned(
    tmp_path: Path,
) -> None:
    # Each pause outlasts the short wait for records that disagree (2 s): a barrier or
    # broadcast from two lines is not a divergence while the calls after it are to come.
    script = SCRIPTS / "zero_first.py"
    proc, report = preflight(
        "--nproc-per-node=2", str(script), env={"CACHE_DIR": str(tmp_path), "PAUSE_S": "3"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]


def test_a_large_eval_set_runs_its_last_batches_only() -> None:
    """--eval-batches (8 by default): 2,500 batches per rank, 2,492 skipped alike at the
    sampler, the last 8 run for real with their all_reduce; the counts stay the loader's."""
    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "large_eval.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["summary"]["eval_batches"] == {"0": 2500, "1": 2500}
    assert report["summary"]["collectives_per_phase"] == {"eval": 2 * (8 + 1)}  # 8 batches, the barrier
    assert report["summary"]["eval_fast_forward"] == [
        "val_loader: the first 2492 of 2500 batches skipped on every rank (not loaded), the rest run for real"
    ]


def test_an_uneven_end_of_a_large_eval_set_is_still_a_real_divergence() -> None:
    """20,001 samples split by hand: rank 0's 2,501st batch has no partner. The lengths the
    ranks told each other at the start of the pass are in the evidence."""
    proc, report = preflight(
        "--nproc-per-node=2", str(SCRIPTS / "large_eval.py"), env={"SAMPLES": "20001", "UNEVEN": "1"}
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == ("uneven-eval-batches", [0], [1])
    assert report["summary"]["eval_batches"] == {"0": 2501, "1": 2500}
    assert (
        "lengths the ranks' loaders had as the pass over val_loader began, before any batch: "
        "rank 0: 2501, rank 1: 2500"
    ) in finding["evidence"]


def test_a_stream_without_a_length_is_read_ahead_and_its_uneven_end_still_found() -> None:
    """The same uneven end as a stream (an IterableDataset sharding itself, no length): each
    rank reads its batches ahead without the loop body, tells the count it read, and runs
    the last ones for real: rank 0's 2,501st all_reduce has no partner."""
    proc, report = preflight(
        "--nproc-per-node=2",
        str(SCRIPTS / "large_eval.py"),
        env={"SAMPLES": "20001", "UNEVEN": "1", "STREAM": "1"},
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == ("uneven-eval-batches", [0], [1])
    assert report["summary"]["eval_batches"] == {"0": 2501, "1": 2500}
    assert report["summary"]["collectives_per_phase"] == {"eval": 9 + 9}  # rank 0: 9, rank 1: 8 + barrier
    assert (
        "the first 2492 batches of val_loader were read ahead without the loop body (--eval-batches); "
        "the ones after them ran for real"
    ) in finding["evidence"]
    assert (
        "lengths the ranks' loaders had as the pass over val_loader began, before any batch: "
        + ("rank 0: 2501, rank 1: 2500")
        in finding["evidence"]
    )


def test_an_endless_stream_is_read_for_a_bounded_time_then_run_from_its_start() -> None:
    """An endless stream whose loop stops itself after 20 batches: the reading stops at its
    bound (2x the stall timeout), nobody skips, and the loop gets the stream from its start."""
    proc, report = preflight(
        "--nproc-per-node=2",
        str(SCRIPTS / "large_eval.py"),
        env={"STREAM": "1", "ENDLESS": "1", "EVAL_STEPS": "20"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert report["summary"]["collectives_per_phase"] == {"eval": 2 * (20 + 1)}
    assert report["summary"]["eval_fast_forward"] == [
        "val_loader: every batch run (no length on rank(s) [0, 1]: an IterableDataset not read to its "
        "end within the bound)"
    ]


def test_no_eval_phase_is_said_not_failed() -> None:
    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "train_only.py"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    assert "no eval phase was seen" in report["summary"]["note"]
    assert "--train-steps" not in report["summary"]["note"]  # its passes are shorter than the budget


def test_evaluation_past_the_step_budget_is_made_to_fire_or_pointed_out() -> None:
    script = SCRIPTS / "step_eval.py"
    # the evaluation every 20 steps is made to fire at its first test, within the 5 steps
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"] == f"tests/scripts/step_eval.py:{line_in(script, '# rank 0 alone')}"
    # not made to fire: nothing wrong in what ran, but it never fired: not aligned
    proc, report = preflight("--nproc-per-node=2", "--no-fire-periodic", str(script))
    assert (proc.returncode, report["verdict"]) == (5, "partial"), proc.stderr[-2000:]
    assert "rerun with --train-steps above N" in report["summary"]["note"]
    if_line = line_in(script, "if step % EVAL_EVERY == 0:")
    assert any(
        gap.startswith(f"`if step % EVAL_EVERY == 0` at tests/scripts/step_eval.py:{if_line} never fired")
        for gap in report["summary"]["not_run"]
    ), report["summary"]["not_run"]


def test_fsdp2_collectives_are_recorded_as_training(tmp_path: Path) -> None:
    """fully_shard issues dist.all_gather_single / reduce_scatter_single, its gathers
    under a no_grad of its own: that is training, not evaluation."""
    proc, report = preflight(
        "--json", f"--trace-dir={tmp_path}", "--nproc-per-node=2", str(SCRIPTS / "fsdp2_train.py")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    assert set(report["summary"]["collectives_per_phase"]) == {"train"}
    traces = load_traces(tmp_path)
    ops = {call.op for trace in traces.values() for call in trace.calls}
    assert {"all_gather_single", "reduce_scatter_single"} <= ops, ops
    assert len(traces[0].calls) == len(traces[1].calls) > 0


def test_an_fsdp2_eval_on_shards_cut_by_hand_is_sited_at_the_loops_model_call_and_its_twin_aligned() -> None:
    """The extra eval batch's all-gathers run inside the model's own forward(), a layer's
    line; what parts the ranks is the loop's call of the model, and that is the site."""
    script = SCRIPTS / "fsdp2_eval_shards_by_hand.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] in ("uneven-eval-batches", "missing-distributed-sampler"), finding
    assert (
        finding["site"]
        == f"tests/scripts/fsdp2_eval_shards_by_hand.py:{line_in(script, 'predicted = model(x)')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1]), finding
    # no loader: the rank's own rows sliced in a loop; the blocks' loop inside forward() ran
    # more passes too, only because it ran in one more batch: the eval loop decided
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "slices"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    sliced = line_in(script, "predicted = model(features[start : start + 3])")
    assert (finding["cause"], finding["site"]) == (
        "uneven-eval-batches",
        f"tests/scripts/fsdp2_eval_shards_by_hand.py:{sliced}",
    ), finding
    assert "for start in range(0, len(features), 3)" in finding["message"], finding
    proc, report = preflight("--nproc-per-node=2", str(script), env={"MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), (proc.stderr[-2000:], report)


FULL_STATE = SCRIPTS / "fsdp2_full_state_dict.py"


def test_a_dtensor_gathered_on_rank_zero_alone_is_found_at_full_tensor() -> None:
    # DTensor's full_tensor() communicates through torch's functional collectives,
    # which torch.distributed's module functions never see.
    proc, report = preflight("--nproc-per-node=2", str(FULL_STATE), env={"MODE": "rank0"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    line = next(
        n for n, text in enumerate(FULL_STATE.read_text().splitlines(), 1) if ".full_tensor()" in text
    )
    assert finding["site"] == f"tests/scripts/fsdp2_full_state_dict.py:{line}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "all_gather_single (DTensor gathering or redistributing its shards" in finding["message"]


def test_functional_collectives_count_in_their_groups_sequence(tmp_path: Path) -> None:
    proc, report = preflight(
        f"--trace-dir={tmp_path}", "--nproc-per-node=2", str(FULL_STATE), env={"MODE": "every"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]
    traces = load_traces(tmp_path)
    for trace in traces.values():
        gathers = [call for call in trace.calls if call.source == "functional"]
        # one per parameter (two weights, two biases), on the world group, in between
        # FSDP2's own calls on that group and the barrier after them
        assert [call.op for call in gathers] == ["all_gather_single"] * 4
        assert {call.group for call in gathers} == {trace.calls[0].group}
        assert trace.calls[-1].op == "barrier"
        assert trace.calls[-1].seq == len(trace.calls) - 1


@TORCHRUN_STARTS
def test_traces_from_two_nodes_are_merged_with_from(tmp_path: Path) -> None:
    script = str(PLAYBOOKS / "rank-conditional-collective" / "repro.py")
    port = _free_port()
    nodes = []
    for node in (0, 1):
        argv = [
            sys.executable,
            "-m",
            "ncclcheck",
            "preflight",
            "--json",
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{port}",
            "--rdzv-id=two-nodes",
            f"--trace-dir={tmp_path / f'node{node}'}",
            script,
        ]
        nodes.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        )
    for proc in nodes:
        out, err = proc.communicate(timeout=BOUND_S)
        # rank 0's node sees the hang; rank 1's barrier may fail first when rank 0 is stopped
        assert json.loads(out)["verdict"] in ("hang", "crash"), err[-2000:]
    assert sorted(p.name for p in tmp_path.rglob("rank-*.jsonl")) == [
        "rank-00000.jsonl",
        "rank-00001.jsonl",
    ]
    proc, report = preflight("--from", str(tmp_path))
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
        "rank-conditional-collective",
        [0],
        [1],
    )
    # the device comes from the tensors: the barrier has none
    calls = [call for trace in load_traces(tmp_path).values() for call in trace.calls]
    assert {(call.op, call.device) for call in calls if call.op in ("all_reduce", "barrier")} == {
        ("all_reduce", "cpu"),
        ("barrier", ""),
    }


@TORCHRUN_STARTS
def test_the_script_gets_the_users_tmpdir(tmp_path: Path) -> None:
    user_tmp = tmp_path / "tmp"
    user_tmp.mkdir()
    script = tmp_path / "writes_a_temp_file.py"
    script.write_text(
        "import os, tempfile\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "fd, _ = tempfile.mkstemp(prefix=f'rank{dist.get_rank()}-', dir=None)\n"
        "os.close(fd)\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    proc, report = preflight("--nproc-per-node=2", str(script), env={"TMPDIR": str(user_tmp)})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]
    assert sorted(p.name.split("-")[0] for p in user_tmp.iterdir()) == ["rank0", "rank1"]


@TORCHRUN_STARTS
@pytest.mark.usefixtures("signals_not_ignored")
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_preflight_stops_the_dry_run_and_reaps_it(stop: signal.Signals) -> None:
    path = PLAYBOOKS / "straggler" / "repro.py"  # keeps running for a long while
    argv = [
        sys.executable,
        "-m",
        "ncclcheck",
        "preflight",
        "--json",
        "--stall-timeout",
        "60",
        "--nproc-per-node=2",
        str(path),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and len(leftover_ranks(str(path))) < 3:
        time.sleep(0.5)
    assert len(leftover_ranks(str(path))) >= 3  # torchrun and its two ranks are up
    time.sleep(3)
    proc.send_signal(stop)
    out, err = proc.communicate(timeout=WAIT_S)
    report = json.loads(out)
    # stopped before its budget with nothing found: not a pass (docs/contract.md)
    assert (proc.returncode, report["verdict"]) == (4, "incomplete"), err[-2000:]
    assert "before its budget was spent" in report["summary"]["incomplete"]
    assert not leftover_ranks(str(path))


@TORCHRUN_STARTS
@pytest.mark.usefixtures("signals_not_ignored")
@pytest.mark.parametrize("after_s", [1, 3, 6, 9])
def test_a_stop_at_any_moment_is_incomplete_and_leaves_nothing(after_s: float) -> None:
    """SIGTERM to preflight's process group, as a CI timeout sends it: while preflight
    imports (1 s), while torchrun starts (3 s), while ranks import torch or run (6, 9 s):
    always incomplete, exit 4, never a death by the signal or a launch failure."""
    path = PLAYBOOKS / "straggler" / "repro.py"
    argv = [sys.executable, "-m", "ncclcheck", "preflight", "--json", str(path)]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True
    )
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 4, err[-2000:]
    report = json.loads(out)
    assert report["verdict"] == "incomplete"
    assert report["summary"]["incomplete"].startswith(
        "incomplete: the dry run was stopped by a signal to preflight (Ctrl-C, SIGTERM) before "
    ), report["summary"]
    assert not leftover_ranks(str(path))


# -- bad input ----------------------------------------------------------------------------


@TORCHRUN_STARTS
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no/such/train.py"], "no/such/train.py: no such file"),
        ([str(SCRIPTS)], "is a directory"),
        ([str(SCRIPTS / "syntax_error.py")], "syntax error"),
        (["--nproc-per-node=0", str(SCRIPTS / "train_only.py")], "at least 1"),
        (
            [str(SCRIPTS / "no_process_group.py")],
            "never called torch.distributed.init_process_group",
        ),
        ([str(SCRIPTS / "needs_args.py")], "failed on every rank before init_process_group"),
        (["--bogus-option", str(SCRIPTS / "train_only.py")], "No such option"),
        (["-m", "trainer.nope"], "trainer.nope: no module of that name"),
        (
            ["--launcher", "torchrun", str(SCRIPTS / "own_spawn.py")],
            "starts its own ranks with torch.multiprocessing.spawn at tests/scripts/own_spawn.py:21",
        ),
        (
            ["--launcher", "srun", str(SCRIPTS / "train_only.py")],
            "'srun' is not one of auto, torchrun, spawn, slurm",
        ),
    ],
)
def test_bad_input_is_one_clear_error_with_exit_2(args: list[str], message: str) -> None:
    result = run_bounded([sys.executable, "-m", "ncclcheck", "preflight", *args], PREFLIGHT_BOUND_S, cwd=REPO)
    assert result.returncode == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@TORCHRUN_STARTS
def test_missing_script_arguments_show_the_scripts_own_message() -> None:
    result = run_bounded(
        [sys.executable, "-m", "ncclcheck", "preflight", str(SCRIPTS / "needs_args.py")],
        PREFLIGHT_BOUND_S,
        cwd=REPO,
    )
    assert "the following arguments are required: --epochs" in result.output


@TORCHRUN_STARTS
def test_script_arguments_are_passed_unchanged() -> None:
    result = run_bounded(
        [
            sys.executable,
            "-m",
            "ncclcheck",
            "preflight",
            "--nproc-per-node=2",
            str(SCRIPTS / "needs_args.py"),
            "--epochs",
            "1",
        ],
        PREFLIGHT_BOUND_S,
        cwd=REPO,
    )
    # with its argument the script parses fine, then never initialises a process group
    assert result.returncode == 2
    assert "never called torch.distributed.init_process_group" in result.output


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
