"""Reads of ``dist.reduce``'s result on a rank that does not receive it.

``dist.reduce(tensor, dst)`` leaves the reduced value on rank ``dst`` only; on the
other ranks the tensor holds what the backend left there (their own value, or a
partial sum). A script that reads it on every rank (``loss.item()`` after a reduce
to rank 0, to log it or to decide whether to stop: pytorch/pytorch#77562) computes
from a value no other rank shares; a decision taken on it hangs the job the day the
ranks decide differently, which a dry run on similar data rarely shows.

So, on the ranks that are not ``dst``, the recorder marks the tensor a reduce was
given (and only then patches the Tensor methods below: a script that never reduces
keeps torch's own), and the first read of a marked tensor from the user's code at each line
(``item()``, ``float()``, ``int()``, ``bool()``, ``tolist()``, a comparison) is
written to the trace::

    {"t": "rooted_read", "how": ".item()", "site": [file, line, function],
     "stack": [[file, line, function], ...] (outermost first), "var": "epoch_loss", "phase": "train",
     "reduce": {"site": [file, line, function], "dst": 0}, "time": ...}

A value computed from a marked tensor by its own methods or operators (``loss /
world``, ``loss.mean()``, ``loss.detach().cpu()``) is marked in turn; one computed
by a torch function (``torch.div(loss, world)``) is not. An ``all_reduce`` or
``broadcast`` of a tensor gives it a common value again and clears its mark.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Any

from ncclcheck.frames import (
    first_user_frame,
    is_user_code,
    past_own_wrappers,
    patched_method,
    user_frames,
)
from ncclcheck.record.recorder import Recorder

# What turns a tensor into a Python value a branch can test.
_READS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "__float__": "float()",
    "__int__": "int()",
    "__bool__": "bool()",
    "__lt__": "a comparison (<)",
    "__le__": "a comparison (<=)",
    "__gt__": "a comparison (>)",
    "__ge__": "a comparison (>=)",
}


# What computes a new tensor from one: its result is as partial as its operand.
_CARRIED_BY = (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__neg__",
    "__getitem__",
    "div",
    "mul",
    "add",
    "sub",
    "mean",
    "sum",
    "detach",
    "clone",
    "cpu",
    "float",
    "double",
    "to",
    "squeeze",
    "view",
    "reshape",
)


@dataclass(frozen=True)
class RootedMark:
    site: tuple[str, int, str]  # the user's line that called dist.reduce
    dst: int  # the global rank that received the result
    alive: weakref.ref[Any]  # the tensor: its id is the key, and ids are reused once it is gone


def install(recorder: Recorder) -> None:
    """Follow dist.reduce and the reads of its result. Before the recorder wraps the
    collectives: it then wraps this reduce, and records the user's frame as its caller."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original_reduce = c10d.reduce
    try:
        signature: inspect.Signature | None = inspect.signature(original_reduce)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original_reduce)
    def reduce(*args: Any, **kwargs: Any) -> Any:
        result = original_reduce(*args, **kwargs)
        if signature is not None:
            try:
                bound = signature.bind(*args, **kwargs)
                _mark_if_not_dst(recorder, dist, bound.arguments, sys._getframe(1))
            except Exception:  # never fail the user's reduce over what it is told
                pass
        return result

    for module in (dist, c10d):
        if getattr(module, "reduce", None) is original_reduce:
            module.reduce = reduce


def _watch_reads(recorder: Recorder) -> None:
    """Patch the Tensor methods that read a value out, once a rank holds a marked tensor:
    a script that never reduces to another rank keeps torch's own methods (torch.compile
    traces them)."""
    import torch

    recorder.watching_rooted_reads = True
    for name, how in _READS.items():
        original = getattr(torch.Tensor, name, None)
        if original is not None:
            setattr(torch.Tensor, name, _watched(recorder.rooted, recorder, original, how))
    for name in _CARRIED_BY:
        original = getattr(torch.Tensor, name, None)
        if original is not None:
            setattr(torch.Tensor, name, _carried(recorder.rooted, original, torch.Tensor))


def _mark_if_not_dst(recorder: Recorder, dist: Any, arguments: dict[str, Any], caller: Any) -> None:
    tensor = arguments.get("tensor")
    group = arguments.get("group")
    group_dst = arguments.get("group_dst")
    dst = arguments.get("dst")
    if group_dst is not None:
        dst = dist.get_global_rank(group, group_dst) if group is not None else group_dst
    if dst is None or tensor is None or dist.get_rank() == dst:
        return
    frame = first_user_frame(caller)
    site = ("?", 0, "?")
    if frame is not None:
        site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    if not recorder.watching_rooted_reads:
        _watch_reads(recorder)
    _mark(recorder.rooted, tensor, site, int(dst))


def _mark(marks: dict[int, RootedMark], tensor: Any, site: tuple[str, int, str], dst: int) -> None:
    key = id(tensor)
    marks[key] = RootedMark(site, dst, weakref.ref(tensor, lambda _gone: marks.pop(key, None)))


def _mark_of(marks: dict[int, RootedMark], value: Any) -> RootedMark | None:
    mark = marks.get(id(value))
    return mark if mark is not None and mark.alive() is value else None


def _carried(marks: dict[int, RootedMark], original: Any, tensor_type: type) -> Any:
    """``original`` marking its result as its marked operand was: ``loss / world``
    after ``dist.reduce(loss, 0)`` is as partial on the other ranks as ``loss``."""

    @patched_method
    def carry(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if marks and isinstance(result, tensor_type):
            mark = _mark_of(marks, self) or next(
                (m for a in args if (m := _mark_of(marks, a)) is not None), None
            )
            if mark is not None:
                _mark(marks, result, mark.site, mark.dst)
        return result

    carry.__name__ = getattr(original, "__name__", "carry")
    return carry


def _watched(marks: dict[int, RootedMark], recorder: Recorder, original: Any, how: str) -> Any:
    @patched_method
    def read(self: Any, *args: Any) -> Any:
        if marks:  # a plain dict: nothing but this test until a script reduces to a dst
            mark = _mark_of(marks, self)
            if mark is not None:
                _note_read(recorder, mark, how, self)
        return original(self, *args)

    read.__name__ = getattr(original, "__name__", "read")
    return read


def _note_read(recorder: Recorder, mark: RootedMark, how: str, tensor: Any) -> None:
    # The user's frame that read it, past ncclcheck's own wrappers (--perturb's item()).
    frame: Any = past_own_wrappers(sys._getframe(2))
    if frame is None or not is_user_code(frame.f_code):
        return  # a library read it (a logger, a metric): the user's line is what to fix
    site = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    if not recorder.first_time(("rooted_read", site, mark.site)):
        return
    var = next(
        (name for name, value in frame.f_locals.items() if value is tensor and not name.startswith("_")),
        None,
    )
    recorder.write(
        {
            "t": "rooted_read",
            "how": how,
            "site": list(site),
            "stack": [list(f) for f in reversed(user_frames(frame))],
            "var": var,
            "phase": recorder.phase,
            "reduce": {"site": list(mark.site), "dst": mark.dst},
            "time": time.time(),
        }
    )
