"""Reaping process trees: torchrun starts each rank in a session of its own, so
killing the launcher's process group leaves the ranks running. We kill by tree."""

from __future__ import annotations

import contextlib
import signal

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(pid: int, sig: int = signal.SIGKILL, timeout: float = 5.0) -> list[int]:
    """Send ``sig`` to ``pid`` and all its descendants; wait up to ``timeout`` for them.

    The tree is listed *before* anything is signalled: once the parent dies its
    children are re-parented and can no longer be found from it. Stopped
    processes (SIGSTOP) die on SIGKILL too. Returns the pids still alive.
    """
    procs = descendants(pid)
    with contextlib.suppress(psutil.Error):
        procs.insert(0, psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    return [proc.pid for proc in alive]
