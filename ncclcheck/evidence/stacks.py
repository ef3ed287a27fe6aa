"""Live Python stacks of rank processes, with py-spy (shared by preflight's
watchdog and doctor). Dumps run in parallel, each bounded by a timeout."""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from ncclcheck.communicates import (
    COMM_LAYERS,
    DDP_BROADCASTS,
    DDP_NATIVE_WAITS,
    OP_ADVICE,
    OWN_WRAPPERS,
    WAITABLE_OPS,
    issued_at,
)
from ncclcheck.errors import InputError, StackPermissionError
from ncclcheck.evidence import device
from ncclcheck.frames import installed_origin, is_user_file
from ncclcheck.model import Frame
from ncclcheck.record.nccl_timing import EMULATION_FILE


@dataclass
class ThreadStack:
    thread_id: int
    name: str | None
    frames: list[Frame]  # innermost first, as py-spy prints them
    active: bool = False
    # per frame, aligned with ``frames``: local variable -> py-spy's repr (with --locals)
    locals: list[dict[str, str]] = field(default_factory=list)
    # per frame: the user's own code? Decided on the host that dumped the stack, whose
    # library paths (site-packages) may differ from those of the host that reads it.
    user: list[bool] = field(default_factory=list)
    # per frame, where the dump printed it (gdb's py-bt, a printed traceback): the frame's
    # source line, read when the file is not on this host
    code: list[str] = field(default_factory=list)

    def is_user(self, index: int) -> bool:
        return self.user[index] if index < len(self.user) else is_user_file(self.frames[index].file)

    def to_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "name": self.name,
            "active": self.active,
            "frames": [
                {"file": f.file, "line": f.line, "function": f.function, "user": self.is_user(i)}
                | ({"locals": self.locals[i]} if i < len(self.locals) else {})
                for i, f in enumerate(self.frames)
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadStack:
        frames = data.get("frames", [])
        return cls(
            int(data.get("thread_id", 0)),
            data.get("name"),
            [Frame(str(f["file"]), int(f["line"]), str(f["function"])) for f in frames],
            bool(data.get("active", False)),
            [dict(f.get("locals", {})) for f in frames] if all("locals" in f for f in frames) else [],
            [bool(f.get("user", False)) for f in frames],
        )


@dataclass
class ProcessStack:
    pid: int
    threads: list[ThreadStack] = field(default_factory=list)
    status: str = ""  # psutil status: running, sleeping, stopped, zombie, ...
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "status": self.status,
            "error": self.error,
            "threads": [t.to_dict() for t in self.threads],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessStack:
        return cls(
            int(data["pid"]),
            [ThreadStack.from_dict(t) for t in data.get("threads", [])],
            str(data.get("status", "")),
            data.get("error"),
        )

    @property
    def main(self) -> ThreadStack | None:
        """The thread that runs the rank's work: the main thread, unless it only runs a
        framework's event loop (Ray Train's worker runs the training function on a thread of
        its own) while exactly one other thread runs the user's code."""
        main = next(
            (t for t in self.threads if t.thread_id and t.name in (None, "MainThread") and t.frames),
            self.threads[0] if self.threads else None,
        )
        if main is None or _runs_user_code(main) or at_the_scripts_end(main):
            return main
        if any("torch/" in f.file.replace("\\", "/") for f in main.frames):
            return main
        working = [t for t in self.threads if t is not main and _runs_user_code(t)]
        return working[0] if len(working) == 1 else main

    @property
    def in_collective(self) -> bool:
        return blocking(self).waits_for_peers


@dataclass(frozen=True)
class Blocking:
    """Where a rank's main thread is: what it waits in, and whether that is a wait for
    the other ranks (a collective, DDP's gradient buckets or broadcasts, a wait() on an
    async collective, or torch.distributed's own set-up and store)."""

    what: str
    waits_for_peers: bool
    # the device synchronisation point it waits at (".item()"), when NCCL's asynchronous
    # collectives let it run past the one it waits for (evidence/device.py)
    sync: str | None = None
    # the thread that waits, when not the main thread (an autograd hook's, a checkpoint's)
    thread: str | None = None
    native: str | None = None  # the native frame that confirms a device wait (--native)
    # the collectives other threads of the rank wait in at the same time ("all_gather_object
    # (torch.distributed.checkpoint) on AsyncCheckpointExecutor_0"): two threads that issue
    # collectives at once need not issue them in the same order on every rank
    concurrent: tuple[str, ...] = ()


def _issued_by_library(callers: list[Frame]) -> tuple[str, str] | None:
    """(what issued it, what to do) when library code the user called issued the
    collective (SyncBatchNorm, torch.distributed.checkpoint); None when the user's did."""
    for frame in callers:  # outward, past torch.distributed's own wrappers
        issued = issued_at(frame.file, frame.function)
        if issued is not None:  # torch.distributed.checkpoint's are issuers themselves
            return issued
        if not any(layer in frame.file.replace("\\", "/") for layer in COMM_LAYERS):
            return None
    return None


def _collective_frame(main: ThreadStack) -> int | None:
    """The index of the collective the main thread waits in (innermost first): the API
    its caller called, the outermost collective of the run of torch.distributed frames
    (all_gather_into_tensor, not the all_gather_single it calls; all_gather_object,
    not its all_gather)."""
    for index, frame in enumerate(main.frames):
        if "torch/distributed/" in frame.file and frame.function in WAITABLE_OPS:
            outer = index
            for later in range(index + 1, len(main.frames)):
                if "torch/distributed/" not in main.frames[later].file:
                    break
                if main.frames[later].function in WAITABLE_OPS:
                    outer = later
            return outer
    return None


def issuer_advice(stack: ProcessStack) -> str | None:
    """What to do about the collective a rank waits in, when library code issued it."""
    main = stack.main
    index = _collective_frame(main) if main is not None else None
    if main is None or index is None:
        return None
    issued = _issued_by_library(main.frames[index + 1 :])
    if issued:
        return issued[1] or None
    return OP_ADVICE.get(main.frames[index].function)


def _distributed_call(main: ThreadStack) -> Blocking | None:
    """A wait inside torch.distributed that is no collective (init_process_group, a
    store's get, a rendezvous), or inside ncclcheck's own wrapper of one: the run of
    library frames below the user's innermost frame holds it. (torchelastic's @record
    wraps the whole script from outside: an outer frame does not count.)"""
    outermost: int | None = None
    for index, frame in enumerate(main.frames):  # innermost first, up to the user's code
        if main.is_user(index):
            break
        path = frame.file.replace("\\", "/")
        if any(path.endswith(wrapper) and frame.function in names for wrapper, names in OWN_WRAPPERS.items()):
            return Blocking("a collective (ncclcheck's wrapper around it)", True)
        if "torch/distributed/" in path:
            outermost = index
    if outermost is None:
        return None
    # FSDP's unshard waiting on its all-gather's event (its rate limiter): a device sync
    sync = device.sync_in_frames(main.frames[:outermost])
    return Blocking(f"{main.frames[outermost].function} (torch.distributed)", True, sync=sync)


def _in_collective(thread: ThreadStack) -> Blocking | None:
    """The collective a thread waits in (or DDP's broadcast), as its frames show it."""
    if thread.frames:
        innermost = thread.frames[0]
        for (fragment, function), what in DDP_NATIVE_WAITS.items():
            if (
                innermost.file.replace("\\", "/").endswith(fragment)
                and innermost.function.rsplit(".", 1)[-1] == function
            ):
                return Blocking(what, True)
    collective = _collective_frame(thread)
    for index, frame in enumerate(thread.frames):  # innermost first
        if index == collective:
            issued = _issued_by_library(thread.frames[index + 1 :])
            # a library's collective code that waits for the device inside it (FSDP's rate
            # limiter, an all-gather's event synchronize): the host thread waits there
            sync = device.sync_in_frames(thread.frames[:index]) if index else None
            return Blocking(f"{frame.function} ({issued[0]})" if issued else frame.function, True, sync=sync)
        path = frame.file.replace("\\", "/")
        for (fragment, function), what in DDP_BROADCASTS.items():
            # py-spy qualifies methods with their class
            if path.endswith(fragment) and frame.function.rsplit(".", 1)[-1] == function:
                return Blocking(what, True)
    return None


def _on_other_threads(stack: ProcessStack, main: ThreadStack) -> list[tuple[str, Blocking]]:
    """The collectives other threads of the rank wait in, with each thread's name: an
    autograd hook's (ZeRO-3's parameter gather, FSDP's unshard, on the autograd engine's
    threads), an async checkpoint's. Every thread counts: on NCCL the main thread may be
    anywhere."""
    found = []
    for thread in stack.threads:
        if thread is main or not thread.frames:
            continue
        waits = _in_collective(thread)
        if waits is not None:
            found.append((thread.name or f"thread {thread.thread_id}", waits))
    return found


def _in_collectives(stack: ProcessStack, main: ThreadStack) -> Blocking | None:
    """The collective the main thread waits in, else one another thread does; with the
    collectives any further threads wait in at the same time."""
    here = _in_collective(main)
    elsewhere = _on_other_threads(stack, main)
    if here is None and elsewhere:
        name, first = elsewhere.pop(0)
        here = Blocking(f"{first.what} (on {name})", True, thread=name)
    if here is None or not elsewhere:
        return here
    return replace(here, concurrent=tuple(f"{waits.what} on {name}" for name, waits in elsewhere))


def _device_sync(main: ThreadStack) -> Blocking | None:
    """A wait for the device: the innermost Python frame's line holds a synchronisation
    point, or native frames (py-spy --native) show one."""
    native = device.native_wait([f.function for f in main.frames])
    python = [i for i, f in enumerate(main.frames) if f.file.endswith(".py")]
    sync = device.sync_in_frames(main.frames)
    if sync is None and python:
        sync = device.sync_point(main.frames[python[0]].file, main.frames[python[0]].line)
    if sync is None and python and python[0] < len(main.code) and main.code[python[0]]:
        sync = device.sync_point_in(main.code[python[0]])  # the dump's own copy of the line
    if sync is not None:
        return Blocking(f"a device sync point ({sync})", True, sync=sync, native=native)
    if native is not None:
        return Blocking(f"a device sync point ({native}, in native frames)", True, native=native)
    return None


STORE_GET = "a c10d store's get"
SCRIPTS_END = (
    "the script's end (threading._shutdown: the main thread returned or raised, and the process "
    "waits for a thread that is not a daemon)"
)


def at_the_scripts_end(main: ThreadStack) -> bool:
    """The main thread past the script's last line: in the interpreter's wait for the
    program's other threads (``threading._shutdown``), with no frame of the script."""
    return (
        bool(main.frames)
        and any(
            f.function.rsplit(".", 1)[-1] == "_shutdown" and f.file.endswith("threading.py")
            for f in main.frames
        )
        and all(f.file.endswith("threading.py") or f.line == 0 for f in main.frames)
    )


_STORE_WAIT = re.compile(r"c10d::(?:TCPStore|PrefixStore|Store|FileStore)::(?:doGet|get|wait|doWait)\b")

_THREAD_IDLE = ("wait", "_wait_for_tstate_lock", "select", "poll", "sleep", "get", "accept", "recv")


def _bare(function: str) -> str:
    """A function's own name: ``wait`` of ``Condition.wait`` (py-spy 0.4 prints the class)."""
    return function.rsplit(".", 1)[-1]


def _in_backward(stack: ProcessStack, main: ThreadStack) -> Blocking:
    """The main thread idles in autograd's backward while the engine's threads run it. A
    Python hook running there (no collective frame of its own) says what the rank does: a
    library's gradient hook that issues collectives (ZeRO's reduce, FSDP's), stopped in a
    native call after them, or other work. With no such thread, the work is native: DDP's
    reducer, whose gradient all-reduce has no Python frame."""
    for thread in stack.threads:
        # py-spy 0.4 names methods with their class ("Condition.wait", "Thread._bootstrap")
        if thread is main or not thread.frames or _bare(thread.frames[0].function) in _THREAD_IDLE:
            continue
        if _bare(thread.frames[-1].function) in ("_bootstrap", "_bootstrap_inner", "run"):
            continue  # a Python thread of the program's own (a logger, a monitor), not the engine's
        where = f"{_short(thread.frames[0].file)}:{thread.frames[0].line} in {thread.frames[0].function}"
        name = thread.name or "the autograd engine's thread"
        issuer = next((said for f in thread.frames if (said := issued_at(f.file, f.function))), None)
        if issuer is not None:
            # an active thread in a native call of the library's, after the collectives it
            # enqueued (ZeRO-3 copies a bucket's reduced gradients out): on a GPU it spins
            # waiting for the device, behind a collective that does not complete
            after = (
                "active in a native call with no collective frame: a device sync point behind "
                "the collectives it enqueued"
                if thread.active
                else "in a native call with no collective frame"
            )
            return Blocking(f"{issuer[0]} (on {name}, at {where}, {after})", True, thread=name)
        return Blocking(f"a backward hook (on {name}, at {where})", False, thread=name)
    return Blocking("all_reduce (DDP gradient buckets, in backward)", True)


def _short(path: str) -> str:
    """A library file as py-spy names it: from its package on (``deepspeed/runtime/...``)."""
    marker = "site-packages/"
    return path.split(marker, 1)[1] if marker in path else path


def _source_not_here(path: str) -> bool:
    """Whether a dumped frame's source cannot be read on this host: not a file here, and not
    below a package installed here (py-spy prints ``torch/nn/modules/linear.py``)."""
    if os.path.isfile(path):
        return False
    return os.path.isabs(path) or installed_origin(path) is None


def _runs_user_code(thread: ThreadStack) -> bool:
    return any(thread.is_user(i) for i in range(len(thread.frames)))


def blocking(stack: ProcessStack) -> Blocking:
    """What the rank waits in. The one classification of a stack: preflight's rank
    states and doctor's stack classes both read it."""
    main = stack.main
    if main is None:
        return Blocking("stopped (SIGSTOP)" if stack.status == "stopped" else "unknown", False)
    found = _in_collectives(stack, main)
    if found is not None:
        return found
    if at_the_scripts_end(main):
        return Blocking(SCRIPTS_END, False)
    if any(frame.function == "_engine_run_backward" for frame in main.frames):
        return _in_backward(stack, main)
    for frame in main.frames:
        if "torch/utils/data/" in frame.file:
            return Blocking("DataLoader", False)
    distributed = _distributed_call(main)
    if distributed is not None:
        return distributed
    store = next((f.function for f in main.frames if _STORE_WAIT.search(f.function)), None)
    if store is not None:
        # gdb's native frames of a get or wait on the c10d store: a key another rank sets
        # (rendezvous, a store-based barrier, a communicator's id), not a collective
        return Blocking(f"{STORE_GET} ({store.split('(')[0]}, native)", True)
    if main.frames and main.frames[0].function in ("sleep", "wait", "join", "_wait_for_tstate_lock"):
        return Blocking(main.frames[0].function, False)
    if (
        main.frames
        and main.is_user(0)
        and ".wait(" in linecache.getline(main.frames[0].file, main.frames[0].line)
    ):
        # `work.wait()` on an async_op=True collective: py-spy shows no frame for the
        # C++ wait, only the user's line
        return Blocking("wait() on an async collective", True)
    synchronising = _device_sync(main)
    if synchronising is not None:
        return synchronising
    if stack.status == "stopped":
        return Blocking("stopped (SIGSTOP)", False)
    if main.active and main.frames and _source_not_here(main.frames[0].file):
        # on the CPU at a line (the user's, or a library's not installed here) whose source is
        # not on this host: a native call
        # there is all py-spy shows, and on a GPU the likeliest one to stay on the CPU is a
        # host thread spinning at a device sync point (.item(), .cpu(): cudaStreamSynchronize
        # spins) behind a collective that does not complete
        return Blocking(
            "compute, I/O or a device sync point (the line's source is not here to tell: a "
            ".item() or .cpu() on it would wait for the device; py-spy --native shows which)",
            False,
        )
    return Blocking("compute or I/O", False)


def threads_from_py_spy_json(
    data: Any, with_locals: bool = True, is_user: Callable[[str], bool] = is_user_file
) -> list[ThreadStack]:
    """``py-spy dump --json``'s list of threads; ``is_user`` tells the user's frames (a
    dump taken on another machine needs evidence/dumps.is_user_path)."""
    threads = []
    for thread in data:
        # the NCCL timing emulation's wait: a CUDA rank shows no frame for it
        raw = [
            f
            for f in thread.get("frames", [])
            if not str(f.get("filename", "")).replace("\\", "/").endswith(EMULATION_FILE)
        ]
        frames = [
            Frame(str(f.get("filename", "?")), int(f.get("line", 0)), str(f.get("name", "?"))) for f in raw
        ]
        threads.append(
            ThreadStack(
                int(thread.get("thread_id", 0)),
                thread.get("thread_name"),
                frames,
                bool(thread.get("active", False)),
                [{str(v.get("name")): str(v.get("repr")) for v in (f.get("locals") or [])} for f in raw]
                if with_locals
                else [],
                [is_user(f.file) for f in frames],
            )
        )
    return threads


ENV_PY_SPY = "NCCLCHECK_PY_SPY"


def find_py_spy() -> str:
    """$NCCLCHECK_PY_SPY when set, else py-spy next to this interpreter (a venv's bin),
    else on PATH."""
    chosen = os.environ.get(ENV_PY_SPY)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise InputError(
                f"py-spy not found at {chosen} (from ${ENV_PY_SPY})",
                hint=f"Point {ENV_PY_SPY} at a py-spy executable, or unset it to use the one on PATH.",
            )
        return chosen
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("py-spy")
    if found is None:
        raise InputError(
            "py-spy is not installed or not on PATH",
            hint="pip install py-spy (ncclcheck depends on it), or put it on PATH.",
        )
    return found


def dump_stack(
    pid: int,
    timeout: float = 10.0,
    native: bool = False,
    nonblocking: bool = False,
    py_spy: str | None = None,
    with_locals: bool = False,
) -> ProcessStack:
    argv = [py_spy or find_py_spy(), "dump", "--pid", str(pid), "--json", "--full-filenames"]
    if with_locals:
        argv.append("--locals")
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    result = ProcessStack(pid)
    try:
        result.status = psutil.Process(pid).status()
    except psutil.Error:
        result.status = "gone"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        result.error = f"py-spy did not answer within {timeout:.0f} s"
        return result
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        text = message[0] if message else f"py-spy exited with {done.returncode}"
        if "Permission denied" in done.stderr or "Operation not permitted" in done.stderr:
            raise StackPermissionError(f"no permission to read the stack of pid {pid}: {text}")
        result.error = text
        return result
    try:
        data = json.loads(done.stdout)
    except ValueError:
        result.error = "py-spy printed something that is not JSON"
        return result
    result.threads.extend(threads_from_py_spy_json(data, with_locals))
    return result


def dump_stacks(
    pids: list[int],
    timeout: float = 10.0,
    native: bool = False,
    nonblocking: bool = False,
    with_locals: bool = False,
) -> dict[int, ProcessStack]:
    """Stacks of every pid, dumped in parallel."""
    if not pids:
        return {}
    py_spy = find_py_spy()
    with ThreadPoolExecutor(max_workers=min(32, len(pids))) as pool:
        futures = {
            pid: pool.submit(dump_stack, pid, timeout, native, nonblocking, py_spy, with_locals)
            for pid in pids
        }
        return {pid: future.result() for pid, future in futures.items()}
