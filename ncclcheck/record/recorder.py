"""The recorder that runs inside each rank of a dry run.

It wraps the public collectives of torch.distributed (object collectives and
p2p included), DDP's gradient buckets (through a comm hook) and buffer
broadcasts, follows phases (Module.train()/eval(), grad mode) and DataLoader
passes, and writes one JSON line per event to this rank's trace file *before*
the collective runs: a rank that aborts or is killed inside a collective still
leaves its record. It also enforces the dry-run budget (a few train steps per
pass, every eval pass in full, an aligned stop).

Trace lines (``"t"`` is the kind):

- ``hello``: rank, local_rank, world_size, group_rank, host, pid, script
- ``init``: the process group was initialised (backend)
- ``site``: what every call from one call site shares, written before the first
  call that names it: id, op, group, group_ranks, shapes, dtypes, device, async,
  phase, src, stack (the user's frames, outermost first), and where they apply libs,
  issuer, later (a framework's deferred call), ``shadow`` (a stand-in DDP's Join
  issues on a rank that ran out of batches), peer, bucket, members (a ``new_group``,
  recorded in a group of its own named ``new_group``)
- ``call``: one collective: n (per rank), seq (per group), ns (wall clock in integer
  nanoseconds; the other lines have ``time``), pos (the loader batch being
  processed), site (the id of its site line): about 60 bytes a call
- ``pass``: a DataLoader pass started or ended (name, role, len, sampler, batches)
- ``batch``: a batch was drawn (loader name, pass, index): progress and position
- ``reading``: an eval loader without a length being read ahead (batches so far)
- ``phase``: the phase changed (train/eval)
- ``exit``: how the user's script ended (where the budget stopped it: ``stack``)
- ``rooted_read``: a read of a tensor dist.reduce gave to another rank (rooted.py)
- ``cpu``, ``perturb``, ``framework``: what --cpu, --perturb or a framework adapter
  changed, and where (note_site)
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from ncclcheck.communicates import P2P
from ncclcheck.frames import is_user_code, user_frames
from ncclcheck.record.calls import (
    CREATIONS,
    describe_group,
    in_state,
    issuer_name,
    libraries_on,
    tensor_key,
    tensor_signature,
    under_join_exit,
)
from ncclcheck.record.fastforward import FastForward
from ncclcheck.record.hotstate import fastcall, new_state
from ncclcheck.record.loaders import DryRunComplete, TrackedIterator, name_of
from ncclcheck.record.tracefile import End, TraceFile

ENV_TRACE_DIR = "NCCLCHECK_TRACE_DIR"
ENV_TRAIN_STEPS = "NCCLCHECK_TRAIN_STEPS"
ENV_EVAL_PASSES = "NCCLCHECK_EVAL_PASSES"
ENV_MAX_TRAIN_PASSES = "NCCLCHECK_MAX_TRAIN_PASSES"
ENV_DRY_RUN = "NCCLCHECK_DRY_RUN"
# "1": record in Python only, without the C fast path (to compare the two, or to rule it out)
ENV_PURE_PYTHON = "NCCLCHECK_PURE_PYTHON"


# bytes %: cheaper than str + encode. The time in integer nanoseconds: formatting a
# float made a loop of small gloo all_reduces 1-3% slower.
_CALL_LINE = b'{"t":"call","n":%d,"seq":%d,"ns":%d%b%b}\n'
_KEY_FRAMES = 64  # frames of the caller's stack that tell one call site from another


class OwnLauncher(BaseException):
    """Raised where the script starts ranks of its own (torch.multiprocessing.spawn):
    those processes would run without the recorder, so the dry run stops there.
    A BaseException, so that a script's ``except Exception`` does not swallow it."""


class _Depth(threading.local):
    inside = 0  # > 0 while a recorded collective (or DDP hook) runs on this thread


class Recorder:
    """One per rank process. Thread-safe: DDP hooks may run on autograd threads."""

    def __init__(
        self, trace_dir: str, rank: int, train_steps: int, eval_passes: int, max_train_passes: int
    ) -> None:
        os.makedirs(trace_dir, mode=0o700, exist_ok=True)
        path = os.path.join(trace_dir, f"rank-{rank:05d}.jsonl")
        # the C fast path (record/_fastcall.c) where it was built and is not turned off
        self._in_c = fastcall is not None and os.environ.get(ENV_PURE_PYTHON) != "1"
        # what every call reads and sets: the call counter, phase, position, trace offset
        self.state = new_state(self._in_c)
        self._trace = TraceFile(path, self.state)
        self._lock = self._trace.lock  # held for a call's number, seq and line together
        self._depth = fastcall.Depth() if self._in_c else _Depth()
        self.rank = rank
        self.train_steps = train_steps
        self.eval_passes = eval_passes
        self.max_train_passes = max_train_passes
        self._group_seq: dict[str, Iterator[int]] = {}  # per group name: the next seq
        self._group_cache: dict[int, tuple[str, list[int]]] = {}
        self._loader_names: dict[int, str] = {}
        self._position: dict[str, Any] | None = None  # the loader batch being processed
        self._eval_passes_done = 0
        self._train_passes_started = 0
        self._train_since_eval = 0  # train batches drawn since the last complete eval pass
        # --train-end-batches: train loaders whose pass ran (or is running) to its end, and
        # the fast-forwarded passes still open, by loader; how many passes each started
        self._pass_end_run: set[str] = set()
        self._running_to_end: dict[str, TrackedIterator] = {}
        self._train_passes_by_loader: dict[str, int] = {}
        # a fast-forwarded pass ended: what the script does at the epoch's end (a save, an
        # evaluation) runs before the budget may stop the run, up to the next train batch
        self._at_epoch_end = False
        self._backward_site: list[tuple[str, int, str]] = []
        # per distinct call: its encoded fields and its group's seq counter
        self._static: dict[tuple[Any, ...], tuple[bytes, Iterator[int]]] = {}
        self._pinned_codes: set[Any] = set()  # keeps the code ids in _static's keys unique
        # The C fast path's own cache of the same statics, by a hash of what _static's
        # keys hold (record/_fastcall.c); cleared with _static.
        self.fast_static: dict[int, tuple[bytes, Iterator[int]]] = {}
        self._site_ids = itertools.count()  # the ids of site lines
        self._noted: set[tuple[Any, ...]] = set()  # see note_site and first_time
        # Tensors dist.reduce left without its result on this rank, by id (record/rooted.py).
        self.rooted: dict[int, Any] = {}
        self.watching_rooted_reads = False
        # False during an eval pass that is not the job's evaluation (Lightning's sanity
        # check: two batches before training, often with the logging skipped).
        self.counts_as_eval_pass: Callable[[], bool] = lambda: True
        # Loaders a framework made and said what they are for (id -> name, role): the
        # Trainer's train loader is drawn from before model.train() is called; and the
        # role of any loader iterated while a framework's loop runs (Lightning makes its
        # eval loop's iterator before it calls model.eval()), None outside one.
        self.loader_hints: dict[int, tuple[str, str]] = {}
        self.framework_role: Callable[[], str | None] = lambda: None
        self.fast_forward = FastForward.from_environment()  # --eval-batches K
        import torch  # not at module level: the CLI imports this module without torch

        self._grad_enabled = torch.is_grad_enabled
        self._tensor_type = torch.Tensor
        self.stop_reason: str | None = None

    # The fields of ``state`` other modules set, by their names of old.
    outermost_frame = in_state(
        "outermost",
        "The walk over the caller's stack stops here: the frames outside the user's "
        "script (the bootstrap, runpy) are the same for every call.",
    )
    deferred = in_state(
        "deferred", "Set while a framework runs a collective the user asked for earlier (frameworks.py)."
    )
    user_no_grad = in_state(
        "user_no_grad", "no_grad/inference_mode blocks the user's code has open (bootstrap.py counts them)."
    )
    in_backward = in_state(
        "in_backward", "> 0 inside backward(): autograd runs with grad mode off, which is not evaluation."
    )

    # -- writing -----------------------------------------------------------------

    def write(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        self._trace.append(line)

    def close(self) -> None:
        self._trace.close()

    def hello(self, script: str, **known: int) -> None:
        env = os.environ
        self.write(
            {
                "t": "hello",
                "rank": self.rank,
                "local_rank": int(env.get("LOCAL_RANK", "0")),
                "world_size": int(env.get("WORLD_SIZE", "1")),
                "group_rank": int(env.get("GROUP_RANK", "0")),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "script": script,
                "time": time.time(),
                **known,
            }
        )

    def note_site(self, record_type: str, kind: str, frame: Any) -> None:
        """``{"t": record_type, "kind": kind, "site": [file, line, function]}``, written the
        first time ``kind`` is seen at ``frame``'s line: what --cpu mapped, --perturb
        changed or a framework adapter set, and where, for the report."""
        if frame is not None:
            file, line, function = frame.f_code.co_filename, int(frame.f_lineno), frame.f_code.co_name
        else:
            file, line, function = "?", 0, "?"
        if not self.first_time((record_type, kind, file, line)):
            return
        self.write({"t": record_type, "kind": kind, "site": [file, line, function], "time": time.time()})

    def first_time(self, key: tuple[Any, ...]) -> bool:
        """True the first time ``key`` is given: one trace line per site, however often it runs."""
        if key in self._noted:
            return False
        self._noted.add(key)
        return True

    def exit(
        self,
        how: End,
        code: int,
        error: str | None = None,
        site: list[Any] | None = None,
        stack: list[list[Any]] | None = None,
    ) -> None:
        record: dict[str, Any] = {
            "t": "exit",
            "how": how.value,
            "code": code,
            "time": time.time(),
            "phase": self.phase,
            "calls": self.state.calls,
        }
        if error:
            record["error"] = error
        if site:
            record["site"] = site  # the user's line the exception left from
        if stack:
            record["stack"] = stack  # the user's frames where the dry run stopped, outermost first
        if self.stop_reason:
            record["stop"] = self.stop_reason
        self.write(record)

    # -- phases ------------------------------------------------------------------

    @property
    def phase(self) -> str:
        # The module whose train()/eval() the user (or framework) called last: its
        # ``training`` flag is read, not remembered, as Lightning restores the mode
        # after validation by setting ``training`` on each submodule directly.
        state = self.state
        module = state.mode_module()
        if module is not None and not module.training:
            return "eval"
        # gradients off by the user's own no_grad/inference_mode (a library's is not
        # evaluation: FSDP gathers parameters under no_grad while training)
        user_off = state.user_no_grad > 0 and not self._grad_enabled()
        return "eval" if user_off and not state.in_backward else "train"

    def _note_phase(self) -> str:
        phase = self.phase
        if phase != self.state.phase:
            self.state.phase = phase
            self.write({"t": "phase", "phase": phase, "time": time.time()})
        return phase

    def set_module_mode(self, module: Any) -> None:
        # The wrapped model, not the wrapper (DDP, DataParallel): Lightning restores the
        # mode on its own module, inside the DDP wrapper it called eval() on.
        for _ in range(4):
            inner = getattr(module, "module", None)
            if inner is None or not hasattr(inner, "training"):
                break
            module = inner
        try:
            self.state.mode_module = weakref.ref(module)
        except TypeError:  # not weak-referenceable: hold it
            self.state.mode_module = lambda: module
        self._note_phase()

    # -- collectives ---------------------------------------------------------------

    def _group(self, group: Any) -> tuple[str, list[int]]:
        key = id(group)
        cached = self._group_cache.get(key)
        if cached is None:
            cached = self._group_cache[key] = describe_group(group)
        return cached

    def record_call(self, *call: Any) -> None:
        """Write one call line before the collective runs; ``call`` is what ``static_of``
        takes (op, group, tensors, async_op, source, caller[, extra]).

        The hot path of the dry run (record/_fastcall.c does the same in C for the
        common calls, and comes here for the rest): everything that repeats from
        call to call (the stack, the group, shapes, phase) is encoded once per
        distinct call and cached. A call costs a walk over the stack that reads each
        frame's code and instruction offset (not its line number: computing f_lineno
        scans the line table and cost 3x the rest of the walk), a dict lookup and one
        store into the trace's mapping.
        """
        self.write_call(self.static_of(*call))

    def static_of(
        self,
        op: str,
        group: Any,
        tensors: Any,
        async_op: bool,
        source: str,
        caller: Any,
        extra: dict[str, Any] | None = None,
    ) -> tuple[bytes, Iterator[int]]:
        """A call's encoded fields (all but n, seq, ns and pos) and its group's seq counter."""
        key: list[Any] = [op, id(group), async_op, source, self._note_phase()]
        if extra is not None:
            key.append(tuple(sorted(extra.items())))
        append = key.append
        tensor_type = self._tensor_type
        for value in tensors:  # tensor_key, its first level inlined: most calls pass one tensor
            if isinstance(value, tensor_type):
                append(value.shape)
                append(value.dtype)
                append(value.get_device())
            elif isinstance(value, (list, tuple)):
                tensor_key(value, key, tensor_type, 1)
        frame = caller
        state = self.state
        outermost = state.outermost
        depth = 0
        while frame is not None and frame is not outermost and depth < _KEY_FRAMES:
            # Code objects by id: hashing a code object hashes its contents. The
            # codes of every cached key stay referenced, so no id is reused.
            append(id(frame.f_code))
            append(frame.f_lasti)
            frame = frame.f_back
            depth += 1
        if state.deferred is not None:
            append(("deferred", state.deferred.token))
        frozen = tuple(key)
        static = self._static.get(frozen)
        if static is None:
            static = self._encode_static(frozen, op, group, tensors, async_op, source, caller, extra)
        return static

    def write_call(self, static: tuple[bytes, Iterator[int]]) -> None:
        encoded, group_seq = static
        state = self.state
        with self._lock:
            state.calls = calls = state.calls + 1
            line = _CALL_LINE % (calls, next(group_seq), time.time_ns(), state.position, encoded)
            self._trace.append_locked(line)

    def _encode_static(
        self,
        key: tuple[Any, ...],
        op: str,
        group: Any,
        tensors: Any,
        async_op: bool,
        source: str,
        caller: Any,
        extra: dict[str, Any] | None,
    ) -> tuple[bytes, Iterator[int]]:
        facts: list[tuple[tuple[int, ...], str, str]] = []
        tensor_signature(tensors, facts)
        frames = user_frames(caller)
        if not frames and self._backward_site:
            frames = self._backward_site  # a hook on an autograd thread: the backward() site
        name, ranks = self._group(group)
        fields: dict[str, Any] = {
            "op": op,
            "group": name,
            "group_ranks": ranks,
            "shapes": [list(shape) for shape, _, _ in facts],
            "dtypes": [dtype for _, dtype, _ in facts],
            # from the tensors: a barrier or an object collective names none
            "device": ",".join(sorted({device for _, _, device in facts})),
            "async": async_op,
            "phase": self.state.phase,
            "src": source,
            "stack": [list(f) for f in reversed(frames)],
            **(extra or {}),
        }
        libraries = libraries_on(caller, self.outermost_frame)
        if libraries:
            fields["libs"] = libraries
        if caller is not None and not is_user_code(caller.f_code):
            fields["issuer"] = issuer_name(caller)
        if under_join_exit(caller, self.outermost_frame):
            fields["shadow"] = "join"
        deferred = self.deferred
        if deferred is not None and deferred.stack:
            # Sited where the user asked for it; where it ran goes beside it.
            fields["stack"] = deferred.stack
            fields["src"] = "deferred"
            fields["later"] = {
                "by": deferred.framework,
                "for": deferred.described,
                "in": list(frames[0]) if frames else None,
            }
        encoded = ("," + json.dumps(fields, separators=(",", ":"))[1:-1]).encode()
        if len(self._static) > 10_000:  # a script that never repeats a call: stay bounded
            self._static.clear()
            self.fast_static.clear()  # keyed by code ids too, which may now be reused
            self._pinned_codes.clear()
        frame = caller
        for _ in range(_KEY_FRAMES):
            if frame is None:
                break
            self._pinned_codes.add(frame.f_code)
            frame = frame.f_back
        group_seq = self._group_seq.get(name)
        if group_seq is None:
            group_seq = self._group_seq[name] = itertools.count()
        # The fields go to the trace once, in a site line; each call line names its id.
        site = next(self._site_ids)
        self._trace.append(b'{"t":"site","id":%d%b}\n' % (site, encoded))
        static = self._static[key] = (b',"site":%d' % site, group_seq)
        return static

    def wrap_collective(
        self,
        op: str,
        fn: Callable[..., Any],
        *,
        process_group_of: Callable[[Any], Any] | None = None,
        source: str = "python",
    ) -> Callable[..., Any]:
        """``fn`` recording each call before it runs. ``process_group_of`` turns the
        call's group argument into its ProcessGroup, for APIs that also take a device
        mesh or a group name (functional collectives); ``source`` says which API it is."""
        import inspect

        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):  # a pybind builtin (_broadcast_coalesced)
            params = []
        group_index = params.index("group") if "group" in params else None
        is_p2p = op in P2P
        group_is_first = op == "_broadcast_coalesced"  # (process_group, tensors, buffer_size, src)
        peer_names = [p for p in ("dst", "src", "group_dst", "group_src") if p in params]
        depth = self._depth

        async_index = params.index("async_op") if "async_op" in params else None
        peer_positions = [(name, params.index(name)) for name in peer_names]
        get_frame = sys._getframe
        record_call = self.record_call
        # These give their first tensor the same value on every rank: a reduce's
        # result that was marked as missing on this rank (rooted.py) has it now.
        rooted = self.rooted if op in ("all_reduce", "broadcast") else None

        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if depth.inside:  # a collective inside a collective (all_gather_object's all_gather)
                return fn(*args, **kwargs)
            if kwargs:
                group = kwargs.get("group")
                async_op = bool(kwargs.get("async_op", False))
                tensors: tuple[Any, ...] = (*args, *kwargs.values())
            else:
                group, async_op, tensors = None, False, args
            if group is None and group_index is not None and len(args) > group_index:
                group = args[group_index]
            if async_index is not None and len(args) > async_index:
                async_op = bool(args[async_index])
            if group_is_first and args:
                group = args[0]
            if process_group_of is not None:
                group = process_group_of(group)
            extra: dict[str, Any] | None = None
            if is_p2p:
                extra = {}
                for peer, position in peer_positions:
                    value = kwargs.get(peer, args[position] if len(args) > position else None)
                    if value is not None:
                        extra["peer"] = value
            record_call(op, group, tensors, async_op, source, get_frame(1), extra)
            if rooted and args:
                rooted.pop(id(args[0]), None)
            depth.inside = 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.inside = 0

        recorded.__ncclcheck_wrapped__ = fn  # type: ignore[attr-defined]
        if is_p2p or group_is_first or process_group_of is not None:
            return recorded  # what the C fast path does not read: peers, another group argument
        return self._fast_call(fn, recorded, op, source, group_index, async_index) or recorded

    def _fast_call(
        self,
        fn: Callable[..., Any],
        slow: Callable[..., Any],
        op: str,
        source: str,
        group_index: int | None,
        async_index: int | None,
    ) -> Callable[..., Any] | None:
        """The same wrapper in C (record/_fastcall.c), which hands ``slow`` every call it
        does not take; None where the extension was not built or is turned off."""
        if not self._in_c:
            return None
        fast = fastcall.FastCall(
            fn=fn,
            slow=slow,
            recorder=self,
            op=op,
            source=source,
            depth=self._depth,
            rooted=self.rooted,
            lock=self._lock,
            trace=self._trace,
            state=self.state,
            cache=self.fast_static,
            tensor_type=self._tensor_type,
            grad_enabled=self._grad_enabled,
            group_index=-1 if group_index is None else group_index,
            async_index=-1 if async_index is None else async_index,
        )
        functools.update_wrapper(fast, fn)
        fast.__ncclcheck_wrapped__ = fn
        return fast  # type: ignore[no-any-return]

    def wrap_new_group(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``dist.new_group`` recording each call before it runs, in a sequence of its own.

        Every rank of the job must enter new_group, members or not, in the same order:
        groups are named by a count of the calls, so a rank that skipped one names the
        next group differently and waits for peers that never come (or, with
        TORCH_DIST_INIT_BARRIER=1 and on torchcomms, waits inside the call itself).
        With use_local_synchronization=True only the members take part, and the name
        comes from the ranks: not recorded."""
        import inspect

        params = list(inspect.signature(fn).parameters)
        ranks_index = params.index("ranks") if "ranks" in params else None
        local_index = (
            params.index("use_local_synchronization") if "use_local_synchronization" in params else None
        )
        depth = self._depth
        get_frame = sys._getframe
        record_call = self.record_call

        @functools.wraps(fn)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            local = kwargs.get("use_local_synchronization")
            if local is None and local_index is not None and len(args) > local_index:
                local = args[local_index]
            if depth.inside or local:
                return fn(*args, **kwargs)
            ranks = kwargs.get("ranks")
            if ranks is None and ranks_index is not None and len(args) > ranks_index:
                ranks = args[ranks_index]
            members = tuple(sorted(int(r) for r in ranks)) if ranks is not None else "all"
            record_call("new_group", CREATIONS, (), False, "python", get_frame(1), {"members": members})
            depth.inside = 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth.inside = 0

        recorded.__ncclcheck_wrapped__ = fn  # type: ignore[attr-defined]
        return recorded

    # -- DDP -----------------------------------------------------------------------

    def ddp_hook(self, model: Any, bucket: Any) -> Any:
        """A comm hook that records the bucket, then does what DDP would have done."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buffer = bucket.buffer()
        self.record_call(
            "all_reduce",
            model.process_group,
            [buffer],
            True,
            "ddp",
            sys._getframe(1),
            {"bucket": bucket.index()},
        )
        user_hook = model.__dict__.get("_ncclcheck_user_hook")
        self._depth.inside += 1
        try:
            if user_hook is not None:
                state, hook = user_hook
                return hook(state, bucket)
            return allreduce_hook(model.process_group, bucket)
        finally:
            self._depth.inside -= 1

    def note_backward(self, caller: Any) -> None:
        self._backward_site = user_frames(caller)

    # -- loaders and the budget ------------------------------------------------------

    def loader_name(self, loader: Any, caller: Any) -> str:
        key = id(loader)
        known = self._loader_names.get(key)
        if known:
            return known
        hint = self.loader_hints.get(key)
        name = hint[0] if hint is not None else None
        frame = None if hint is not None else caller
        for _ in range(8):  # the outermost user frame that names it: where it was made
            if frame is None:
                break
            if is_user_code(frame.f_code):
                for scope in (frame.f_locals, frame.f_globals):
                    var = name_of(loader, scope)
                    if var is not None:
                        name = var
                        break
            frame = frame.f_back
        if name is None or name in self._loader_names.values():
            name = f"{name or 'loader'}#{len(self._loader_names)}"
        self._loader_names[key] = name
        return name

    def track(self, loader: Any, make: Callable[[], Iterator[Any]], caller: Any) -> Iterator[Any]:
        return TrackedIterator(self, loader, make, self.loader_name(loader, caller))

    def wants_pass_end(self, loader: str) -> bool:
        """Fast-forward this train pass to its end (--train-end-batches): the first pass of
        each train loader that gets past its head, while the budget is not spent."""
        ff = self.fast_forward
        return (
            ff is not None
            and ff.train_end > 0
            and self.train_steps > 0
            and loader not in self._pass_end_run
            and not self.budget_spent
        )

    def train_passes_of(self, loader: str) -> int:
        """The train passes over ``loader`` this rank started before this one."""
        return self._train_passes_by_loader.get(loader, 0)

    def pass_started(self, tracked: TrackedIterator) -> None:
        if tracked.role == "train":
            self._train_passes_by_loader[tracked.name] = self.train_passes_of(tracked.name) + 1
            left = self._running_to_end.pop(tracked.name, None)
            if left is not None and left.index > left.head:
                self._pass_end_run.add(tracked.name)  # left in its tail (zip() stops at the shorter)
            if tracked.fast_forwarded:
                self._running_to_end[tracked.name] = tracked
        self.write({"t": "pass", "event": "start", **tracked.facts(), "time": time.time()})

    def pass_ended(self, tracked: TrackedIterator, exhausted: bool) -> None:
        self._position = None
        self.state.position = b""
        if self._running_to_end.get(tracked.name) is tracked:
            del self._running_to_end[tracked.name]
            if exhausted or tracked.index > tracked.head:
                self._pass_end_run.add(tracked.name)
                self._at_epoch_end = True
        if tracked.role == "eval" and exhausted and not tracked.counted:
            self._eval_pass_complete(tracked)
        facts = {"event": "end", "exhausted": exhausted, **tracked.facts(), "time": time.time()}
        self.write({"t": "pass", **facts})

    def batch_drawn(self, tracked: TrackedIterator) -> None:
        self._position = {
            "loader": tracked.name,
            "pass": tracked.pass_index,
            "batch": tracked.index,
            "role": tracked.role,
        }
        self.state.position = (',"pos":' + json.dumps(self._position, separators=(",", ":"))).encode()
        self.write({"t": "batch", **self._position, "phase": self._note_phase(), "time": time.time()})
        if tracked.role == "train":
            self._train_since_eval += 1
        elif not tracked.counted and tracked.index == tracked.length:
            # Its last batch: a complete pass, though the caller may never ask for the
            # StopIteration (Lightning stops at len(loader) and leaves the iterator).
            self._eval_pass_complete(tracked)

    @property
    def eval_passes_done(self) -> int:
        return self._eval_passes_done

    def _eval_pass_complete(self, tracked: TrackedIterator) -> None:
        tracked.counted = True
        if not self.counts_as_eval_pass():
            return
        self._eval_passes_done += 1
        self._train_since_eval = 0

    def budget_check(self, tracked: TrackedIterator) -> None:
        """Called before a train batch is drawn: end the pass or the dry run here.

        The dry run ends at the same logical point on every rank: once the eval passes
        are done and ``train_steps`` batches have been trained on since the last one
        (the steps after an evaluation are where a rank-local decision taken in it
        shows). A framework that stops a short epoch itself, by length (Lightning's
        limit_train_batches), never asks for the batch past the budget; counting
        batches since the evaluation, not within the pass, stops it all the same.
        """
        if tracked.role != "train":
            if tracked.index == tracked.skipped:  # the first batch of an eval pass after the budget
                self._stop_if_done()
            return
        if tracked.index == 0:
            self._train_passes_started += 1
        self._at_epoch_end = False
        self._stop_if_done()
        if self._train_passes_started > self.max_train_passes:
            self.stop_reason = (
                f"stopped after {self.max_train_passes} train passes with "
                f"{self._eval_passes_done} complete eval pass(es)"
            )
            raise DryRunComplete(self.stop_reason)
        if tracked.index >= self.train_steps and not tracked.fast_forwarded:
            tracked.cut_by_budget = True
            raise StopIteration

    @property
    def budget_spent(self) -> bool:
        """The eval passes are done, the train steps after the last one too, no train pass
        past its head is still on its way to its end (a peek at one batch holds nothing
        up), and no epoch's end is running (from a fast-forwarded pass's end to the next
        train batch)."""
        return (
            self._eval_passes_done >= self.eval_passes
            and self._train_since_eval >= self.train_steps
            and not self._at_epoch_end
            and not any(t.index >= t.head for t in self._running_to_end.values())
        )

    def _stop_if_done(self) -> None:
        if self.budget_spent:
            self.stop_reason = (
                f"stopped after {self._eval_passes_done} complete eval pass(es) and "
                f"{self._train_since_eval} train steps after the last"
            )
            raise DryRunComplete(self.stop_reason)
