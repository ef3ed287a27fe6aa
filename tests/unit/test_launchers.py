"""launch/launchers.py as pure analysis: where a script's source starts its own ranks,
and the variables srun would give the task torchrun's variables describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from ncclcheck.launch.launchers import own_starter, slurm_task_environment


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
