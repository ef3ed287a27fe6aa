"""Who starts a script's ranks, and how preflight does it the same way
(``preflight --launcher``): torchrun (launch/torchrun.py runs the script under it); the
script itself with torch.multiprocessing (record/spawned.py runs it once and records
every rank it starts); srun, whose tasks know their rank from SLURM_* variables only
(torchrun starts the ranks, and each rank's bootstrap trades torchrun's variables for
the ones srun would have set, slurm_task_environment); ``accelerate launch`` with the
user's config file, the legacy ``torch.distributed.launch`` and ``deepspeed``, each run
through its own code with the bootstrap as the module it starts (launcher_argv)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

from ncclcheck.record.launched import BOOTSTRAP
from ncclcheck.settings import Launcher

# the configurations accelerate launch starts through torchrun, one process per rank;
# MULTI_CPU and NO start a single process (MULTI_CPU needs mpirun for more)
_ACCELERATE_TORCHRUN_TYPES = ("MULTI_GPU", "FSDP", "DEEPSPEED", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU")

# the functions of torch.multiprocessing that start ranks in a script
_STARTERS = frozenset({"spawn", "start_processes"})


def own_starter(path: Path) -> tuple[str, int] | None:
    """Where the script starts its own ranks (``mp.spawn(main, nprocs=4)``, ``from
    torch.multiprocessing import spawn``): the call as written and its line, or None.
    Read from the source, nothing imported: a script that starts them from another
    module is caught at run time instead (its ranks refuse to start more, and
    preflight runs it again with the spawn launcher)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    modules: set[str] = set()  # names bound to torch.multiprocessing
    functions: set[str] = set()  # names bound to its spawn / start_processes
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "torch.multiprocessing"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("torch.multiprocessing", "torch"):
            for alias in node.names:
                if node.module == "torch" and alias.name == "multiprocessing":
                    modules.add(alias.asname or alias.name)
                elif node.module == "torch.multiprocessing" and alias.name in _STARTERS:
                    functions.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in functions:
            return ast.unparse(func), node.lineno
        if isinstance(func, ast.Attribute) and func.attr in _STARTERS:
            owner = ast.unparse(func.value)
            if owner in modules or owner == "torch.multiprocessing":
                return ast.unparse(func), node.lineno
    return None


def guard_of(path: Path, line: int) -> str | None:
    """The test of the ``if`` the call at ``line`` sits under, other than ``if __name__ ==
    "__main__"``: a script that spawns its ranks only under an option
    (``if args.multiprocessing_distributed:``) may not on the path its defaults take."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if (
            not isinstance(node, ast.If)
            or ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
        ):
            continue
        for branch in (node.body, node.orelse):
            if any(stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno) for stmt in branch):
                return ast.unparse(node.test)
    return None


def free_port() -> int:
    """A TCP port nothing listens on now, for a store the ranks will make."""
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def launcher_argv(
    launcher: Launcher, torchrun_args: list[str], target: list[str], accelerate_config: str | None
) -> list[str]:
    """The command that starts the dry run's ranks the way ``launcher`` does, each rank
    running the bootstrap in front of ``target`` (the script or -m module, and its
    arguments). ``torchrun_args``: torchrun's options (TorchrunOptions.argv)."""
    python = sys.executable
    if launcher == Launcher.SPAWN:  # the script starts its ranks: run it once (record/spawned.py)
        return [python, "-m", "ncclcheck.record.spawned", *target]
    # the dry run's ranks, not a config's: a CI machine is not the cluster
    nproc = next(a.split("=", 1)[1] for a in torchrun_args if a.startswith("--nproc-per-node="))
    if launcher == Launcher.ACCELERATE:  # the port: 0, accelerate picks a free one
        own = [
            "accelerate.commands.launch",
            "--config_file",
            str(accelerate_config),
            "--num_processes",
            nproc,
        ]
        own += ["--num_machines", "1", "--main_process_port", "0"]
        return [python, "-m", *own, "--module", BOOTSTRAP, *target]
    if launcher == Launcher.DEEPSPEED:  # deepspeed's runner; on one node it runs deepspeed.launcher.launch
        own = ["deepspeed.launcher.runner", "--num_gpus", nproc, "--master_port", str(free_port())]
        return [python, "-m", *own, "--module", BOOTSTRAP, *target]
    module = "torch.distributed.launch" if launcher == Launcher.LEGACY_LAUNCH else "torch.distributed.run"
    return [python, "-m", module, *torchrun_args, "--module", BOOTSTRAP, *target]


def check_deepspeed(nodes: str) -> str:
    """What is wrong with running the ranks through deepspeed's launcher (one line), or ""."""
    if importlib.util.find_spec("deepspeed") is None:
        return "--launcher deepspeed: deepspeed is not installed here (pip install deepspeed)"
    if nodes not in ("1", "1:1"):
        return "--launcher deepspeed runs the ranks of one node: run preflight on each node"
    return ""


def check_accelerate(config: str | None, nodes: str) -> str:
    """What is wrong with running ``accelerate launch --config_file config`` for a dry run
    (one line), or "" with the config's distributed_type read by accelerate itself."""
    if importlib.util.find_spec("accelerate") is None:
        return "--launcher accelerate: accelerate is not installed here (pip install accelerate)"
    if not config:
        return (
            "--launcher accelerate needs --accelerate-config FILE, the file you give "
            "accelerate launch --config_file"
        )
    if not Path(config).is_file():
        return f"--accelerate-config {config}: no such file"
    if nodes not in ("1", "1:1"):
        return "--launcher accelerate runs the ranks of one node: run preflight on each node"
    from accelerate.commands.config.config_args import (  # type: ignore[import-untyped]
        load_config_from_file,
    )

    try:
        kind = str(getattr(load_config_from_file(config), "distributed_type", "NO"))
    except Exception as exc:  # accelerate's own reading of the file: its words
        return f"--accelerate-config {config}: accelerate cannot read it ({type(exc).__name__}: {exc})"
    kind = kind.rsplit(".", 1)[-1]
    if kind not in _ACCELERATE_TORCHRUN_TYPES:
        return (
            f"--accelerate-config {config}: distributed_type {kind}: accelerate launch starts one process "
            "for it (MULTI_CPU needs mpirun for more), so there are no ranks to check; use the config "
            "of the cluster job (MULTI_GPU, FSDP, DEEPSPEED), with --cpu on a machine without GPUs"
        )
    if kind == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        return f"--accelerate-config {config}: distributed_type DEEPSPEED needs deepspeed, not installed here"
    return ""
