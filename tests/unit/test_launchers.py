"""launch/launchers.py as pure analysis: where a script's source starts its own ranks,
the variables srun would give the task torchrun's variables describe, the command each
launcher is run with, and what accelerate launch is refused on."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclcheck.launch import launchers
from ncclcheck.launch.launchers import check_accelerate, check_deepspeed, guard_of, launcher_argv, own_starter
from ncclcheck.record.launched import (
    LOCAL_RANK_ARGUMENT,
    give_back_user_tmpdir,
    launcher_tmpdir,
    slurm_task_environment,
)
from ncclcheck.settings import Launcher


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)\n", ("mp.spawn", 2)),
        (
            "from torch import multiprocessing as tmp\n\ntmp.start_processes(main)\n",
            ("tmp.start_processes", 3),
        ),
        ("from torch.multiprocessing import spawn\nspawn(main, args=(4,), nprocs=4)\n", ("spawn", 2)),
        (
            "import torch.multiprocessing\ntorch.multiprocessing.spawn(main)\n",
            ("torch.multiprocessing.spawn", 2),
        ),
        # the standard library's multiprocessing, and a method of the user's own: not spawn's ranks
        ("import multiprocessing as mp\nmp.Process(target=main).start()\n", None),
        ("class Pool:\n    def spawn(self): ...\nPool().spawn()\n", None),
    ],
)
def test_a_script_that_starts_its_own_ranks_is_told_from_its_source(
    tmp_path: Path, source: str, found: tuple[str, int] | None
) -> None:
    script = tmp_path / "train.py"
    script.write_text(source)
    assert own_starter(script) == found


@pytest.mark.parametrize(
    ("source", "guard"),
    [
        # pytorch/examples' ImageNet: spawn only under an option, off by default
        (
            "import torch.multiprocessing as mp\n"
            "def main(args):\n"
            "    if args.multiprocessing_distributed:\n"
            "        mp.spawn(worker, nprocs=4)\n"
            "    else:\n"
            "        worker(0)\n",
            "args.multiprocessing_distributed",
        ),
        # whatever its options: the `__main__` test is no option
        (
            "import torch.multiprocessing as mp\n"
            "if __name__ == '__main__':\n"
            "    mp.spawn(worker, nprocs=2)\n",
            None,
        ),
        ("import torch.multiprocessing as mp\ndef main():\n    mp.spawn(worker, nprocs=2)\n", None),
    ],
)
def test_a_spawn_under_a_test_of_the_options_is_told_from_one_that_always_runs(
    tmp_path: Path, source: str, guard: str | None
) -> None:
    script = tmp_path / "train.py"
    script.write_text(source)
    found = own_starter(script)
    assert found is not None
    assert guard_of(script, found[1]) == guard


def test_an_srun_task_gets_srun_variables_and_loses_torchruns() -> None:
    torchrun = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "TORCHELASTIC_RUN_ID": "abc",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29400",
        "NCCLCHECK_SLURM_MASTER_PORT": "41000",
        "PATH": "/usr/bin",
    }
    task, gone = slurm_task_environment(torchrun, "node7")
    assert (task["SLURM_PROCID"], task["SLURM_LOCALID"], task["SLURM_NODEID"]) == ("5", "1", "1")
    assert (task["SLURM_NTASKS"], task["SLURM_NTASKS_PER_NODE"], task["SLURM_NNODES"]) == ("8", "4", "2")
    assert task["SLURM_NODELIST"] == "node7" and task["SLURM_JOB_NAME"] != "bash"
    assert task["MASTER_PORT"] == "41000"  # rank 0 makes the store: not the agent's port
    assert sorted(gone) == sorted(
        [
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_USE_AGENT_STORE",
        ]
    )


TORCHRUN_ARGS = ["--nproc-per-node=2", "--nnodes=1", "--standalone"]


def test_each_launcher_runs_the_bootstrap_in_front_of_the_script() -> None:
    target = ["train.py", "--lr", "0.1"]
    tail = ["--module", "ncclcheck.record.bootstrap", *target]
    assert launcher_argv(Launcher.TORCHRUN, TORCHRUN_ARGS, target, None)[1:] == [
        "-m",
        "torch.distributed.run",
        *TORCHRUN_ARGS,
        *tail,
    ]
    legacy = launcher_argv(Launcher.LEGACY_LAUNCH, TORCHRUN_ARGS, target, None)
    assert legacy[1:3] == ["-m", "torch.distributed.launch"]
    spawned = launcher_argv(Launcher.SPAWN, TORCHRUN_ARGS, target, None)
    assert spawned[1:] == ["-m", "ncclcheck.record.spawned", *target]
    accelerate = launcher_argv(Launcher.ACCELERATE, TORCHRUN_ARGS, target, "cfg.yaml")
    assert accelerate[1:5] == ["-m", "accelerate.commands.launch", "--config_file", "cfg.yaml"]
    assert accelerate[accelerate.index("--num_processes") + 1] == "2"  # the dry run's, not the config's
    assert accelerate[-len(tail) :] == tail
    deepspeed = launcher_argv(Launcher.DEEPSPEED, TORCHRUN_ARGS, target, None)
    assert deepspeed[1:5] == ["-m", "deepspeed.launcher.runner", "--num_gpus", "2"]
    assert deepspeed[-len(tail) :] == tail


def test_the_legacy_local_rank_argument_is_told_from_the_scripts_own() -> None:
    assert LOCAL_RANK_ARGUMENT.match("--local-rank=3") and LOCAL_RANK_ARGUMENT.match("--local_rank=0")
    assert not LOCAL_RANK_ARGUMENT.match("--local-rank") and not LOCAL_RANK_ARGUMENT.match("train.py")


def test_accelerate_that_is_not_installed_is_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launchers.importlib.util, "find_spec", lambda name: None)
    assert check_accelerate("cfg.yaml", "1") == (
        "--launcher accelerate: accelerate is not installed here (pip install accelerate)"
    )
    assert (
        check_deepspeed("1")
        == "--launcher deepspeed: deepspeed is not installed here (pip install deepspeed)"
    )


def test_accelerate_on_several_nodes_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    config = tmp_path / "cfg.yaml"
    config.write_text("distributed_type: MULTI_GPU\n")
    assert check_accelerate(str(config), "2").startswith("--launcher accelerate runs the ranks of one node")
    assert check_accelerate(str(config), "1") == ""


@pytest.mark.parametrize("user_tmpdir", ["/scratch/me/tmp", None])
def test_the_launcher_gets_a_tmpdir_of_its_own_and_each_rank_the_users_back(user_tmpdir: str | None) -> None:
    launcher_env = {} if user_tmpdir is None else {"TMPDIR": user_tmpdir}
    launcher_tmpdir(launcher_env, "/dry-run/launcher-tmp")
    assert launcher_env["TMPDIR"] == "/dry-run/launcher-tmp"
    rank_env = dict(launcher_env)  # what a rank inherits
    give_back_user_tmpdir(rank_env)
    assert rank_env == ({} if user_tmpdir is None else {"TMPDIR": user_tmpdir})
    give_back_user_tmpdir(rank_env)  # a rank started without ncclcheck's launcher: left alone
    assert rank_env == ({} if user_tmpdir is None else {"TMPDIR": user_tmpdir})
