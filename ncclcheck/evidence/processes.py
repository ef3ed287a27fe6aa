"""Finding a job's ranks on this host: by their environment (RANK, WORLD_SIZE,
LOCAL_RANK, GROUP_RANK, TORCHELASTIC_RUN_ID as torchrun, accelerate and deepspeed set
them; SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID for srun's tasks), or, for torch.multiprocessing.spawn,
which sets none, by the process index its wrapper holds."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, NoReturn

import psutil

from ncclcheck.errors import InputError, StackPermissionError
from ncclcheck.evidence import flight_recorder
from ncclcheck.evidence.stacks import ProcessStack, dump_stacks
from ncclcheck.wording import relative


@dataclass
class RankProcess:
    pid: int
    rank: int
    world_size: int
    local_rank: int = 0
    group_rank: int = 0
    # the ranks its node runs (torchrun's LOCAL_WORLD_SIZE, srun's tasks on the node); 0:
    # not said, so which missing ranks belonged on this host is unknown
    local_world_size: int = 0
    run_id: str = ""
    host: str = field(default_factory=socket.gethostname)
    status: str = ""
    # a Flight Recorder dump of this rank, read on its host (see flight_recorder.read_dump)
    flight_recorder: dict[str, Any] = field(default_factory=dict)


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.AccessDenied:
        raise StackPermissionError(f"no permission to read the environment of pid {proc.pid}") from None
    except psutil.Error:
        return {}


def _peek_environ(proc: psutil.Process) -> dict[str, str]:
    """The environment of a process we only glance at (a parent): unreadable is empty,
    not an error, since it may belong to someone else (init, a container runtime)."""
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def discover(pids: list[int]) -> tuple[list[RankProcess], list[psutil.Process]]:
    """The rank processes reachable from ``pids``; and the Python processes seen if none is a rank."""
    roots: list[psutil.Process] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise InputError(f"no process with pid {pid}") from None
        env = _environ(proc)
        for rank_var, world_var, *_ in (_TORCHRUN_IDENTITY, _SLURM_IDENTITY):
            if rank_var in env and world_var in env:
                parent = proc.parent()  # a rank: look from its agent, to find its siblings too
                parent_env = _peek_environ(parent) if parent is not None and parent.pid != 1 else {}
                if parent is not None and parent_env and rank_var not in parent_env:
                    proc = parent
                break
        roots.append(proc)
    procs = [proc for root in roots for proc in [root, *root.children(recursive=True)]]
    # torchrun's (and accelerate's, deepspeed's, which set the same) variables first; srun's
    # only where none has them: under srun, torchrun's agent has SLURM_PROCID too
    for variables in (_TORCHRUN_IDENTITY, _SLURM_IDENTITY):
        seen: dict[int, RankProcess] = {}
        pythons: list[psutil.Process] = []
        rank_var, world_var, local_var, node_var = variables
        for proc in procs:
            env = _environ(proc)
            # one srun task (a script that mp.spawns its ranks inside it) is not a rank of
            # a job: its children are, read from their stacks
            single_task = variables is _SLURM_IDENTITY and env.get(world_var, "1") in ("0", "1")
            if rank_var not in env or world_var not in env or single_task:
                if _is_python(proc):
                    pythons.append(proc)
                continue
            parent = proc.parent()
            if parent is not None and _peek_environ(parent).get(rank_var) == env[rank_var]:
                continue  # a DataLoader worker inherits its rank's environment
            seen[proc.pid] = RankProcess(
                pid=proc.pid,
                rank=int(env[rank_var]),
                world_size=int(env[world_var]),
                local_rank=int(env.get(local_var, "0")),
                group_rank=int(env.get(node_var, "0")),
                local_world_size=_local_world_size(env),
                run_id=env.get("TORCHELASTIC_RUN_ID", env.get("SLURM_JOB_ID", "")),
                status=_status(proc),
            )
            fr_path = flight_recorder.dump_path(env, int(env[rank_var]))
            if fr_path is not None:
                seen[proc.pid].flight_recorder = flight_recorder.read_dump(fr_path)
        if seen:
            break
    return sorted(seen.values(), key=lambda r: r.rank), pythons


# (rank, world size, local rank, node) as each launcher names them
_TORCHRUN_IDENTITY = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK")
_SLURM_IDENTITY = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID")


def _local_world_size(env: dict[str, str]) -> int:
    """How many ranks the launcher runs on this node: torchrun's LOCAL_WORLD_SIZE, else
    srun's tasks on this node (SLURM_TASKS_PER_NODE, "2(x3),1": 2 on each of the first
    three nodes, 1 on the fourth, read at SLURM_NODEID); 0 when unsaid."""
    said = env.get("LOCAL_WORLD_SIZE", "")
    if said.isdigit():
        return int(said)
    per_node: list[int] = []
    for part in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        count, _, times = part.partition("(x")
        if not count.isdigit() or not (times.rstrip(")").isdigit() or not times):
            return 0
        per_node += [int(count)] * (int(times.rstrip(")")) if times else 1)
    node = env.get("SLURM_NODEID", "0")
    return per_node[int(node)] if node.isdigit() and int(node) < len(per_node) else 0


def on_other_hosts(ranks: list[RankProcess]) -> list[int]:
    """The ranks of the job that are not ``ranks`` and that this host was not to run: with
    every rank's node size known, those beyond the nodes seen (a rank of a seen node that
    is absent died here); with it unknown, every absent rank, as nothing says where it ran."""
    if not ranks:
        return []
    world = max(r.world_size for r in ranks)
    seen = {r.rank for r in ranks}
    if any(r.local_world_size <= 0 for r in ranks):
        return sorted(set(range(world)) - seen)
    here: set[int] = set()
    for r in ranks:
        base = r.rank - r.local_rank  # torchrun numbers a node's ranks from its first one
        here.update(range(base, base + r.local_world_size))
    return sorted(set(range(world)) - seen - here)


# what a launcher that starts ranks runs as: its module or its program, read from argv
_LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate.commands.launch",
    "deepspeed.launcher.runner",
    "deepspeed.launcher.launch",
)
_LAUNCHER_PROGRAMS = ("torchrun", "accelerate", "deepspeed")


def launcher_among(pids: list[int]) -> str | None:
    """The launcher among ``pids`` and their descendants (torchrun, ``python -m
    torch.distributed.run``, accelerate, deepspeed) as "pid N (name)", or None: one that
    has not started its ranks yet, or is between two restarts, is a job about to have
    ranks, not a process that is not a job."""
    for pid in _with_descendants(pids):
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        for index, word in enumerate(argv[:4]):
            name = os.path.basename(word)
            if name in _LAUNCHER_PROGRAMS:
                return f"pid {pid} ({name})"
            if word == "-m" and index + 1 < len(argv) and argv[index + 1] in _LAUNCHER_MODULES:
                return f"pid {pid} ({argv[index + 1]})"
    return None


def _with_descendants(pids: list[int]) -> list[int]:
    found: list[int] = []
    for pid in pids:
        found.append(pid)
        try:
            found += [child.pid for child in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            continue
    return found


def _is_python(proc: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(proc.exe() or proc.name()).lower()
    except psutil.Error:
        return False


def _status(proc: psutil.Process) -> str:
    try:
        return str(proc.status())
    except psutil.Error:
        return "gone"


_SPAWN_WRAPPER = ("torch/multiprocessing/spawn.py", "_wrap")  # _wrap(fn, i, args, ...)


_MAX_SPAWN_CANDIDATES = 256


def spawned_ranks(
    pythons: list[psutil.Process], native: bool, nonblocking: bool, timeout: float
) -> tuple[list[RankProcess], dict[int, ProcessStack]]:
    """Ranks started by torch.multiprocessing.spawn, which sets no RANK: each runs the
    user's function under spawn's ``_wrap(fn, i, ...)``, whose ``i`` (the process index)
    is the rank on one node. Read from the stacks, dumped once with their locals."""
    candidates = pythons[:_MAX_SPAWN_CANDIDATES]
    stacks = dump_stacks(
        [p.pid for p in candidates], timeout=timeout, native=native, nonblocking=nonblocking, with_locals=True
    )
    found = _spawn_indices(stacks)
    # Given one rank's pid: its siblings are the other ranks.
    siblings = [
        child
        for parent in {_parent_pid(pid) for pid in found} - {None}
        for child in _children(parent)
        if child.pid not in stacks and _is_python(child)
    ]
    if siblings:
        more = dump_stacks(
            [p.pid for p in siblings[:_MAX_SPAWN_CANDIDATES]],
            timeout=timeout,
            native=native,
            nonblocking=nonblocking,
            with_locals=True,
        )
        stacks |= more
        found |= _spawn_indices(more)
    world = len(found)
    ranks = [
        RankProcess(pid=pid, rank=index, world_size=world, local_rank=index, status=stacks[pid].status)
        for pid, index in sorted(found.items(), key=lambda item: item[1])
    ]
    if len({r.rank for r in ranks}) != len(ranks):  # two spawn jobs under one pid: cannot tell
        return [], {}
    return ranks, {r.pid: stacks[r.pid] for r in ranks}


def _spawn_indices(stacks: dict[int, ProcessStack]) -> dict[int, int]:
    """pid -> process index, for the stacks that run under spawn's ``_wrap(fn, i, ...)``."""
    found: dict[int, int] = {}
    for pid, stack in stacks.items():
        main = stack.main
        if main is None:
            continue
        for index, frame in enumerate(main.frames):
            path = frame.file.replace("\\", "/")
            if path.endswith(_SPAWN_WRAPPER[0]) and frame.function.rsplit(".", 1)[-1] == _SPAWN_WRAPPER[1]:
                value = main.locals[index].get("i") if index < len(main.locals) else None
                if value is not None and value.isdigit():
                    found[pid] = int(value)
                break
    return found


def _parent_pid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def _children(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children() if pid else []
    except psutil.Error:
        return []


def not_distributed(
    pythons: list[psutil.Process], native: bool, nonblocking: bool, timeout: float
) -> NoReturn:
    """No rank here: say so, with the stack of what is there."""
    launcher = launcher_among([p.pid for p in pythons])
    if launcher is not None:
        raise InputError(
            f"{launcher} has not started its ranks: it is starting, or between two restarts",
            hint="Look again once its ranks run; ncclcheck watch --pid waits for them.",
        )
    stacks = dump_stacks(
        [p.pid for p in pythons[:4]], timeout=timeout, native=native, nonblocking=nonblocking
    )
    lines = []
    for pid, stack in stacks.items():
        frames = stack.main.frames[:8] if stack.main else []
        lines.append(
            f"pid {pid}: "
            + " <- ".join(f"{f.function} ({relative(f.file, os.getcwd())}:{f.line})" for f in frames)
        )
    raise InputError(
        "not a distributed job: no process there has RANK and WORLD_SIZE in its environment",
        hint="Its stack, innermost first:\n  " + "\n  ".join(lines or ["(none readable)"]),
    )
