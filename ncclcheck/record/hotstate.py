"""What the recorder's hot path reads on every call, kept in one object.

The C fast path (_fastcall.c) reads these fields straight from its ``State`` struct:
with an attribute lookup per field it took 1.1-1.5 us a call alone, 0.7-0.8 us without. Without
the extension (or with NCCLCHECK_PURE_PYTHON=1) the same fields live in a class
with ``__slots__``. recorder.py and tracefile.py read and set them as attributes,
either way.

No torch import here.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

# The _fastcall.c this Python code goes with (its FASTCALL_ABI).
FASTCALL_ABI = 1

fastcall: Any
try:  # built at install where a C compiler is found (hatch_build.py)
    from ncclcheck.record import _fastcall as fastcall  # type: ignore[attr-defined,no-redef]
except ImportError:
    fastcall = None
else:
    if getattr(fastcall, "ABI", None) != FASTCALL_ABI:  # built from another version's source
        warnings.warn(
            "ncclcheck: ncclcheck/record/_fastcall is out of date (reinstall to rebuild it); "
            "the recorder runs in Python",
            stacklevel=1,
        )
        fastcall = None


class _Gone:
    """Stands for no module: the one reference to an instance of it dies at once."""


# No module has told the phase yet: a weak reference that is already dead reads as
# None, as a live one reads as its module (the C fast path reads both without a call).
NO_MODULE: Callable[[], Any] = weakref.ref(_Gone())


class PyState:
    """The fields of _fastcall.State, for the pure Python recorder."""

    __slots__ = (
        "calls",
        "capacity",
        "deferred",
        "end",
        "in_backward",
        "map",
        "mode_module",
        "outermost",
        "phase",
        "position",
        "user_no_grad",
    )
    calls: int
    capacity: int
    deferred: Any
    end: int
    in_backward: int
    map: Any
    mode_module: Callable[[], Any]
    outermost: Any
    phase: str
    position: bytes
    user_no_grad: int


def new_state(in_c: bool) -> Any:
    """A State with its starting values: a C one where ``in_c`` (and the extension is built)."""
    state: Any = fastcall.State() if in_c and fastcall is not None else PyState()
    state.calls = 0  # call lines written
    state.position = b""  # ',"pos":{...}' of the loader batch being processed
    state.phase = "train"  # the phase the last phase line told
    state.deferred = None  # a framework's deferred origin (frameworks.py)
    state.mode_module = NO_MODULE  # the module whose train()/eval() was called last
    state.user_no_grad = 0  # no_grad/inference_mode blocks the user's code has open
    state.in_backward = 0  # autograd runs with grad mode off: that is not evaluation
    state.outermost = None  # the bootstrap's frame: the stack walk stops there
    state.end = 0  # bytes written to the trace
    state.capacity = 0  # bytes the trace's mapping holds
    state.map = None  # the trace's mapping; None once closed or in a forked child
    return state
