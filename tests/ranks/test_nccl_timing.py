"""doctor on hangs with NCCL's timing: collectives return at once and a rank blocks at the
next device sync point (record/nccl_timing.py), real processes on gloo, real py-spy."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ncclcheck.launch.proctree import kill_tree

from ..conftest import JOB_BOUND_S, REPO, SCRIPTS, WAIT_S, line_in, run_bounded
from .test_doctor import DOCTOR_SITES_THE_WAIT, HANGING_CAUSES, NCCL_TIMING, doctor, doctor_on_hung
from .test_preflight import preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)

# Repros whose waiting rank, with NCCL's timing, sits at a device sync point after an
# all_reduce that never completed (the others' shapes do not change: their ranks wait
# in a barrier, a blocking object collective, DDP's backward, or outside any call; in
# missing-distributed-sampler every rank ends in the barrier, the extra all_reduce having
# returned at once, and the loop counters the ranks left behind tell them apart).
AT_A_SYNC_POINT = {
    "rank-conditional-collective": ".item()",
    "uneven-eval-batches": ".item()",
    "rank-exception": ".item()",
    "collective-order-mismatch": ".item()",  # both ranks, each after its own first all_reduce
}


@pytest.mark.parametrize("cause", HANGING_CAUSES)
def test_doctor_names_cause_collective_site_and_ranks_with_ncc_timing(catalogue, cause: str) -> None:
    playbook = catalogue.get(cause)
    code, report = doctor_on_hung(playbook.repro_path, playbook.repro.nproc, runner=NCCL_TIMING)
    # the straggler's rank 0 sleeps in its slow write, outside every collective, while rank 1
    # waits at its sync point: held by that wait, which two looks cannot time (test_doctor)
    expected = (0, "waiting") if cause == "straggler" else (1, "hang")
    assert (code, report["verdict"]) == expected, report
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    if cause not in DOCTOR_SITES_THE_WAIT:
        # the collective's line, not the line of the .item() the rank waits at
        site = f"{playbook.folder.relative_to(REPO) / 'repro.py'}:{playbook.repro.site_line(playbook.folder)}"
        assert finding["site"] == site, finding
    expected = sorted(playbook.repro.ranks + playbook.repro.absent_ranks)
    assert sorted(finding["ranks"] + finding["absent_ranks"]) == expected
    if cause in AT_A_SYNC_POINT:
        assert f"at a device sync point ({AT_A_SYNC_POINT[cause]}" in finding["message"], finding
        assert any("device sync point" in rank["where"] for rank in report["ranks"]), report["ranks"]


def test_the_emulation_returns_at_once_and_waits_at_the_read(tmp_path: Path) -> None:
    """One rank all-reduces alone: the call returns, the .item() after it is where it waits."""
    script = tmp_path / "alone.py"
    script.write_text(
        "import datetime, time, torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=3))\n"
        "x = torch.ones(1)\n"
        "if dist.get_rank() == 0:\n"
        "    started = time.monotonic()\n"
        "    dist.all_reduce(x)\n"
        "    print('returned after', round(time.monotonic() - started, 2), flush=True)\n"
        "    try:\n"
        "        x.item()\n"
        "    except RuntimeError:\n"
        "        print('the read timed out', flush=True)\n"
        "        raise SystemExit(0)\n"
        "else:\n"
        "    time.sleep(6)\n"
    )
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = run_bounded([*argv, *NCCL_TIMING.split(), str(script)], JOB_BOUND_S, cwd=tmp_path)
    returned = re.search(r"returned after ([\d.]+)", done.output)
    assert returned is not None, done.output
    # at once: a partnerless all_reduce that waited would have failed at the 3 s timeout
    assert float(returned.group(1)) < 2.5, done.output
    assert "the read timed out" in done.output, done.output


def _doctor_while_it_trains(tmp_path: Path, job: str, trained: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    """doctor on a healthy job started from a shell (``job``: its command line), once its
    log shows ``trained``; the job is reaped whatever happens. The jobs run for RUN_S=600:
    still running when doctor looks, however long a loaded machine takes to get there."""
    log = tmp_path / "job.log"
    with log.open("w") as out:
        shell = subprocess.Popen(
            ["/bin/sh", "-c", job], cwd=REPO, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + WAIT_S
        while trained not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert trained in log.read_text(), log.read_text()[-2000:]
        agent = next(
            p
            for p in psutil.Process(shell.pid).children(recursive=True)
            if "torch.distributed.run" in " ".join(p.cmdline())
        )
        return doctor(agent.pid)
    finally:
        kill_tree(shell.pid)
        shell.wait(timeout=30)


@pytest.mark.parametrize("runner", ["", NCCL_TIMING], ids=["gloo", "nccl-timing"])
def test_a_job_that_still_trains_is_progressing_not_hung(tmp_path: Path, runner: str) -> None:
    script = SCRIPTS / "training_still_running.py"
    job = f"RUN_S=600 {sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2 {runner}"
    job += f" {script}"
    code, report = _doctor_while_it_trains(tmp_path, job, "step 50:")
    assert (code, report["verdict"], report["findings"]) == (0, "progressing", []), report
    assert {r["state"] for r in report["ranks"]} == {"running"}
    assert report["summary"]["decided_by"].startswith("every rank moved between two looks")
    assert len(report["summary"]["movement"]) == 3  # each rank's change, and the CPU it used


def test_a_ddp_job_in_a_long_backward_is_progressing_not_hung(tmp_path: Path) -> None:
    # steps longer than the two looks: both may catch each rank in one backward, same
    # line, same locals; on gloo with no CUDA loaded, the CPU it used says it computes
    script = SCRIPTS / "ddp_long_backward.py"
    job = (
        f"OMP_NUM_THREADS=1 WIDTH=2560 RUN_S=600 {sys.executable} -m torch.distributed.run "
        f"--standalone --nproc-per-node=2 {script}"
    )
    code, report = _doctor_while_it_trains(tmp_path, job, "step 1:")
    assert (code, report["verdict"], report["findings"]) == (0, "progressing", []), report


def test_a_job_bound_by_its_dataloader_is_progressing_not_hung(tmp_path: Path) -> None:
    # the ranks wait in the loader's next() at both looks; their workers compute the batch
    script = SCRIPTS / "loader_bound.py"
    job = f"OMP_NUM_THREADS=1 RUN_S=600 {sys.executable} -m torch.distributed.run --standalone"
    code, report = _doctor_while_it_trains(tmp_path, f"{job} --nproc-per-node=2 {script}", "step 1:")
    assert (code, report["verdict"], report["findings"]) == (0, "progressing", []), report


def test_a_job_in_a_long_evaluation_is_progressing_not_hung(tmp_path: Path) -> None:
    # every rank decodes its shard sample by sample for ~10 s with no collective
    script = SCRIPTS / "long_evaluation.py"
    job = f"OMP_NUM_THREADS=1 RUN_S=600 {sys.executable} -m torch.distributed.run --standalone"
    code, report = _doctor_while_it_trains(tmp_path, f"{job} --nproc-per-node=2 {script}", "eval started")
    assert (code, report["verdict"], report["findings"]) == (0, "progressing", []), report


def test_ranks_waiting_for_a_long_save_are_progressing_with_the_saver_named(
    tmp_path: Path,
) -> None:
    # rank 0 saves for ~5 s while rank 1 waits in the barrier after the save: rank 1 does
    # not move, rank 0 does; whichever moment the looks catch, no hang
    script = SCRIPTS / "long_checkpoint_save.py"
    job = f"OMP_NUM_THREADS=1 RUN_S=600 {sys.executable} -m torch.distributed.run --standalone"
    code, report = _doctor_while_it_trains(tmp_path, f"{job} --nproc-per-node=2 {script}", "saving")
    assert (code, report["verdict"]) == (0, "progressing"), report
    for finding in report["findings"]:
        assert (finding["cause"], finding["severity"], finding["absent_ranks"]) == (
            "straggler",
            "warning",
            [0],
        )
        assert (
            "seen working between the looks: rank 0 (at tests/scripts/long_checkpoint_save.py:"
            in (finding["message"])
        ), finding


@pytest.mark.parametrize("runner", ["", NCCL_TIMING], ids=["gloo", "nccl-timing"])
def test_a_step_skipped_with_continue_is_a_data_dependent_branch(runner: str) -> None:
    """The loop's bound is the same on every rank: one collective fewer is a skipped pass,
    not a shorter loader."""
    script = SCRIPTS / "skip_step_on_nonfinite_loss.py"
    code, report = doctor_on_hung(script, 2, runner=runner)
    assert code == 1, report
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    assert finding["site"] == f"tests/scripts/{script.name}:{line_in(script, 'dist.all_reduce(gradient)')}"
    assert "`continue` under `if not torch.isfinite(loss)`" in finding["message"], finding


def test_preflight_with_nccl_timing_finds_the_cause_where_the_rank_waits_at_the_read(catalogue) -> None:  # type: ignore[no-untyped-def]
    playbook = catalogue.get("rank-conditional-collective")
    proc, report = preflight("--nccl-timing", str(playbook.repro_path.relative_to(REPO)))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    site = f"{playbook.folder.relative_to(REPO) / 'repro.py'}:{playbook.repro.site_line(playbook.folder)}"
    assert (finding["cause"], finding["site"]) == ("rank-conditional-collective", site), finding
    # rank 0's all_reduce returned at once; it waits at the .item() two lines below
    item_line = line_in(playbook.repro_path, "return (totals[0] / totals[1]).item()")
    assert report["ranks"][0]["where"].endswith(f"repro.py:{item_line} in evaluate"), report["ranks"]


def test_preflight_names_the_skipped_pass_too() -> None:
    """The traces part at rank 0's last all_reduce in the loop, rank 1 having left it: the
    loop's bound is the same on every rank, so the `continue` decided, not a loader."""
    script = SCRIPTS / "skip_step_on_nonfinite_loss.py"
    proc, report = preflight("--nproc-per-node=2", str(script.relative_to(REPO)))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    assert finding["cause"] == "data-dependent-branch", finding
    assert finding["site"] == f"tests/scripts/{script.name}:{line_in(script, 'dist.all_reduce(gradient)')}"
    assert "`continue` under `if not torch.isfinite(loss)`" in finding["message"], finding
