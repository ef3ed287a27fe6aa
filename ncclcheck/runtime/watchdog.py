"""A watchdog that stays on in production: a rank that waits too long in a
collective writes what it waits for, and where, long before the backend's timeout.

``watchdog(timeout=120)`` wraps torch.distributed's collectives and p2p calls
with a few hundred nanoseconds of bookkeeping (a dict entry per call: the op,
the group, the caller's frame, the time) and starts one daemon thread that looks
at those entries every ``interval`` seconds. When a call has not returned after
``timeout`` seconds, the rank writes a report to stderr and to
``<directory>/rank-<R>.txt``: the op, group, shapes, the user's call site, the
phase (the enclosing ``aligned_phase``, else train or eval by grad mode), how
long it has waited and the thread's whole stack. Every rank whose watchdog
fires also leaves a line in the job's rendezvous store, so each report ends
with what the other ranks are doing: the ones waiting elsewhere (another op, an
earlier call) and the ones not waiting in a collective at all (still computing,
finished, or dead). When the call finally returns, a last line says after how
long.

On CUDA, NCCL collectives return to Python as soon as they are queued: the hang
shows later, at the first host synchronisation (``loss.item()``). For tensors
on a GPU the watchdog therefore issues synchronous calls as ``async_op=True``
followed by ``work.wait()`` (what torch does for a synchronous call anyway) and
keeps the work: the report then names the collective that has not *completed*
and says where the host thread is now.

Not seen: collectives that C++ issues without Python (DDP's gradient buckets,
FSDP's internal streams); their hang shows as the first Python collective or
synchronisation that waits behind them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any

from ncclcheck.communicates import COLLECTIVES, P2P
from ncclcheck.frames import is_user_code, shown_path

ENV_DIRECTORY = "NCCLCHECK_WATCHDOG_DIR"
DEFAULT_DIRECTORY = "ncclcheck-watchdog"
ABORT_EXIT_CODE = 124  # a timeout's status, as coreutils' timeout uses it
_STORE_PREFIX = "ncclcheck/watchdog/"
_SITE_FRAMES = 8  # frames of an asynchronous call's stack kept to name its site later

# The calls a training script or its libraries make through the Python API: the
# recorder's list, less DDP's private broadcast (construction time, not a loop's).
WATCHED = tuple(op for op in (*COLLECTIVES, *P2P) if not op.startswith("_"))

# The phases aligned_phase has open on this process, innermost last.
_open_phases: list[str] = []


class _Call:
    """One collective in flight: what the report needs, captured cheaply at call time."""

    __slots__ = ("args", "frame", "group", "op", "phase", "seq", "site", "sites", "start", "thread", "work")

    def __init__(
        self, op: str, group: Any, args: tuple[Any, ...], thread: int, phase: str, seq: int, frame: FrameType
    ) -> None:
        self.op = op
        self.group = group
        self.args = args
        self.thread = thread
        self.start = time.monotonic()
        self.phase = phase
        self.seq = seq
        self.frame: FrameType | None = frame  # the caller, while the call blocks in it
        self.sites: list[tuple[CodeType, int]] = []  # (code, offset) outwards, for async calls
        self.work: Any = None
        self.site = "?"  # the user's call site, as the report named it


class Watchdog:
    """Installed by ``watchdog()``; ``stop()`` (or leaving the ``with`` block) removes it."""

    def __init__(
        self,
        timeout: float,
        directory: str | os.PathLike[str] | None,
        interval: float | None,
        track_completion: bool | None,
        abort: bool,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"watchdog timeout must be positive, got {timeout}")
        self.timeout = float(timeout)
        self.interval = interval if interval is not None else min(max(timeout / 4, 0.05), 5.0)
        self.directory = Path(directory or os.environ.get(ENV_DIRECTORY) or DEFAULT_DIRECTORY)
        self.track_completion = track_completion
        self.abort = abort
        self.reports: list[str] = []  # every report this process wrote, for tests and callers
        self._waiting: dict[int, _Call] = {}  # thread id -> the call it blocks in
        # Asynchronous works not yet seen completed. A deque: the training thread
        # appends while the watching thread pops, both atomic under the GIL.
        self._pending: deque[_Call] = deque()
        self._report_lock = threading.Lock()  # a report and its "returned" line in order
        self._reported: dict[int, _Call] = {}  # id(call) -> call, reported and not yet returned
        self._seq: dict[int, int] = {}  # id(group) -> calls made on it
        self._originals: list[tuple[Any, str, Any, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- install ---------------------------------------------------------------------

    def start(self) -> Watchdog:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for op in WATCHED:
            original = getattr(dist, op, None) or getattr(c10d, op, None)
            if original is None:
                continue
            wrapped = self._wrap(op, original)
            for module in (dist, c10d):
                current = getattr(module, op, None)
                if current is original:
                    self._originals.append((module, op, original, wrapped))
                    setattr(module, op, wrapped)
        self._thread = threading.Thread(target=self._watch, name="ncclcheck-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(self.interval * 2, 1.0))
        for module, op, original, wrapped in reversed(self._originals):
            if getattr(module, op, None) is wrapped:  # leave a later patch in place
                setattr(module, op, original)
        self._originals.clear()

    def __enter__(self) -> Watchdog:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the hot path ------------------------------------------------------------------

    def _wrap(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        group_index = params.index("group") if "group" in params else None
        async_index = params.index("async_op") if "async_op" in params else None
        waiting = self._waiting
        pending = self._pending
        seqs = self._seq
        get_ident = threading.get_ident
        get_frame = sys._getframe
        track = self.track_completion
        grad_enabled = _grad_mode()

        reported = self._reported
        returned = self._returned

        def tracked(call: _Call, convert: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            """An asynchronous call, or one issued so (convert): keep its work for the
            watching thread, which sees it complete (or not) on the device."""
            call.sites = _sites(call.frame)
            if convert:
                kwargs["async_op"] = True
            result = fn(*args, **kwargs)
            if result is not None and hasattr(result, "is_completed"):
                call.work = result
                pending.append(call)
            if not convert:
                return result
            if result is not None:
                result.wait()  # what torch itself does for a synchronous call
            return None

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            thread = get_ident()
            if thread in waiting:  # all_gather_object's inner all_gather: one call, not two
                return fn(*args, **kwargs)
            group = kwargs.get("group") if kwargs else None
            if group is None and group_index is not None and len(args) > group_index:
                group = args[group_index]
            gid = id(group) if group is not None else 0
            seq = seqs[gid] = seqs.get(gid, 0) + 1
            phase = _open_phases[-1] if _open_phases else "train" if grad_enabled() else "eval"
            call = _Call(op, group, args, thread, phase, seq, get_frame(1))
            waiting[thread] = call
            try:
                if async_index is not None:
                    if kwargs and "async_op" in kwargs:
                        is_async = bool(kwargs["async_op"])
                    else:
                        is_async = len(args) > async_index and bool(args[async_index])
                    if is_async:
                        return tracked(call, False, args, kwargs)
                    if async_index >= len(args) and (
                        track or (track is None and _on_gpu(args or tuple(kwargs.values())))
                    ):
                        return tracked(call, True, args, kwargs)
                return fn(*args, **kwargs)
            finally:
                del waiting[thread]
                call.frame = None
                if reported and call.work is None and id(call) in reported:
                    returned(call)

        watched.__ncclcheck_watchdog__ = fn  # type: ignore[attr-defined]
        return watched

    # -- the watching thread -------------------------------------------------------------

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._look()
            except Exception as error:  # never take the training process down
                sys.stderr.write(f"ncclcheck watchdog: {type(error).__name__}: {error}\n")

    def _look(self) -> None:
        now = time.monotonic()
        still: list[_Call] = []
        for _ in range(len(self._pending)):
            call = self._pending.popleft()
            if not call.work.is_completed():
                still.append(call)
            elif id(call) in self._reported:
                self._returned(call)
        self._pending.extend(still)
        candidates = [*self._waiting.values(), *still]
        for call in sorted(candidates, key=lambda c: c.start):
            if id(call) in self._reported or now - call.start < self.timeout:
                continue
            if call.work is None and self._waiting.get(call.thread) is not call:
                continue  # it returned while we looked
            self._reported[id(call)] = call
            self._report(call, now - call.start)

    def _report(self, call: _Call, waited: float) -> None:
        with self._report_lock:
            self._report_locked(call, waited)

    def _report_locked(self, call: _Call, waited: float) -> None:
        rank = _rank()
        site, called_from = self._site(call)
        call.site = site
        group_name, group_ranks = _describe_group(call.group)
        mine = {
            "rank": rank,
            "op": call.op,
            "group": group_name,
            "seq": call.seq,
            "site": site,
            "phase": call.phase,
            "shapes": _shapes(call.args),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        store = _store()
        if store is not None:
            _publish(store, rank, mine)
        lines = [
            f"ncclcheck watchdog: rank {rank} has waited {waited:.1f} s in {call.op} "
            f"(call #{call.seq} on group {group_name}"
            + (f", ranks {_ranks(group_ranks)}" if group_ranks else "")
            + ")",
            f"  site:   {site}" + (f", called from {called_from}" if called_from else ""),
            f"  phase:  {call.phase}",
            f"  shapes: {_shapes(call.args)}",
            f"  host {socket.gethostname()}, pid {os.getpid()}, at {time.strftime('%Y-%m-%d %H:%M:%S')}",
        ]
        if call.work is not None:
            lines.append("  the collective was queued and has not completed; the host thread is now at:")
        else:
            lines.append("  stack of the waiting thread:")
        frame = sys._current_frames().get(call.thread)
        if frame is not None:
            stack = traceback.extract_stack(frame)
            # From the watchdog's own wrapper inwards it is torch's wait: not worth a line each.
            ours = next((i for i, f in enumerate(stack) if f.filename == __file__), len(stack))
            lines += [
                "    " + line for line in "".join(traceback.format_list(stack[:ours])).rstrip().splitlines()
            ]
            if ours < len(stack):
                inner = stack[-1]
                where = f"{os.path.basename(inner.filename)}:{inner.lineno}"
                lines.append(f"    (then torch.distributed: {inner.name} waits at {where})")
        # This rank's own part first: if another rank aborts, the launcher may stop
        # this one before the summary below.
        self._emit(rank, "\n".join(lines) + "\n")
        grace = min(self.interval * 2 + 0.5, self.timeout / 2, 5.0)
        summary: list[str] = []
        if store is not None:
            # The other ranks' watchdogs fire within an interval of ours when they wait
            # too: give them that long to say where, then describe everyone.
            time.sleep(grace)
            summary = _others(store, rank, mine)
        summary.append(
            "  next: `ncclcheck doctor --pid <torchrun pid>` merges every rank's stack; "
            "`ncclcheck preflight` replays the loop and names the first divergence"
        )
        self._emit(rank, "\n".join(summary) + "\n")
        if self.abort:
            time.sleep(grace)  # the other ranks' reports, before the launcher stops them
            self._emit(rank, f"ncclcheck watchdog: rank {rank} exits with {ABORT_EXIT_CODE} (abort=True)\n")
            os._exit(ABORT_EXIT_CODE)

    def _returned(self, call: _Call) -> None:
        with self._report_lock:
            self._returned_locked(call)

    def _returned_locked(self, call: _Call) -> None:
        del self._reported[id(call)]
        rank = _rank()
        store = _store()
        if store is not None:
            with contextlib.suppress(Exception):
                store.delete_key(f"{_STORE_PREFIX}{rank}")
        self._emit(
            rank,
            f"ncclcheck watchdog: rank {rank}: {call.op} at {call.site} returned after "
            f"{time.monotonic() - call.start:.1f} s\n",
        )

    def _site(self, call: _Call) -> tuple[str, str]:
        """The first user frame of the call and the user frame that called it."""
        found: list[str] = []
        if call.sites:
            places = [(code, _line_of(code, offset)) for code, offset in call.sites]
        else:
            places = []
            frame = call.frame
            while frame is not None and len(places) < 64:
                places.append((frame.f_code, frame.f_lineno))
                frame = frame.f_back
        for code, line in places:
            if is_user_code(code) and len(found) < 2:
                found.append(f"{shown_path(code.co_filename)}:{line} in {code.co_name}()")
        if not found and places:  # only library frames: name the innermost outside ncclcheck
            code, line = places[0]
            found.append(f"{shown_path(code.co_filename)}:{line} in {code.co_name}()")
        return (found[0] if found else "?"), (found[1] if len(found) > 1 else "")

    def _emit(self, rank: int, text: str) -> None:
        self.reports.append(text)
        sys.stderr.flush()
        with contextlib.suppress(OSError):
            os.write(2, text.encode())  # one write: the ranks share the launcher's stderr
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.directory / f"rank-{rank:05d}.txt", "a", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as error:
            sys.stderr.write(f"ncclcheck watchdog: cannot write to {self.directory}: {error}\n")


def watchdog(
    timeout: float = 300.0,
    *,
    directory: str | os.PathLike[str] | None = None,
    interval: float | None = None,
    track_completion: bool | None = None,
    abort: bool = False,
) -> Watchdog:
    """Watch every collective this process calls; report one that waits over ``timeout`` s.

    Call it once at start-up (it returns the installed Watchdog), or use it as a
    context manager around the part to watch. ``directory``: where the per-rank
    report files go (default ``$NCCLCHECK_WATCHDOG_DIR`` or ``./ncclcheck-watchdog``).
    ``track_completion``: issue synchronous calls asynchronously and watch their
    completion (default: for GPU tensors, whose calls return before they complete).
    ``abort``: exit the rank with status 124 after the report, so the launcher
    stops the job now instead of at the backend's timeout.
    """
    return Watchdog(timeout, directory, interval, track_completion, abort).start()


# -- helpers --------------------------------------------------------------------------------


def _grad_mode() -> Callable[[], bool]:
    import torch

    is_grad_enabled: Callable[[], bool] = torch.is_grad_enabled
    return is_grad_enabled


def _on_gpu(args: tuple[Any, ...]) -> bool:
    first = args[0] if args else None
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    return bool(getattr(first, "is_cuda", False))


def _sites(frame: FrameType | None) -> list[tuple[CodeType, int]]:
    sites: list[tuple[CodeType, int]] = []
    while frame is not None and len(sites) < _SITE_FRAMES:
        sites.append((frame.f_code, frame.f_lasti))
        frame = frame.f_back
    return sites


def _line_of(code: CodeType, offset: int) -> int:
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno


def _shapes(args: tuple[Any, ...]) -> str:
    described: list[str] = []

    def visit(value: Any, depth: int) -> None:
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            described.append(f"{list(value.shape)} {str(value.dtype).replace('torch.', '')} {value.device}")
        elif isinstance(value, (list, tuple)) and depth < 2:
            for item in value[:4]:
                visit(item, depth + 1)

    for arg in args:
        visit(arg, 0)
    return ", ".join(described) or "(no tensors)"


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return int(os.environ.get("RANK", "0"))


def _describe_group(group: Any) -> tuple[str, list[int]]:
    import torch.distributed as dist

    try:
        resolved = group if group is not None else dist.group.WORLD
        return str(resolved.group_name), list(dist.get_process_group_ranks(resolved))
    except Exception:
        return ("default" if group is None else repr(group)), []


def _ranks(ranks: list[int]) -> str:
    from ncclcheck.model import format_ranks

    return format_ranks(ranks)


def _store() -> Any:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.distributed_c10d._get_default_store()
    except Exception:
        pass
    return None


def _publish(store: Any, rank: int, mine: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):  # the store's server (rank 0's agent) may be gone
        store.set(f"{_STORE_PREFIX}{rank}", json.dumps(mine))


def _others(store: Any, rank: int, mine: dict[str, Any]) -> list[str]:
    """What every rank's watchdog has said, grouped by where they wait."""
    try:
        import torch.distributed as dist

        world = dist.get_world_size()
        said: dict[int, dict[str, Any]] = {}
        for other in range(world):
            key = f"{_STORE_PREFIX}{other}"
            if other == rank:
                said[other] = mine
            elif store.check([key]):
                said[other] = json.loads(store.get(key))
    except Exception as error:
        return [f"  (the other ranks' reports could not be read: {type(error).__name__}: {error})"]
    return describe_waits(said, world)


def describe_waits(said: dict[int, dict[str, Any]], world: int) -> list[str]:
    """Group the ranks' reports by where they wait and say what that pattern means,
    in the catalogue's cause ids."""
    places: dict[tuple[str, str, int, str], list[int]] = {}
    for other, where in sorted(said.items()):
        place = (where["op"], where["group"], where["seq"], where["site"])
        places.setdefault(place, []).append(other)
    lines = ["  where the ranks wait (their watchdogs' reports):"]
    for (op, group, seq, site), ranks in sorted(places.items(), key=lambda item: item[1]):
        lines.append(f"    {_who(ranks)}: {op} #{seq} on group {group} at {site}")
    silent = [r for r in range(world) if r not in said]
    if silent:
        lines.append(f"    {_who(silent)}: not waiting in a collective")
        lines.append(
            f"  likely: {_who(silent)} crashed or left the loop early (rank-crashed, rank-early-exit, "
            "rank-exception), or is still computing (straggler); the others wait for it"
        )
        return lines
    ops_by_seq: dict[tuple[str, int], set[str]] = {}
    for op, group, seq, _site in places:
        ops_by_seq.setdefault((group, seq), set()).add(op)
    shapes = {json.dumps(where.get("shapes")) for where in said.values()}
    in_eval = sorted(r for r, where in said.items() if where.get("phase") == "eval")
    if in_eval and len(in_eval) < len(said) and len(places) > 1:
        left = sorted(set(said) - set(in_eval))
        lines.append(
            f"  likely: {_who(in_eval)} still in evaluation while {_who(left)} left it: an extra eval "
            "step or an eval-only collective on one side (uneven-eval-batches, rank-conditional-collective)"
        )
    elif any(len(ops) > 1 for ops in ops_by_seq.values()):
        lines.append(
            "  likely: the ranks call different collectives at the same point: they took different "
            "paths through the code (rank-conditional-collective, collective-order-mismatch)"
        )
    elif len({seq for _, _, seq, _ in places}) > 1:
        lines.append(
            "  likely: some ranks made more calls on the group than others: an extra or a skipped "
            "collective on one side (uneven-eval-batches, data-dependent-branch)"
        )
    elif len(places) > 1:
        lines.append(
            "  likely: the same call reached from different sites: the ranks' code paths differ "
            "(collective-order-mismatch)"
        )
    elif len(shapes) > 1:
        lines.append(
            "  likely: the same call with different shapes on different ranks (collective-shape-mismatch)"
        )
    else:
        lines.append(
            "  likely: every rank waits in the same call: the transport, not the program "
            "(transport-hang); `ncclcheck probe` checks it"
        )
    return lines


def _who(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks(ranks)}"
