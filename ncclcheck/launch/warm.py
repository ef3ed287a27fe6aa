"""A warm start for the runs of one node: ranks forked from an interpreter that imported
torch once, instead of torchrun's interpreter and each rank's own.

Started through torchrun, a run pays before the script's first line torchrun's
interpreter and its torch import, then each rank's interpreter and torch import (and
``torch._dynamo``, which DDP's constructor imports): about 10 of the 12 CPU-seconds of a
2-rank dry run on 2 cores. This server (``python -m ncclcheck.launch.warm``) imports
torch once, then waits for one order on its stdin: the run's environment and command,
or nothing (no run was needed: it exits). It forks the ranks with the environment
torchrun gives them on one node (``--standalone``), hosts the rendezvous store they join
as torchrun's agent's (``TORCHELASTIC_USE_AGENT_STORE``), and keeps torchrun's policy
when a rank fails: the others get SIGTERM, then SIGKILL 30 s later, and the log ends
with torchrun's failure summary (each failed rank's exit code, the first observed
failure), read by the same parser. It ends when every rank has ended; the ranks are its
children, in its session.

preflight starts one for its first run on one node under torchrun (``--no-warm-start``
goes through torchrun itself), one for each forcing run, and one at the first sign of a
hang for the replay that gives line evidence; that last one imports at the lowest
priority, so that it takes no CPU from the run still being judged.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ncclcheck.launch.launchers import free_port
from ncclcheck.launch.virtual import VirtualLayout
from ncclcheck.record.launched import ENV_SLURM_PORT
from ncclcheck.settings import Launcher

# torchrun's agent: SIGTERM to the ranks left after one failed, SIGKILL after this long
# (torch.distributed.elastic.multiprocessing.api SubprocessContext._close's timeout)
STOP_GRACE_S = 30.0


class WarmStart:
    """The parent's handle on the server: start it early, hand it a run or close it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.used = False

    @classmethod
    def start(
        cls,
        nproc: int,
        noted_in: Path | None = None,
        *,
        idle: bool = True,
        modules: Iterable[str] = (),
    ) -> WarmStart:
        """``noted_in``: an earlier run's trace folder, where its rank 0 noted the torch
        modules it imported beyond its server's (record/preimport.py); ``modules``: more to
        import before forking; ``idle``: import at the lowest priority (a server started
        while a run still computes), else at once."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for its ranks
        argv = [sys.executable, "-m", "ncclcheck.launch.warm"]
        if noted_in is not None:
            argv += ["--noted-in", str(noted_in)]
        for module in modules:
            argv += ["--import", module]
        if not idle:
            argv.append("--now")
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return cls(proc)

    def launch(
        self, command: list[str], env: dict[str, str], nproc: int, log_path: Path
    ) -> subprocess.Popen[bytes]:
        """Fork the run's ranks: ``command`` is the bootstrap's arguments, ``env`` the dry
        run's settings. Returns the server, which ends when the ranks have."""
        order = {
            "command": command,
            "env": env,
            "nproc": nproc,
            "port": free_port(),
            "log": str(log_path),
            "cwd": os.getcwd(),
            "host": socket.gethostname(),
        }
        if env.get("NCCLCHECK_LAUNCHER") == Launcher.SLURM:
            order["env"] = {**env, ENV_SLURM_PORT: str(free_port())}
        assert self.proc.stdin is not None
        self.used = True
        try:
            self.proc.stdin.write(json.dumps(order).encode() + b"\n")
            self.proc.stdin.close()
        except (OSError, ValueError):  # a broken pipe; ValueError: its stdin closed already
            pass  # the server is gone: the watcher sees it end with nothing written
        return self.proc

    def close(self) -> None:
        """Stop the server and every rank it forked (they share its session)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def rank_environment(nproc: int, port: int) -> list[dict[str, str]]:
    """What torchrun (--standalone, one node) gives each of ``nproc`` ranks."""
    layout = VirtualLayout(world_size=nproc, per_node=nproc)
    ranks = []
    for rank in range(nproc):
        env = layout.environment(rank)
        env.update(
            {
                "MASTER_ADDR": "localhost",  # torchrun --standalone's
                "MASTER_PORT": str(port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_RUN_ID": "ncclcheck-warm",
                "ROLE_NAME": "default",
            }
        )
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", env["OMP_NUM_THREADS"])
        ranks.append(env)
    return ranks


def failure_summary(exits: dict[int, int], first: int, host: str) -> str:
    """torchrun's summary of a failed run, in its layout (launch/torchrun.py
    parse_torchrun_failures reads it): the other failures, then the first observed."""
    when = time.strftime("%Y-%m-%d_%H:%M:%S")

    def entry(index: int, rank: int) -> str:
        return (
            f"[{index}]:\n  time      : {when}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {rank})\n  exitcode  : {exits[rank]}\n"
        )

    others = [rank for rank in sorted(exits) if rank != first]
    lines = ["ncclcheck warm start: the ranks failed (torchrun's summary)", "Failures:"]
    lines += [entry(i + 1, rank) for i, rank in enumerate(others)] or ["  <NO_OTHER_FAILURES>"]
    lines += ["Root Cause (first observed failure):", entry(0, first)]
    return "\n".join(lines)


# -- the server ------------------------------------------------------------------------


def _import(modules: list[str], idle: bool) -> None:
    """What each rank would import on its own, once, here. ``idle``: in a thread of the
    lowest priority (SCHED_IDLE), so that a server started while a run still computes
    takes none of its CPU; the thread has ended before any rank is forked, and the ranks
    are forked from the main thread, whose priority they inherit."""
    failed: list[BaseException] = []

    def work() -> None:
        if idle:
            with contextlib.suppress(OSError, AttributeError):
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        try:
            import torch.distributed
            import torch.nn.parallel
            import torch.utils.data  # noqa: F401

            import ncclcheck.record.bootstrap  # noqa: F401  (the recorder and what it patches)
        except BaseException as exc:
            failed.append(exc)
            return
        import importlib

        for module in modules:
            with contextlib.suppress(Exception):  # nothing depends on it but the cost
                importlib.import_module(module)

    thread = threading.Thread(target=work, name="ncclcheck-warm-import")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _arguments(argv: list[str]) -> tuple[str | None, list[str], bool]:
    noted_in, modules, now = None, [], False
    args = iter(argv)
    for arg in args:
        if arg == "--noted-in":
            noted_in = next(args, None)
        elif arg == "--import":
            module = next(args, None)
            if module:
                modules.append(module)
        elif arg == "--now":
            now = True
    return noted_in, modules, now


def serve(argv: list[str]) -> int:
    noted_in, modules, now = _arguments(argv)
    _import(modules, idle=not now)
    import torch.distributed

    from ncclcheck.record import preimport
    from ncclcheck.record.bootstrap import run_forked

    line = sys.stdin.readline()
    if not line.strip():
        return 0  # no run was needed
    if noted_in is not None:  # what an earlier run's rank 0 imported beyond its server: once, here
        preimport.import_noted(noted_in)
    order: dict[str, Any] = json.loads(line)
    log = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(order["cwd"])
    os.environ.update(order["env"])
    # What the server built stays put: a child's collections would otherwise walk (and so
    # copy, page by page) every object the imports made.
    gc.freeze()
    # Fork before the store's threads exist: a child forked from a threaded process
    # inherits locks it cannot release. The ranks' clients retry until it listens.
    children: dict[int, int] = {}
    for rank, env in enumerate(rank_environment(int(order["nproc"]), int(order["port"]))):
        pid = os.fork()
        if pid == 0:
            run_forked(order["command"], env)  # its output: the log set above
        children[pid] = rank
    store = torch.distributed.TCPStore(
        "localhost", int(order["port"]), is_master=True, wait_for_workers=False, use_libuv=True
    )
    exits = _reap(children)
    del store
    if not exits:
        return 0
    first = next(iter(exits))  # reaped first: the first observed failure
    print(failure_summary(exits, first, str(order.get("host", ""))), flush=True)
    return 1  # torchrun's status for a failed run (ChildFailedError)


def _reap(children: dict[int, int]) -> dict[int, int]:
    """Wait for every rank; after the first failure, stop the others as torchrun's agent
    does. The failed ranks' exit codes (a signal as its negative), in the order seen."""
    exits: dict[int, int] = {}
    stop_by: float | None = None
    killed = False
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG if stop_by is not None else 0)
        if pid == 0:  # stopping the others: wait for them up to the grace, then kill
            if not killed and time.monotonic() > stop_by:  # type: ignore[operator]
                _signal(children, signal.SIGKILL)
                killed = True
            time.sleep(0.05)
            continue
        rank = children.pop(pid, None)
        if rank is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            exits[rank] = code
            if stop_by is None:
                _signal(children, signal.SIGTERM)
                stop_by = time.monotonic() + STOP_GRACE_S
    return exits


def _signal(children: dict[int, int], sig: signal.Signals) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
