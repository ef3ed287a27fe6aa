"""Line evidence: which lines each rank ran in the functions where the ranks parted.

preflight's first run finds *where* the ranks part (the first divergence) and the
functions on the call chain of the call one side missed. It then replays the dry run
with this tracer in every rank (``NCCLCHECK_LINES`` names the plan,
explain/lines.py writes it): in those functions only, it counts the lines each rank
runs, keeps the values the tests of their exits and loops read (``loss = inf``) and
the exceptions that pass through them (type, message, the line that raised, where
they were handled); at the call where the first run parted it writes what it saw and
ends the rank, before the call that would hang. The collectives are recorded as in
the first run, so the two runs' sequences can be compared: a script that does not
replay the same (an unseeded draw, the clock) is told from one that does.

``sys.settrace`` (and ``threading.settrace``) with a global function that returns a
local one for the target code objects only: every other frame costs one call of the
global function and is not traced line by line. Every collective is recorded in
Python during a replay (the C fast path does not call back), so the stop is exact.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any

from ncclcheck.record.tracefile import End

ENV_LINES = "NCCLCHECK_LINES"  # the path of the plan: targets, values to keep, where to stop
LINES_GLOB = "lines-rank-*.json"
_MAX_EXCEPTIONS = 64
_IGNORED_EXCEPTIONS = (StopIteration, StopAsyncIteration, GeneratorExit)

_tracer: LineTracer | None = None


def lines_path(trace_dir: str, rank: int) -> str:
    return os.path.join(trace_dir, f"lines-rank-{rank:05d}.json")


def describe_value(value: Any) -> str:
    """A short text for a value a test read: scalars as they are, a tensor by its
    values when small and by its range and non-finite count otherwise."""
    try:
        if isinstance(value, float):
            return f"{value:.6g}"
        if value is None or isinstance(value, (bool, int)):
            return repr(value)
        if isinstance(value, str):
            return repr(value[:60])
        module = type(value).__module__
        if module.startswith("torch") and hasattr(value, "numel") and hasattr(value, "detach"):
            return _describe_tensor(value)
        if isinstance(value, (list, tuple, dict, set)):
            return f"{type(value).__name__} of {len(value)}"
        return f"a {type(value).__name__}"
    except Exception as exc:  # a value whose repr fails tells nothing; say so
        return f"(unreadable: {type(exc).__name__})"


def _describe_tensor(tensor: Any) -> str:
    import torch

    data = tensor.detach()
    dtype = str(data.dtype).replace("torch.", "")
    if data.numel() <= 4:
        values = ", ".join(
            f"{v:.4g}" if isinstance(v, float) else repr(v) for v in data.cpu().flatten().tolist()
        )
        return f"tensor([{values}]) {dtype}"
    shape = list(data.shape)
    if not data.is_floating_point():
        return f"tensor {dtype}{shape}"
    flat = data.float().cpu().flatten()
    finite = torch.isfinite(flat)
    bad = int((~finite).sum())
    text = f"tensor {dtype}{shape}"
    if bool(finite.any()):
        kept = flat[finite]
        text += f", from {float(kept.min()):.4g} to {float(kept.max()):.4g}"
    return text + (f", {bad} non-finite" if bad else "")


class LineTracer:
    """The tracer of one rank: counts, values and exceptions in the target functions."""

    def __init__(self, plan: dict[str, Any], rank: int, trace_dir: str) -> None:
        self.rank = rank
        self.path = lines_path(trace_dir, rank)
        self.pid = os.getpid()  # DataLoader workers forked from this process inherit the tracer
        # (file, function name) -> [(first line, last line)]: a function by where it is
        self.targets: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for file, name, first, last in plan.get("targets", []):
            self.targets.setdefault((file, name), []).append((int(first), int(last)))
        self.watch: dict[tuple[str, int], list[str]] = {
            (file, int(line)): list(names) for file, line, names in plan.get("watch", [])
        }
        stop = plan.get("stop", {}).get(str(rank))
        self.stop_at: int | None = int(stop) if stop is not None else None
        self.decided: dict[int, tuple[CodeType, bool]] = {}  # id(code) -> (code, traced?)
        self.counts: dict[tuple[str, int], int] = {}
        self.values: dict[tuple[str, int], dict[str, dict[str, str]]] = {}  # first/last snapshot
        self.exceptions: list[dict[str, Any]] = []
        self.pending: dict[int, int] = {}  # id(frame) -> its exception's index, till its next line
        self.lock = threading.Lock()
        self.saved = False

    # -- tracing -----------------------------------------------------------------------

    def is_target(self, code: CodeType) -> bool:
        known = self.decided.get(id(code))
        if known is not None and known[0] is code:
            return known[1]
        ranges = self.targets.get((code.co_filename, code.co_name))
        traced = ranges is not None and any(
            first <= code.co_firstlineno <= last or first == 0 for first, last in ranges
        )
        self.decided[id(code)] = (code, traced)
        return traced

    def global_trace(self, frame: FrameType, event: str, _arg: Any) -> Any:
        if event == "call" and self.is_target(frame.f_code):
            return self.local_trace
        return None

    def local_trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            key = (frame.f_code.co_filename, frame.f_lineno)
            self.counts[key] = self.counts.get(key, 0) + 1
            pending = self.pending.pop(id(frame), None)
            if pending is not None:
                self.exceptions[pending]["next_line"] = frame.f_lineno
            names = self.watch.get(key)
            if names:
                self.snapshot(key, frame, names)
        elif event == "exception":
            self.exception(frame, arg)
        elif event == "return":
            self.pending.pop(id(frame), None)
        return self.local_trace

    def snapshot(self, key: tuple[str, int], frame: FrameType, names: list[str]) -> None:
        seen: dict[str, str] = {}
        local, module = frame.f_locals, frame.f_globals
        for name in names:
            head, _, rest = name.partition(".")
            if head in local:
                value = local[head]
            elif head in module:
                value = module[head]
            else:
                continue
            for attribute in rest.split(".") if rest else ():
                value = getattr(value, attribute, None)  # plain attributes only: no call
            if callable(value) or type(value).__name__ == "module":
                continue
            seen[name] = describe_value(value)
        kept = self.values.setdefault(key, {})
        kept.setdefault("first", seen)
        kept["last"] = seen

    def exception(self, frame: FrameType, arg: Any) -> None:
        kind, value, tb = arg
        if issubclass(kind, _IGNORED_EXCEPTIONS) or not issubclass(kind, Exception):
            return  # a loop's end, or the dry run's own stop (a BaseException)
        raised = None
        while tb is not None:
            raised = tb
            tb = tb.tb_next
        where = (
            [raised.tb_frame.f_code.co_filename, raised.tb_lineno, raised.tb_frame.f_code.co_name]
            if raised
            else None
        )
        file, line = frame.f_code.co_filename, frame.f_lineno
        for index, seen in enumerate(self.exceptions):
            if (seen["file"], seen["line"], seen["type"]) == (file, line, kind.__name__):
                seen["count"] += 1
                self.pending[id(frame)] = index
                return
        if len(self.exceptions) >= _MAX_EXCEPTIONS:
            return
        self.exceptions.append(
            {
                "file": file,
                "line": line,
                "function": frame.f_code.co_name,
                "type": kind.__name__,
                "message": str(value)[:200],
                "raised_at": where,
                "count": 1,
                "next_line": None,
            }
        )
        self.pending[id(frame)] = len(self.exceptions) - 1

    # -- the end -----------------------------------------------------------------------

    def save(self, how: str, calls: int) -> None:
        if os.getpid() != self.pid:
            return
        with self.lock:
            payload = {
                "rank": self.rank,
                "how": how,
                "calls": calls,
                "counts": [[f, line, n] for (f, line), n in self.counts.items()],
                "values": [[f, line, v] for (f, line), v in self.values.items()],
                "exceptions": self.exceptions,
            }
            temporary = self.path + ".tmp"
            with open(temporary, "w", encoding="utf-8") as out:
                json.dump(payload, out)
            os.replace(temporary, self.path)
            self.saved = True


def install(recorder: Any, plan_path: str, trace_dir: str) -> None:
    """Trace the plan's functions from here on, and end the rank at its stop: the call
    where the first run parted, written to the trace before the call is made."""
    global _tracer
    with open(plan_path, encoding="utf-8") as source:
        plan = json.load(source)
    tracer = _tracer = LineTracer(plan, recorder.rank, trace_dir)
    if tracer.stop_at is not None:
        write_call = recorder.write_call
        stop_at = tracer.stop_at

        def write_call_then_stop(static: Any) -> None:
            write_call(static)
            if recorder.state.calls >= stop_at:
                sys.settrace(None)
                tracer.save("stopped", recorder.state.calls)
                recorder.exit(End.REPLAY_STOP, 0)
                recorder.close()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)  # before the call: it is the one that would wait for the others

        recorder.write_call = write_call_then_stop
    threading.settrace(tracer.global_trace)
    sys.settrace(tracer.global_trace)


def finish(how: str, calls: int) -> None:
    """Write what the tracer saw, where a rank ends without reaching its stop."""
    if _tracer is not None:
        sys.settrace(None)
        _tracer.save(how, calls)
