"""Where a rank waits for its GPU, and the collective it waits for.

NCCL collectives are asynchronous: ``dist.all_reduce(x)`` enqueues a kernel and
returns, and a rank whose collective has no partner blocks later, at the next
point where the host waits for the device (``loss.item()``, ``.cpu()``,
``torch.cuda.synchronize()``, ``print(tensor)``). Its stack then shows the user's
line of that read and no torch.distributed frame. This module reads such a stack:
which synchronisation point the line holds (``sync_point``), what native frames
say when py-spy ran with ``--native`` (``native_wait``), and, from the source, the
collective enqueued last before it on the rank's path (``enqueued_before``): the
call the rank really waits for, which the diagnosis then reasons about as if the
stack showed it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ncclcheck.communicates import (
    ACCELERATE_METHODS,
    BACKWARD_COLLECTIVE,
    COLLECTIVES,
    DEVICE_SYNC_BUILTINS,
    DEVICE_SYNC_CALL,
    DEVICE_SYNC_METHODS,
    LIBRARY_SYNC_FRAMES,
    LIGHTNING_COLLECTIVES,
    NATIVE_DEVICE_WAITS,
    P2P,
    RECEIVER_METHODS,
)
from ncclcheck.model import Frame
from ncclcheck.source import reading

_TORCH_OPS = frozenset(COLLECTIVES) | frozenset(P2P)
_DIST_RECEIVERS = ("dist", "torch.distributed", "c10d", "distributed")
# how far enqueued_before follows the user's functions into their callees
_CALL_DEPTH = 3


def sync_point(file: str, line: int) -> str | None:
    """The device synchronisation point on ``line`` (``.item()``, ``float()``,
    ``torch.cuda.synchronize()``), or None when the line holds none."""
    # in the order they finish: x.cpu().numpy() waits in .cpu(), print(f"{x.item()}") in .item()
    calls = sorted(_calls_at(file, line), key=lambda c: (c.end_lineno or c.lineno, c.end_col_offset or 0))
    for call in calls:  # a tensor's own read first
        func = call.func
        if isinstance(func, ast.Attribute):
            if func.attr in DEVICE_SYNC_METHODS:
                return DEVICE_SYNC_METHODS[func.attr]
            if func.attr == DEVICE_SYNC_CALL:
                return f"{ast.unparse(func)}()"
    for call in calls:
        func = call.func
        if isinstance(func, ast.Name) and func.id in DEVICE_SYNC_BUILTINS and _reads_a_value(call):
            return f"{func.id}()"
    return None


def sync_point_in(code: str) -> str | None:
    """The device synchronisation point in one line of source as a dump printed it, where
    the file itself is not on this host; None when the line holds none or does not parse
    alone (the first line of a call that goes on)."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    calls = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda c: c.end_col_offset or 0
    )
    for call in calls:
        if isinstance(call.func, ast.Attribute) and call.func.attr in DEVICE_SYNC_METHODS:
            return DEVICE_SYNC_METHODS[call.func.attr]
        if isinstance(call.func, ast.Attribute) and call.func.attr == DEVICE_SYNC_CALL:
            return f"{ast.unparse(call.func)}()"
    return None


def _reads_a_value(call: ast.Call) -> bool:
    """``float(loss)``, ``print(f"{loss}")``: an argument that may be a tensor (a name,
    attribute, subscript, arithmetic, or a formatted value), not ``float(len(x))``."""
    for arg in call.args:
        for node in ast.walk(arg):
            if isinstance(node, ast.FormattedValue):
                node = node.value
            if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.BinOp)):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
                return False
    return False


def sync_in_frames(frames: list[Frame]) -> str | None:
    """A device synchronisation point that the frames themselves show: torch.cuda's own
    ``synchronize`` (``torch.cuda.synchronize()``, ``Stream.synchronize()``,
    ``Event.synchronize()``) among the library frames inside the user's code, as a
    library calls it after its asynchronous collectives (ZeRO-3's prefetch)."""
    python = next((f for f in frames if f.file.endswith(".py")), None)
    if python is not None:
        # the innermost Python frame a library's own value read (GradScaler.step's found_inf)
        path, function = python.file.replace("\\", "/"), python.function.rsplit(".", 1)[-1]
        if function == "<genexpr>":
            function = next(
                (f.function for f in frames if f.file == python.file and f.function != function), ""
            )
        for (known, name), said in LIBRARY_SYNC_FRAMES.items():
            if path.endswith(known) and function.rsplit(".", 1)[-1] == name:
                return said
    for frame in frames:  # innermost first
        path = frame.file.replace("\\", "/")
        if "torch/cuda/" in path and frame.function.rsplit(".", 1)[-1] == DEVICE_SYNC_CALL:
            if path.endswith("/streams.py"):
                return "a CUDA stream's or event's synchronize()"
            return "torch.cuda.synchronize()"
    return None


def native_wait(functions: list[str]) -> str | None:
    """The native frame that shows a host thread waiting for the device or in NCCL."""
    for function in functions:
        for known in NATIVE_DEVICE_WAITS:
            if known in function:
                return known
    return None


@dataclass(frozen=True)
class Enqueued:
    """The collective a rank enqueued last before the synchronisation point it waits at."""

    op: str  # the torch op, for the rules: all_reduce, all_gather, ...
    what: str  # as said to the user: "all_reduce", BACKWARD_COLLECTIVE, "accelerator.gather"
    frames: list[Frame]  # the user's frames outermost first, the last at the collective's line


def enqueued_before(frames: list[Frame]) -> Enqueued | None:
    """The collective the source enqueues last before the innermost of ``frames`` (the
    user's frames, outermost first): earlier in that function, then, in a loop, later
    in its body (an earlier pass), then before the call in each caller. A call of the
    user's own function that communicates is followed into it."""
    innermost = len(frames) - 1
    for depth in range(innermost, -1, -1):
        frame = frames[depth]
        for index, statement in enumerate(_statements_before(frame.file, frame.line)):
            if index == 0 and depth < innermost:
                continue  # a caller's own line: the call in progress, searched above
            # a statement after the line ran on a loop's earlier pass: all of it counts
            limit = frame.line if statement.lineno <= frame.line else statement.end_lineno or statement.lineno
            found = _last_collective(frame.file, statement, limit, _CALL_DEPTH)
            if found is not None:
                op, what, inner = found
                return Enqueued(op, what, [*frames[:depth], *inner])
    return None


def last_collective_in(path: str, loop: ast.For | ast.AsyncFor | ast.While) -> Enqueued | None:
    """The last collective a pass of ``loop`` (in ``frame``'s function) issues."""
    for statement in reversed(loop.body):
        found = _last_collective(path, statement, statement.end_lineno or statement.lineno, _CALL_DEPTH)
        if found is not None:
            return Enqueued(found[0], found[1], found[2])
    return None


def _statements_before(path: str, line: int) -> Iterator[ast.stmt]:
    """The statements of ``line``'s function in reverse order of execution, from the one
    holding ``line`` (its calls before ``line`` count: ``mean(x).item()``) back to the
    function's first; then the rest of each enclosing loop's body, ran on the pass before."""
    chain = reading.enclosing_chain(path, line)
    functions = [i for i, n in enumerate(chain) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scope = functions[-1] if functions else -1
    inside = chain[scope + 1 :]
    tree = reading.parse(path)
    if not inside or tree is None or not isinstance(inside[-1], ast.stmt):
        return
    yield inside[-1]
    loops: list[tuple[ast.stmt, list[ast.stmt]]] = []
    for depth in range(len(inside) - 1, -1, -1):
        node = inside[depth]
        parent = inside[depth - 1] if depth > 0 else (chain[scope] if scope >= 0 else tree)
        for block in reading.blocks(parent):
            if any(child is node for child in block):
                index = next(i for i, child in enumerate(block) if child is node)
                yield from reversed(block[:index])
                if isinstance(parent, (ast.For, ast.While, ast.AsyncFor)) and block is parent.body:
                    loops.append((parent, block[index + 1 :]))
    for _loop, rest in loops:
        yield from reversed(rest)


def _last_collective(
    path: str, statement: ast.stmt, before_line: int, depth: int
) -> tuple[str, str, list[Frame]] | None:
    """The last collective ``statement`` issues before ``before_line`` (on that line:
    the calls that end before the synchronising one), with the frames down to it."""
    calls = sorted(
        (n for n in ast.walk(statement) if isinstance(n, ast.Call)),
        key=lambda c: (c.end_lineno or c.lineno, c.end_col_offset or 0),
        reverse=True,
    )
    for call in calls:
        if call.lineno > before_line:
            continue
        if call.lineno == before_line and sync_point_of(call):
            continue
        function = _function_name(path, call.lineno)
        site = Frame(path, call.lineno, function)
        named = _collective_call(call)
        if named is not None:
            return named[0], named[1], [site]
        if depth > 0:
            callee = _callee_def(path, call)
            if callee is not None:
                inner = _last_in_function(path, callee, depth - 1)
                if inner is not None:
                    return inner[0], inner[1], [site, *inner[2]]
    return None


def sync_point_of(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr in DEVICE_SYNC_METHODS or func.attr == DEVICE_SYNC_CALL
    return isinstance(func, ast.Name) and func.id in DEVICE_SYNC_BUILTINS


def _last_in_function(
    path: str, function: ast.FunctionDef | ast.AsyncFunctionDef, depth: int
) -> tuple[str, str, list[Frame]] | None:
    end = function.end_lineno or function.lineno
    for statement in reversed(function.body):
        found = _last_collective(path, statement, end, depth)
        if found is not None:
            return found
    return None


def _collective_call(call: ast.Call) -> tuple[str, str] | None:
    """(op, what) for a call that enqueues a collective."""
    func = call.func
    if isinstance(func, ast.Name) and func.id in _TORCH_OPS:
        return func.id, func.id
    if not isinstance(func, ast.Attribute):
        return None
    receiver = ast.unparse(func.value)
    if func.attr in _TORCH_OPS and receiver.endswith(_DIST_RECEIVERS):
        return func.attr, func.attr
    lowered = receiver.lower()
    if "accelerator" in lowered and func.attr in ACCELERATE_METHODS:
        return "all_gather", f"{receiver}.{func.attr}()"
    if "fabric" in lowered and func.attr in LIGHTNING_COLLECTIVES:
        return func.attr, f"{receiver}.{func.attr}()"
    for (word, method), what in RECEIVER_METHODS.items():
        if func.attr == method and word in lowered:
            return ("barrier" if method == "barrier" else "all_reduce"), f"{receiver}.{method}() ({what})"
    if func.attr == "backward" and not call.args[1:]:
        return "all_reduce", BACKWARD_COLLECTIVE
    return None


def _function_name(path: str, line: int) -> str:
    function = reading.enclosing_function(path, line)
    return function.name if function is not None else "<module>"


def _callee_def(path: str, call: ast.Call) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The user's function ``call`` calls, when the same file defines it: a module-level
    function by name, or ``self.method`` of the class around the call."""
    tree = reading.parse(path)
    if tree is None:
        return None
    func = call.func
    if isinstance(func, ast.Name):
        return _defined(tree.body, func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        for node in reversed(reading.enclosing_chain(path, call.lineno)):
            if isinstance(node, ast.ClassDef):
                return _defined(node.body, func.attr)
    return None


def _defined(body: list[ast.stmt], name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _calls_at(file: str, line: int) -> list[ast.Call]:
    if not Path(file).is_file():
        return []
    chain = reading.enclosing_chain(file, line)
    if not chain:
        return []
    statement = chain[-1]
    if isinstance(statement, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
        # the header only: `for x in loader:` reads nothing on the line of its body
        statement = getattr(statement, "test", None) or getattr(statement, "iter", None) or statement
    return [
        n
        for n in ast.walk(statement)
        if isinstance(n, ast.Call) and n.lineno <= line <= (n.end_lineno or n.lineno)
    ]
