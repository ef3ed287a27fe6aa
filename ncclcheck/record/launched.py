"""What a rank sees of the launcher that started it, and what its bootstrap makes of it:
the variables preflight hands each rank (the launcher kinds: settings.Launcher), and the
environment srun would have set for a task that torchrun started (slurm_task_environment).
Read inside the ranks (record/bootstrap.py) and by the launch code that starts them
(launch/launchers.py)."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import MutableMapping

BOOTSTRAP = "ncclcheck.record.bootstrap"
# what torch.distributed.launch (--local-rank=N) and deepspeed (--local_rank=N) put
# before the script's own arguments: the rank's bootstrap hands it on to the script
LOCAL_RANK_ARGUMENT = re.compile(r"^--local[-_]rank=\d+$")
ENV_LAUNCHER = "NCCLCHECK_LAUNCHER"  # what each rank's bootstrap is to look like
# srun starts no store: rank 0's init_process_group makes one on MASTER_PORT, which
# torchrun's agent holds; preflight picks a free port for it, the same for every rank
ENV_SLURM_PORT = "NCCLCHECK_SLURM_MASTER_PORT"
# torchrun's agent makes a log folder in TMPDIR at every start and never removes it: the
# launcher gets a TMPDIR inside the dry run's own folder (removed with it), and each rank
# gets the user's back from here ("" when TMPDIR was unset), so the script's own
# temporary files go where they would without ncclcheck
ENV_USER_TMPDIR = "NCCLCHECK_USER_TMPDIR"
# what torchrun tells a rank and srun does not: a script that branches on "RANK in
# os.environ" (or Lightning's TorchElasticEnvironment) must take its srun path
_TORCHRUN_ONLY = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
)


def slurm_task_environment(env: dict[str, str], host: str) -> tuple[dict[str, str], list[str]]:
    """What srun sets for the task that torchrun's variables in ``env`` describe (one task
    per rank, the nodes in order), and the variables to remove: torchrun's own. The
    rendezvous address stays, on a port of its own for rank 0 to listen on (ENV_SLURM_PORT):
    srun sets none, a script that sets its own overrides it, and one that does not would
    fail under srun too."""
    world, per_node = int(env["WORLD_SIZE"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
    nodes = max(1, world // max(1, per_node))
    task = {
        "SLURM_JOB_ID": env.get("SLURM_JOB_ID", "4242"),
        "SLURM_JOB_NAME": "ncclcheck-preflight",  # not "bash": Lightning's SLURM detection
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": env["RANK"],
        "SLURM_LOCALID": env.get("LOCAL_RANK", "0"),
        "SLURM_NODEID": env.get("GROUP_RANK", "0"),
        "SLURM_NTASKS": str(world),
        "SLURM_NPROCS": str(world),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NODELIST": host,
        "SLURM_JOB_NODELIST": host,
        "SLURM_STEP_NODELIST": host,
        "SLURMD_NODENAME": host,
    }
    if ENV_SLURM_PORT in env:
        task["MASTER_PORT"] = env[ENV_SLURM_PORT]
    gone = [name for name in env if name in _TORCHRUN_ONLY or name.startswith("TORCHELASTIC_")]
    return task, gone


def launcher_tmpdir(env: dict[str, str], folder: str) -> None:
    """Point the launcher's TMPDIR at ``folder`` in ``env``, keeping the user's for the ranks."""
    env[ENV_USER_TMPDIR] = env.get("TMPDIR", "")
    env["TMPDIR"] = folder


def give_back_user_tmpdir(environ: MutableMapping[str, str] = os.environ) -> None:
    """In a rank, before the script runs: the TMPDIR the user had (launcher_tmpdir)."""
    if ENV_USER_TMPDIR not in environ:
        return
    user = environ.pop(ENV_USER_TMPDIR)
    if user:
        environ["TMPDIR"] = user
    else:
        environ.pop("TMPDIR", None)
    tempfile.tempdir = None  # gettempdir() reads the environment again
