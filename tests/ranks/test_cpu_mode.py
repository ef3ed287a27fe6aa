"""preflight --cpu: a script written for NCCL and CUDA, checked on CPU ranks with gloo."""

from __future__ import annotations

import sys

import pytest
import torch

from ..conftest import (
    JOB_BOUND_S,
    PREFLIGHT_BOUND_S,
    REPO,
    SCRIPTS,
    line_in,
    ncclcheck,
    run_bounded,
    run_to_its_end,
    torchrun_argv,
)

SCRIPT = SCRIPTS / "gpu_style.py"
pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)


def line_of(fragment: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if fragment in text)


def preflight_cpu(mode: str):  # type: ignore[no-untyped-def]
    return ncclcheck("preflight", "--cpu", "--json", str(SCRIPT), env={"MODE": mode})


def test_an_aligned_gpu_script_runs_on_cpu_and_says_what_was_mapped() -> None:
    result, report = preflight_cpu("aligned")
    assert result.returncode == 0, result.output
    assert report["verdict"] == "aligned"
    mapped = "\n".join(report["summary"]["cpu"])
    site = "tests/scripts/gpu_style.py"
    for expected in (
        f"init_process_group('nccl') -> gloo at {site}:{line_of('init_process_group')}",
        f"torch.cuda.set_device() at {site}:{line_of('set_device')}",
        f"DistributedDataParallel(device_ids=...) -> CPU module at {site}:{line_of('DDP(')}",
        f"Module.cuda() at {site}:{line_of('DDP(')}",
        f'torch.zeros(device="cuda") at {site}:{line_of("torch.zeros(2")}',
        f'torch.autocast("cuda") -> CPU bfloat16 at {site}:{line_of("autocast")}',
    ):
        assert expected in mapped, mapped
    assert report["summary"]["eval_batches"] == {"0": 4, "1": 4}


def test_a_rank_zero_evaluation_in_a_gpu_script_is_found_on_cpu() -> None:
    result, report = preflight_cpu("rank0")
    assert result.returncode == 1, result.output
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"] == f"tests/scripts/gpu_style.py:{line_of('dist.all_reduce(total)')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])


def test_what_cpu_cannot_map_is_named_with_exit_2() -> None:
    result, _ = preflight_cpu("stream")
    assert result.returncode == 2, result.output
    assert "--cpu could not run this script on CPU: rank" in result.output
    assert (
        f"torch.cuda.Stream requires CUDA support at {SCRIPT}:{line_of('torch.cuda.Stream()')}"
        in result.output
    )
    assert "Traceback" not in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="NCCL and CUDA work here: nothing to refuse")
def test_without_cpu_the_nccl_script_fails_with_a_pointer_to_it() -> None:
    result = run_bounded(
        [sys.executable, "-m", "ncclcheck", "preflight", "--nproc-per-node=2", str(SCRIPT)],
        PREFLIGHT_BOUND_S,
        cwd=REPO,
    )
    assert result.returncode == 2, result.output
    first = result.output.splitlines()[0]
    assert "failed on every rank before init_process_group" in first
    assert "_cuda_setDevice" in first  # torch.cuda.set_device on a CPU build: torch's own words
    assert "rerun with --cpu" in result.output


SYNCBN_SCRIPT = SCRIPTS / "syncbn_gpu.py"


def test_syncbatchnorm_on_cpu_matches_batchnorm_over_every_rank_batch() -> None:
    """--cpu's SyncBatchNorm (record/cpu_syncbn.py) on 3 gloo ranks with 2, 5 and 8
    samples (and once an empty batch): outputs, running statistics and gradients equal
    BatchNorm's over the batches put together, in float64."""
    script = SCRIPTS / "cpu_syncbn_numerics.py"
    result = run_to_its_end(torchrun_argv(script, 3), JOB_BOUND_S, cwd=REPO)
    assert result.returncode == 0, result.output
    assert "numerics ok" in result.output


def test_a_gpu_script_with_syncbatchnorm_trains_on_cpu() -> None:
    # PyTorch's own refuses CPU modules in DDP and CPU inputs: without the mapping
    # this run ended in "ValueError: SyncBatchNorm layers only work with GPU modules".
    result, report = ncclcheck("preflight", "--cpu", "--json", str(SYNCBN_SCRIPT), env={"MODE": "aligned"})
    assert result.returncode == 0, result.output
    assert report["verdict"] == "aligned"
    train_line = line_in(SYNCBN_SCRIPT, "F.cross_entropy(model(images.cuda())")
    mapped = "\n".join(report["summary"]["cpu"])
    assert (
        f"SyncBatchNorm -> CPU statistics, same collectives at tests/scripts/syncbn_gpu.py:{train_line}"
        in mapped
    )


def test_a_rank_zero_forward_in_training_mode_is_named_as_syncbatchnorms_all_gather() -> None:
    result, report = ncclcheck(
        "preflight", "--cpu", "--json", str(SYNCBN_SCRIPT), env={"MODE": "rank0_preview"}
    )
    assert result.returncode == 1, result.output
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert (
        finding["site"] == f"tests/scripts/syncbn_gpu.py:{line_in(SYNCBN_SCRIPT, 'preview = model.module(')}"
    )
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "all_gather (SyncBatchNorm's batch statistics, in training mode)" in finding["message"]
    assert any(line.startswith("SyncBatchNorm synchronises") for line in finding["evidence"])


def test_a_syncbatchnorm_skipped_for_one_ranks_single_sample_batch_is_a_data_dependent_branch() -> None:
    script = SCRIPTS / "syncbn_single_sample.py"
    result, report = ncclcheck("preflight", "--cpu", "--json", str(script))
    assert result.returncode == 1, result.output
    finding = report["findings"][0]
    assert finding["cause"] == "data-dependent-branch", finding
    assert finding["site"] == f"tests/scripts/syncbn_single_sample.py:{line_in(script, 'h = self.bn(h)')}"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [1])
    assert "under `if h.shape[0] > 1`, a test on the data" in finding["message"]

    result, report = ncclcheck("preflight", "--cpu", "--json", str(script), env={"MODE": "sampler"})
    assert result.returncode == 0, result.output
    assert report["verdict"] == "aligned"
