"""Reaping process trees: torchrun starts each rank in a session of its own, so
killing the launcher's process group leaves the ranks running. We kill by tree."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Protocol

import psutil


class LaunchedJob(Protocol):
    """What a dry run watches of the process that stands for its job: torchrun's agent (a
    Popen), or the run a warm server forked (launch/replay.ForkedRun)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


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
    if sig == signal.SIGKILL:
        # Every process stopped before any dies: a rank killed first closes its sockets,
        # and a partner still running saw "Connection closed by peer", raised and wrote
        # that error to its trace before its own SIGKILL came (seen on a loaded machine: 2
        # of 32 dry runs read as a rank that died, not as the hang that was stopped).
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGSTOP)
    return kill_processes(procs, sig, timeout)


def kill_processes(procs: list[psutil.Process], sig: int = signal.SIGKILL, timeout: float = 5.0) -> list[int]:
    """Send ``sig`` to each of ``procs`` and wait up to ``timeout`` for them; the pids still
    alive. A pid taken by another process since it was listed is left alone (psutil checks
    the process's start time before it signals)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)
    # A zombie has ended: it runs and writes nothing more. psutil.wait_procs waits for
    # its pid to go, that is for its parent to reap it: a rank whose torchrun died is
    # reaped by init, seconds later in a container (1.9 s for 4 ranks here).
    deadline = time.monotonic() + timeout
    alive = procs
    while True:
        alive = [proc for proc in alive if not _ended(proc)]
        if not alive or time.monotonic() > deadline:
            return [proc.pid for proc in alive]
        time.sleep(0.01)


def _ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE or not proc.is_running()
    except psutil.Error:  # gone, or no longer ours to see
        return True
