"""preflight starts the ranks the way the script's users do: scripts that start their
own ranks (--launcher spawn, auto-detected) run once, every rank they start recorded;
srun's variables (--launcher slurm); accelerate launch with the user's config; the
legacy torch.distributed.launch and deepspeed, and their --local-rank argument.
Nothing left behind."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ..conftest import REPO, SCRIPTS, cause_site_ranks, line_in
from .test_preflight import leftover_ranks, preflight

pytestmark = pytest.mark.ranks

SPAWNED = SCRIPTS / "spawned"


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_the_ddp_tutorial_shape_is_preflighted_unchanged() -> None:
    """mp.spawn(demo_basic, args=(world_size,), nprocs=world_size), MASTER_ADDR/PORT set in
    the script, rank and world size passed to init_process_group: only rank 0 evaluates,
    and the evaluation all-reduces."""
    script = SPAWNED / "ddp_tutorial.py"
    proc, report = preflight(str(script), env={"TUTORIAL_PORT": free_port()})
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert cause_site_ranks(finding) == (
        "rank-conditional-collective",
        f"tests/scripts/spawned/ddp_tutorial.py:{line_in(script, 'dist.all_reduce(total)')}",
        [0],
        [1],
    )
    assert report["world_size"] == 2
    spawn_line = line_in(script, "mp.spawn(demo_fn")
    assert f"mp.spawn at tests/scripts/spawned/ddp_tutorial.py:{spawn_line}" in report["summary"]["launcher"]
    assert not leftover_ranks(str(script))


def test_the_fixed_tutorial_is_aligned_and_its_large_validation_set_fast_forwarded() -> None:
    """Spawned ranks have no launcher's store: they meet in their process group's own
    (a store, never a collective) and skip alike: 6,242 of 6,250 batches per rank."""
    script = SPAWNED / "ddp_tutorial.py"
    env = {"TUTORIAL_PORT": free_port(), "FIXED": "1", "VAL_SAMPLES": "200000"}
    proc, report = preflight(str(script), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert [r["eval_batches"] for r in report["ranks"]] == [3 * 6250, 3 * 6250]  # three epochs
    assert report["summary"]["eval_fast_forward"] == [
        "val_loader: the first 6242 of 6250 batches skipped on every rank (not loaded), the rest run for real"
    ]
    assert report["summary"]["collectives_per_phase"]["eval"] == 2 * 3  # the mean's all_reduce, per epoch
    assert not leftover_ranks(str(script))


@pytest.mark.parametrize(
    ("how", "launcher", "call"),
    [
        ("spawn", "torch.multiprocessing.spawn", "mp.spawn("),
        ("bound-fork", "torch.multiprocessing.start_processes", "start_processes(worker"),
    ],
)
def test_ranks_spawned_from_another_module_are_found_at_run_time(how: str, launcher: str, call: str) -> None:
    """The source shows no mp.spawn: the torchrun rank refuses to start more, where the
    process starts, however the helper reached torch's start_processes (looked up at
    call time, or bound at import from its module with the fork start method), and the
    script runs again with the spawn launcher, every rank it starts recorded."""
    script = SPAWNED / "launched_elsewhere.py"
    env = {"TUTORIAL_PORT": free_port(), "LAUNCH_HELPER": how}
    proc, report = preflight(str(script), env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
        "rank-conditional-collective",
        [0],
        [1],
    )
    helper = SPAWNED / "spawn_helper.py"
    site = f"{launcher} at tests/scripts/spawned/spawn_helper.py:{line_in(helper, call)}"
    assert site in report["summary"]["launcher"], report["summary"]["launcher"]
    assert not leftover_ranks(str(script))


def test_ranks_that_die_before_their_recorder_are_named_with_their_exit_and_error() -> None:
    """mp.spawn's processes die while they unpickle their arguments (a connection reset,
    as Lightning's ddp_spawn showed on a loaded machine): no rank wrote a trace, and the
    report says which ranks exited, with what code and error, not that torchrun failed."""
    script = SPAWNED / "dies_at_start.py"
    proc, report = preflight(str(script))
    assert proc.returncode == 2 and report is None, proc.stdout[-2000:]
    first = proc.stderr.splitlines()[0]
    assert "torchrun" not in first, first
    assert first.startswith(
        "ncclcheck: error: the ranks the script started ended before ncclcheck's recorder ran in "
        "them (before their first collective): rank "
    ), first
    assert "exited with code 1" in first, first
    assert first.endswith(
        "the last error printed: ConnectionResetError: [Errno 104] Connection reset by peer "
        "(while receiving train-shard)"
    ), first
    assert "Its last output:" in proc.stderr and "in reopen_shard" in proc.stderr, proc.stderr
    assert not leftover_ranks(str(script))


def test_a_rank_that_fails_before_init_is_told_apart_from_the_ranks_stopped_with_it() -> None:
    """Under torchrun, rank 1 exits with code 3 before init_process_group while rank 0
    waits in it: rank 1's exit, its error and its last output; rank 0 stopped by the
    job's end, not "failed on every rank"."""
    script = SCRIPTS / "dies_before_init.py"
    proc, report = preflight(str(script))
    assert proc.returncode == 2 and report is None, proc.stdout[-2000:]
    first = proc.stderr.splitlines()[0]
    exit_line = line_in(script, "sys.exit(3)")
    assert first == (
        "ncclcheck: error: rank 1 failed before init_process_group, before any collective: rank 1 "
        f"exited with code 3 (SystemExit: 3 at {script}:{exit_line} in load_shard); rank 0 had not "
        "reached a collective and was stopped with the job, was killed by SIGTERM"
    ), first
    assert "cannot open shard-1.bin: no such file" in proc.stderr
    assert not leftover_ranks(str(script))


def test_a_script_that_reads_only_slurm_variables_finds_what_its_torchrun_twin_finds() -> None:
    """--launcher slurm: each rank sees SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS as srun
    sets them and none of torchrun's (the script refuses a mix), rank 0 a free port to
    make the store on; the finding is the one the same script's bug gets under torchrun
    (rank 0's all_reduce alone; every other test runs torchrun)."""
    script = SCRIPTS / "slurm_task.py"
    proc, report = preflight("--launcher", "slurm", str(script))
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    assert cause_site_ranks(finding) == (
        "rank-conditional-collective",
        f"tests/scripts/slurm_task.py:{line_in(script, 'dist.all_reduce(')}",
        [0],
        [1],
    )
    proc, report = preflight("--launcher", "slurm", str(script), env={"FIXED": "1"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-3000:]
    assert not leftover_ranks(str(script))


def test_more_ranks_than_the_allocation_gives_is_one_line_and_exit_2() -> None:
    proc, _ = preflight(
        "--launcher", "slurm", "--nproc-per-node=4", str(SCRIPTS / "slurm_task.py"), env={"SLURM_NTASKS": "2"}
    )
    assert proc.returncode == 2
    assert (
        "--launcher slurm: 4 ranks asked (4 per node x 1), the allocation gives 2 tasks (SLURM_NTASKS)"
        in proc.stderr
    )


def assert_validation_on_local_rank_0_is_found(proc: subprocess.CompletedProcess[str], report: Any) -> None:
    """legacy_local_rank.py's bug: its validation all-reduces on local rank 0 alone."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    script = SCRIPTS / "legacy_local_rank.py"
    assert cause_site_ranks(finding) == (
        "rank-conditional-collective",
        f"tests/scripts/legacy_local_rank.py:{line_in(script, 'dist.all_reduce(val_loss)')}",
        [0],
        [1],
    )


def test_a_script_for_the_legacy_launcher_gets_its_local_rank_argument() -> None:
    script = SCRIPTS / "legacy_local_rank.py"
    proc, report = preflight("--launcher", "torch.distributed.launch", str(script))
    assert_validation_on_local_rank_0_is_found(proc, report)
    assert "--local-rank=N" in report["summary"]["launcher"]
    fixed, report = preflight("--launcher", "torch.distributed.launch", str(script), env={"FIXED": "1"})
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert report["verdict"] == "aligned"
    assert not leftover_ranks(str(script))


ACCELERATE_CONFIG = SCRIPTS / "accelerate_config_multi_gpu.yaml"


def test_accelerate_launch_with_a_config_finds_what_its_torchrun_twin_finds(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    script = SCRIPTS / "accelerate_save_state.py"
    config = str(ACCELERATE_CONFIG)
    proc, report = preflight("--accelerate-config", config, str(script), env={"CKPT_DIR": str(tmp_path)})
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = report["findings"][0]
    # what its torchrun twin finds (tests/ranks/test_frameworks.py runs it under torchrun)
    assert cause_site_ranks(finding) == (
        "rank-conditional-collective",
        f"tests/scripts/accelerate_save_state.py:{line_in(script, 'accelerator.save_state(')}",
        [0],
        [1],
    )
    # the config's 8 processes are the cluster's: the dry run's are --nproc-per-node's
    assert report["world_size"] == 2
    assert report["summary"]["launcher"] == f"accelerate launch --config_file {config} started the ranks"
    assert not leftover_ranks(str(script))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("--launcher", "accelerate"),
            "--launcher accelerate needs --accelerate-config FILE, the file you give accelerate launch "
            "--config_file",
        ),
        (("--accelerate-config", "no-such.yaml"), "--accelerate-config no-such.yaml: no such file"),
        (
            ("--accelerate-config", str(SCRIPTS / "accelerate_config_multi_cpu.yaml")),
            "distributed_type MULTI_CPU: accelerate launch starts one process for it",
        ),
        (
            ("--launcher", "torchrun", "--accelerate-config", str(ACCELERATE_CONFIG)),
            "--accelerate-config goes with --launcher accelerate, not --launcher torchrun",
        ),
    ],
)
def test_what_accelerate_launch_cannot_run_is_one_line_and_exit_2(args: tuple[str, ...], said: str) -> None:
    pytest.importorskip("accelerate")
    proc, report = preflight(*args, str(SCRIPTS / "accelerate_save_state.py"))
    assert (proc.returncode, report) == (2, None), proc.stderr[-2000:]
    assert said in proc.stderr
    assert "Traceback" not in proc.stderr


def test_deepspeeds_launcher_gives_the_same_finding_and_its_local_rank_argument() -> None:
    """deepspeed's runner (deepspeed.launcher.runner, as `deepspeed train.py` runs it):
    --local_rank=N before the script's arguments, no torchrun store. Skipped where
    deepspeed is not installed (not in the test extras: its build pulls a CUDA torch)."""
    pytest.importorskip("deepspeed")
    script = SCRIPTS / "legacy_local_rank.py"
    proc, report = preflight("--launcher", "deepspeed", str(script))
    assert_validation_on_local_rank_0_is_found(proc, report)
    assert (
        report["summary"]["launcher"] == "deepspeed's launcher started the ranks, each given --local_rank=N"
    )
    fixed, report = preflight("--launcher", "deepspeed", str(script), env={"FIXED": "1"})
    assert (fixed.returncode, report["verdict"]) == (0, "aligned"), fixed.stderr[-3000:]
    assert not leftover_ranks(str(script))


def test_a_launcher_that_is_not_installed_is_one_line_and_exit_2() -> None:
    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    proc, _ = preflight("--launcher", "deepspeed", str(SCRIPTS / "legacy_local_rank.py"))
    assert proc.returncode == 2
    assert "--launcher deepspeed: deepspeed is not installed here (pip install deepspeed)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_spawn_under_an_option_off_by_default_runs_under_torchrun_and_spawns_when_asked() -> None:
    """pytorch/examples' ImageNet shape: mp.spawn only under --multiprocessing-distributed.
    By default the script is one rank per process, as torchrun starts it; with the option,
    its ranks start their own, and preflight runs it again with the spawn launcher."""
    script = SCRIPTS / "spawn_under_option.py"
    proc, report = preflight("--nproc-per-node=2", str(script), cwd=REPO)
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-3000:]
    assert "launcher" not in report["summary"], report["summary"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]

    proc, report = preflight(str(script), "--multiprocessing-distributed", "--port", free_port(), cwd=REPO)
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-3000:]
    site = (
        f"torch.multiprocessing.spawn at tests/scripts/spawn_under_option.py:{line_in(script, 'mp.spawn(')}"
    )
    assert site in report["summary"]["launcher"], report["summary"]["launcher"]
    assert not leftover_ranks(str(script))
