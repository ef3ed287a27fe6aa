"""Ranks a process starts itself, found where the process is started, whoever asks.

``torch.multiprocessing.spawn`` and ``start_processes`` start every process with torch's
own ``_wrap`` as its target: ``mp.spawn(main, nprocs=4)`` in the user's script,
Lightning's ``ddp_spawn`` and Fabric's launchers, accelerate's notebook launcher all
come through it, whichever version and however they imported it (``mp.start_processes``
looked up at call time, ``from torch.multiprocessing.spawn import start_processes`` bound
at import, a ``multiprocessing`` context of their own). So the hook sits at
``multiprocessing.process.BaseProcess.start`` and recognises that target; a DataLoader
worker (torch's ``_worker_loop``) or any other helper process is left alone.

Not recognised: ranks started with a plain ``multiprocessing.Process(target=run)`` of the
user's own function (they are not torch's ``_wrap``, and nothing at their start says that
they will call ``init_process_group``).
"""

from __future__ import annotations

import multiprocessing.process
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_TORCH_SPAWN_FILE = "torch/multiprocessing/spawn.py"


@dataclass
class RankStart:
    """One process torch's start_processes is about to start."""

    launcher: str  # "torch.multiprocessing.spawn" or "torch.multiprocessing.start_processes"
    index: int  # the process index start_processes gives it (its rank function's first argument)
    nprocs: int | None  # how many it starts, where start_processes' frame says so
    fn: Callable[..., Any]  # the rank function
    args: tuple[Any, ...]  # its arguments after the index


def _torch_wrap() -> Any:
    module = sys.modules.get("torch.multiprocessing.spawn")
    return getattr(module, "_wrap", None)


def rank_start(process: multiprocessing.process.BaseProcess) -> RankStart | None:
    """What ``process`` is, when torch's start_processes is starting it as a rank."""
    wrap = _torch_wrap()
    target = getattr(process, "_target", None)
    args = getattr(process, "_args", ())
    if wrap is None or target is not wrap or len(args) < 3:
        return None
    launcher, nprocs = "torch.multiprocessing.start_processes", None
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.replace("\\", "/").endswith(_TORCH_SPAWN_FILE):
            if code.co_name == "start_processes" and isinstance(frame.f_locals.get("nprocs"), int):
                nprocs = frame.f_locals["nprocs"]
            elif code.co_name == "spawn":
                launcher = "torch.multiprocessing.spawn"
        frame = frame.f_back  # type: ignore[assignment]
    return RankStart(launcher, int(args[1]), nprocs, args[0], tuple(args[2]))


_handler: Callable[[multiprocessing.process.BaseProcess, RankStart], None] | None = None


def on_rank_start(handle: Callable[[multiprocessing.process.BaseProcess, RankStart], None]) -> None:
    """Call ``handle`` before every process torch's start_processes starts, in this process
    and (for the fork start method) in the processes it forks, in place of the handler
    set before (a spawned rank refuses where its parent recorded). ``handle`` may raise to
    refuse the start, or rewrite the process's target arguments (``process._args``)."""
    global _handler
    _handler = handle
    original = multiprocessing.process.BaseProcess.start
    if getattr(original, "__ncclcheck_wrapped__", False):
        return

    def start(self: multiprocessing.process.BaseProcess) -> None:
        handler = _handler
        if handler is not None and (found := rank_start(self)) is not None:
            handler(self, found)
        original(self)

    start.__ncclcheck_wrapped__ = True  # type: ignore[attr-defined]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
