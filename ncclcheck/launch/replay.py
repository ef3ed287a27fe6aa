"""A warm start for the replay that gives line evidence (record/lines.py).

The replay runs the dry run a second time up to the divergence. Started through
torchrun it pays again what the first run paid before the script's first line:
torchrun's interpreter and its torch import, then each rank's interpreter and torch
import (about 4 s of the 4-5 s a replay cost on 2 cores). This server
(``python -m ncclcheck.launch.replay``) is started at the first sign of a hang (the
first run's ranks quiet for a moment, or a run that failed), imports torch at the
lowest priority while the hang is confirmed and diagnosed, and then waits for
orders on its stdin, one run each: the run's environment and command (its stdin
closed: no run, or no more, it exits). For each it forks a run process, which forks
the ranks from the warm interpreter with the environment torchrun would give them on
one node and hosts the rendezvous store the ranks join as torchrun's agent's
(``TORCHELASTIC_USE_AGENT_STORE``), so the script and the recorder see the launch
they saw in the first run. The run process stands where torchrun's agent would: it
ends when every rank has ended, and as the agent ends the others when one fails; the
server says its pid and then its exit status on its stdout (``ForkedRun``), and
waits for the next order, its own interpreter untouched by the run. Every process
is in the server's session.

``--warm-start`` starts the first run the same way (``python -m ncclcheck.launch.replay
--first``), and its replay and forcing runs from the same server, each forked again
from the interpreter that imported torch once: the import is then at the normal
priority (nothing else runs yet, and an idle-priority import starved on a busy
machine would only delay the ranks) and takes torch._dynamo too where the script's
source names what imports it (``uses_torch_dynamo``: DistributedDataParallel's
constructor, 1.3 s of CPU per rank on this machine's 2 cores, once here instead;
``--first --with-dynamo``).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ncclcheck.launch.launchers import free_port
from ncclcheck.launch.virtual import VirtualLayout
from ncclcheck.record.launched import ENV_SLURM_PORT
from ncclcheck.settings import Launcher


class WarmReplay:
    """The parent's handle on the server: start it early, hand it runs, close it."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        # the first run's folder, where its rank 0 noted the torch modules it imported
        # beyond the server's: imported once by the server before the next fork
        self.imports_noted_in: Path | None = None
        self._said = threading.Condition()
        self._started: list[int] = []  # the run processes' pids, in order
        self._ended: dict[int, int] = {}  # run pid -> its exit status
        self._gone = False  # the server's stdout closed: it ended
        self._orders = 0  # runs ordered: the server forks them in order, one at a time
        self._reader: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        nproc: int,
        first_run: Path | None = None,
        for_the_first_run: bool = False,
        with_dynamo: bool = False,
    ) -> WarmReplay:
        """``first_run``: the first run's trace folder, where its rank 0 noted the torch
        modules it imported beyond the server's (record/preimport.py).
        ``for_the_first_run``: the server forks the first run itself (--warm-start);
        ``with_dynamo``: and imports torch._dynamo for its ranks (uses_torch_dynamo)."""
        flags = [FIRST_RUN_FLAG, *([DYNAMO_FLAG] if with_dynamo else [])] if for_the_first_run else []
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if nproc > 1:
            env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it for its ranks
        proc = subprocess.Popen(
            [sys.executable, "-m", "ncclcheck.launch.replay", *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        server = cls(proc)
        server.imports_noted_in = first_run
        return server

    def launch(self, command: list[str], env: dict[str, str], nproc: int, log_path: Path) -> ForkedRun:
        """Fork a run's ranks: ``command`` is the bootstrap's arguments, ``env`` the dry
        run's settings. Returns the run process, which ends when the ranks have."""
        order = {
            "command": command,
            "env": env,
            "nproc": nproc,
            "port": free_port(),
            "log": str(log_path),
            "cwd": os.getcwd(),
            "imports_noted_in": str(self.imports_noted_in) if self.imports_noted_in else None,
        }
        if env.get("NCCLCHECK_LAUNCHER") == Launcher.SLURM:
            order["env"] = {**env, ENV_SLURM_PORT: str(free_port())}
        assert self.proc.stdin is not None
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="ncclcheck-warm-server", daemon=True)
            self._reader.start()
        index = self._orders
        self._orders += 1
        try:
            self.proc.stdin.write(json.dumps(order).encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):  # a broken pipe; ValueError: its stdin closed already
            pass  # the server is gone: the run ends at once with nothing written
        return ForkedRun(self, index)

    def _read(self) -> None:
        """The server's lines: "run PID" as it forks a run, "ended PID STATUS" as one ends."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            with self._said:
                if len(words) == 2 and words[0] == b"run":
                    self._started.append(int(words[1]))
                elif len(words) == 3 and words[0] == b"ended":
                    self._ended[int(words[1])] = int(words[2])
                self._said.notify_all()
        with self._said:
            self._gone = True
            self._said.notify_all()

    def run_pid(self, index: int) -> int | None:
        """The pid of the ``index``-th run ordered, once the server forked it."""
        with self._said:
            return self._started[index] if index < len(self._started) else None

    def status_of(self, index: int) -> int | None:
        """The ``index``-th run's exit status once it ended (the server's, or 1, when the
        server ended without saying it)."""
        with self._said:
            pid = self._started[index] if index < len(self._started) else None
            if pid is not None and pid in self._ended:
                return self._ended[pid]
            if not self._gone:
                return None
        code = self.proc.wait()
        return code if code else 1  # the server ended and said nothing of the run: it failed

    def close(self) -> None:
        """Stop the server and every run and rank it forked (they share its session)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=30)


class ForkedRun:
    """One run a warm server forked, with what the launch code takes of a Popen: ``pid``,
    ``poll`` and ``wait``. The run process is the server's child, which says its status.
    Until the server has forked it (still importing torch), ``pid`` is the server's: the
    root of every process the run will have."""

    def __init__(self, server: WarmReplay, index: int) -> None:
        self.server, self.index = server, index
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        run = self.server.run_pid(self.index)
        return run if run is not None else self.server.proc.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.status_of(self.index)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"warm run {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode


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
                "TORCHELASTIC_RUN_ID": "ncclcheck-replay",
                "ROLE_NAME": "default",
            }
        )
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", env["OMP_NUM_THREADS"])
        ranks.append(env)
    return ranks


# -- the server ------------------------------------------------------------------------

FIRST_RUN_FLAG = "--first"
DYNAMO_FLAG = "--with-dynamo"
# what the server prints of a rank that failed, read back by launch/torchrun.py
RANK_EXIT_LINE = "ncclcheck warm start: rank {rank} exited with code {code}"


# What each rank imports before the script's first line, whatever the script: torch's
# distributed package and what DDP and the data loader need, and the recorder with what
# it patches.
_RANKS_IMPORT = ("torch.distributed", "torch.nn.parallel", "torch.utils.data", "ncclcheck.record.bootstrap")

# What imports torch._dynamo in a rank: DDP's and FSDP's constructors, torch.compile, and
# the frameworks that wrap a model in one of them. A script whose source names none of
# these is forked without it (a 2.9 s server becomes 1.6 s); a miss (a wrapper in an
# installed package of the user's) costs only time: each rank then imports it itself.
_IMPORTS_TORCH_DYNAMO = re.compile(
    r"DistributedDataParallel|\bDDP\b|fully_shard|FullyShardedDataParallel|\bFSDP\b|torch\.compile"
    r"|\b(?:accelerate|lightning|pytorch_lightning|transformers|deepspeed)\b"
)


def uses_torch_dynamo(files: list[str]) -> bool:
    """Whether the script or its local modules (``files``) name what imports torch._dynamo."""
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return True  # unread: assume it does, as before this guess
        if _IMPORTS_TORCH_DYNAMO.search(text):
            return True
    return False


def _import_what_ranks_import(idle: bool, with_dynamo: bool = False) -> None:
    """What each rank would import on its own, once, here. ``idle``: in a thread of the
    lowest priority (SCHED_IDLE), so that a server started while the first run still
    computes takes none of its CPU; the ranks are forked from the main thread, whose
    priority they inherit, once that thread is gone (_wait_until_single_threaded).
    Otherwise (--warm-start's first run: nothing else runs yet) on the main thread, with torch._dynamo
    where the script wants it (the first run has no note of what its ranks import yet)."""
    if not idle:
        for module in (*_RANKS_IMPORT, *(["torch._dynamo"] if with_dynamo else [])):
            importlib.import_module(module)
        return
    failed: list[BaseException] = []

    def work() -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # this thread only
        try:
            for module in _RANKS_IMPORT:
                importlib.import_module(module)
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=work, name="ncclcheck-replay-import")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _wait_until_single_threaded(timeout_s: float = 10.0) -> None:
    """Return once this process has no thread but the caller's, as a fork needs: a thread
    whose ``join`` has returned is still running its thread-local destructors (Python
    marks it ended before its OS thread exits), and MKL's takes the lock of its memory
    manager. A rank forked in that window inherits the lock held, by a thread it does not
    have, and its first matrix product spins on it forever (mm_account_ptr_by_tid under
    mkl_serv_allocate): 5 of about 150 warm dry runs, three side by side, before this
    wait, 0 of 210 after. Without /proc (not Linux) there is nothing to read; at the
    timeout (a thread some import started and keeps) the ranks are forked anyway."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if len(os.listdir("/proc/self/task")) <= 1:
                return
        except OSError:
            return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.001)


def serve(arguments: list[str]) -> int:
    forks_the_first_run = FIRST_RUN_FLAG in arguments
    _import_what_ranks_import(idle=not forks_the_first_run, with_dynamo=DYNAMO_FLAG in arguments)
    import torch.distributed  # noqa: F401

    from ncclcheck.record import preimport
    from ncclcheck.record.bootstrap import run_forked  # noqa: F401  (imported once: each run forks)

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        order: dict[str, Any] = json.loads(line)
        if order.get("imports_noted_in"):  # what the first run's rank 0 imported beyond this server
            preimport.import_noted(order["imports_noted_in"])
        # Fork once the import thread has ended: a child forked from a threaded process
        # inherits locks it cannot release.
        _wait_until_single_threaded()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _run(order)
            finally:
                os._exit(code)  # never back into the server's loop
        sys.stdout.write(f"run {pid}\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(f"ended {pid} {os.waitstatus_to_exitcode(status)}\n")
        sys.stdout.flush()
    return 0  # no order, or no more


def _run(order: dict[str, Any]) -> int:
    """The run process: fork the ranks, host their store, wait as torchrun's agent does."""
    import torch.distributed

    from ncclcheck.record.bootstrap import run_forked

    devnull = os.open(os.devnull, os.O_RDONLY)  # the server's orders are not the ranks' stdin
    os.dup2(devnull, 0)
    os.close(devnull)
    log = os.open(order["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.chdir(order["cwd"])
    os.environ.update(order["env"])
    # Fork before the store's threads exist. The ranks' clients retry until the store listens.
    children: dict[int, int] = {}
    for rank, env in enumerate(rank_environment(int(order["nproc"]), int(order["port"]))):
        pid = os.fork()
        if pid == 0:
            run_forked(order["command"], env)  # its output: the log set above
        children[pid] = rank
    store = torch.distributed.TCPStore(
        "localhost", int(order["port"]), is_master=True, wait_for_workers=False, use_libuv=True
    )
    worst = _wait_as_torchrun_does(children)
    del store
    sys.stdout.flush()
    return worst


def _wait_as_torchrun_does(children: dict[int, int]) -> int:
    """Wait for the ranks (pid -> rank) as torchrun's agent does: the first that fails
    ends the others, SIGTERM and then, after the agent's grace period, SIGKILL, so a
    rank blocked in a collective its failed partner never joins does not wait out its
    timeout (that would be a hang where torchrun shows a crash). Each failed rank's exit
    code is printed (RANK_EXIT_LINE); returns the first failure's, 0 if none."""
    worst = 0
    kill_at: float | None = None
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if kill_at is not None and time.monotonic() >= kill_at:
                _signal_all(children, signal.SIGKILL)
                kill_at = float("inf")
            time.sleep(0.05)
            continue
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(RANK_EXIT_LINE.format(rank=rank, code=code), flush=True)
            worst = worst or (code if code > 0 else 1)
            if kill_at is None:
                _signal_all(children, signal.SIGTERM)
                kill_at = time.monotonic() + _GRACE_S
    return worst


_GRACE_S = 30.0  # torchrun's agent: SIGTERM, then SIGKILL 30 s later (its workers' close timeout)


def _signal_all(children: dict[int, int], sig: signal.Signals) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:]))
