"""Periodic actions fire in a dry run: ``if step % 1000 == 0: save()`` runs its body once
within the budget of a few steps, so that what it does (a checkpoint's barrier, an
evaluation's all_reduce, a rank-0-only log that gathers) is checked like any other step.

preflight lists the periodic actions of the script and its local modules before the
run (lint/periodic.actions_to_fire) and passes them in ``NCCLCHECK_FIRE``. Each rank
compiles those files itself, the periodic part of each listed test wrapped
(``rank == 0 and step % 1000 == 0`` becomes ``rank == 0 and __ncclcheck_fire__(k,
step % 1000 == 0)``): the first time the wrapped part is evaluated it is true, whatever
its value, and from then on its own value. Only the periodic part is forced; the rest of
the test is the script's, so a rank test around it still keeps the other ranks out, as
it would at step 1000. Every rank evaluates the part at the same pass of its loop where
the ranks step together, so they fire together, and the script's own counters are left
as they are: a checkpoint saved this way is named after the step the dry run was at.

The same compile watches the decisions lint reads as taken on a rank's own value
(lint/decisions.py), listed in ``NCCLCHECK_DECISIONS``: the whole test of each listed
``if`` or ``while`` is wrapped (``if stopper.should_stop(loss.item()):`` becomes ``if
__ncclcheck_decide__(k, stopper.should_stop(loss.item())):``), and the first time each
side is taken is noted, so the report can say which side each rank took in the run. A
second run names one decision and one rank to force: there the test's first value on
that rank is turned to the other side (once; every other rank, and that rank after,
keep their own), which is what the real run does when one rank's loss, clock or batch
goes its own way.

The main script is compiled through runpy's own reader, imported modules through their
loader's ``get_code``; files not listed are compiled as always. Lines and file names
are kept, so stacks and sites read the same.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.machinery
import json
import math
import os
import runpy
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

ENV_FIRE = "NCCLCHECK_FIRE"  # JSON: [[file, line of the if], ...]
# JSON: {"watch": [[file, line of the if or while], ...], "force": [file, line, rank] or null}
ENV_DECISIONS = "NCCLCHECK_DECISIONS"
_HELPER = "__ncclcheck_fire__"
_DECIDE = "__ncclcheck_decide__"
_READ = "__ncclcheck_read__"
_CAUGHT = "__ncclcheck_caught__"
_THROW = "__ncclcheck_throw__"


# what a watched test read is digested over its first evaluations, and noted after these
# counts: every rank at the same count compares alike or not
READ_NOTED_AT = (1, 2, 4, 8, 16, 32)


class Decisions:
    """The watched decisions: which sides each has taken on this rank, what its test read,
    and the one to force here, if any. ``note(file, line, function, taken, forced)`` is told
    the first time each side is taken (``forced``: the value was turned); ``note_read(file,
    line, n, digest, informative)`` a digest of what the test read over its first ``n``
    evaluations, at each count of READ_NOTED_AT (``informative``: a value read was a
    fraction, which two ranks share by chance about never). Ranks whose tests read the same
    values decide on a value they share (synchronised, or seeded alike): turning it on one
    rank alone would be a state the real run never reaches."""

    def __init__(
        self,
        watched: list[tuple[str, int]],
        force: tuple[str, int] | None,
        note: Callable[[str, int, str, bool, bool], None],
        handlers_in: list[str] | None = None,
        note_caught: Callable[[str, int, str, str, tuple[str, int, str] | None], None] | None = None,
        note_read: Callable[[str, int, int, str, bool], None] | None = None,
    ) -> None:
        self.lines: dict[str, set[int]] = {}
        for file, line in watched:
            self.lines.setdefault(os.path.realpath(file), set()).add(line)
        self.force = (os.path.realpath(force[0]), force[1]) if force else None
        self.keys: list[tuple[str, int]] = []  # key -> (file, line of the test)
        self.seen: set[tuple[int, bool]] = set()
        self.reading: dict[int, list[str]] = {}  # key -> what the evaluation under way has read
        self.evaluations: dict[int, int] = {}
        self.digests: dict[int, str] = {}
        self.informative: set[int] = set()
        self.forced = False
        self.note = note
        self.note_read = note_read
        # files whose except handlers note the first error each catches
        self.handler_files = {os.path.realpath(file) for file in handlers_in or []}
        self.handlers: list[tuple[str, int]] = []  # key -> (file, line of the except)
        self.caught_once: set[int] = set()
        self.note_caught = note_caught

    def read(self, key: int, value: Any) -> Any:
        """A value the test at ``key`` reads (a name, an attribute, a call's result), noted
        over its first evaluations; returned as it is."""
        if self.evaluations.get(key, 0) < READ_NOTED_AT[-1]:
            self.reading.setdefault(key, []).append(_digest(value))
            if key not in self.informative and _fraction(value):
                self.informative.add(key)
        return value

    def decide(self, key: int, value: Any) -> bool:
        taken = bool(value)
        count = self.evaluations.get(key, 0) + 1
        file, line = self.keys[key]
        if count <= READ_NOTED_AT[-1]:
            self.evaluations[key] = count
            joined = "\x1f".join([self.digests.get(key, ""), *self.reading.pop(key, [])])
            self.digests[key] = hashlib.sha1(joined.encode()).hexdigest()[:16]
            if count in READ_NOTED_AT and self.note_read is not None:
                self.note_read(file, line, count, self.digests[key], key in self.informative)
        forced = False
        if self.force == self.keys[key]:
            # turned at every test from the first on, not once: a skip that is harmless at its
            # first test (a `continue` in a micro-batch under no_sync) may not be at a later one
            # (the micro-batch that synchronises the gradients)
            forced = not self.forced
            self.forced = True
            taken = not taken
        if forced or (key, taken) not in self.seen:
            self.seen.add((key, taken))
            self.note(file, line, sys._getframe(1).f_code.co_name, taken, forced)
        return taken

    def caught(self, key: int) -> None:
        """The handler at ``key`` caught the error being handled: noted the first time, with
        where it was raised (the innermost frame in the watched files, else the innermost)."""
        if key in self.caught_once or self.note_caught is None:
            return
        self.caught_once.add(key)
        error = sys.exc_info()[1]
        if error is None:
            return
        raised: tuple[str, int, str] | None = None
        traceback = error.__traceback__
        while traceback is not None:
            code = traceback.tb_frame.f_code
            where = (code.co_filename, traceback.tb_lineno, code.co_name)
            if raised is None or os.path.realpath(code.co_filename) in self.handler_files:
                raised = where
            traceback = traceback.tb_next
        file, line = self.handlers[key]
        text = f"{type(error).__name__}: {error}"[:300]
        self.note_caught(file, line, sys._getframe(1).f_code.co_name, text, raised)

    def note_handlers(self, tree: ast.Module, path: str) -> None:
        """Each except handler of ``tree`` starts by noting what it caught; the one to force
        here gets its try's body started by raising what it catches, once (``throw``)."""
        real = os.path.realpath(path)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            for handler in node.handlers:
                self.handlers.append((real, handler.lineno))
                key = len(self.handlers) - 1
                call = ast.Call(ast.Name(_CAUGHT, ast.Load()), [ast.Constant(key)], [])
                note = ast.copy_location(ast.Expr(ast.copy_location(call, handler)), handler)
                handler.body.insert(0, note)
                if self.force == (real, handler.lineno) and node.body:
                    # the first type it catches (a tuple's first), Exception for a bare except
                    caught = handler.type.elts[0] if isinstance(handler.type, ast.Tuple) else handler.type
                    kind = caught if caught is not None else ast.Name("Exception", ast.Load())
                    first = node.body[0]
                    throw = ast.Call(ast.Name(_THROW, ast.Load()), [ast.Constant(key), kind], [])
                    node.body.insert(0, ast.copy_location(ast.Expr(ast.copy_location(throw, first)), first))
                    for inner in ast.walk(node.body[0]):
                        ast.copy_location(inner, first)

    def throw(self, key: int, kind: Any) -> None:
        """Raise an error of ``kind`` at the start of the forced handler's try, the first
        time only: what the rank does when that error comes to it alone. Noted as the
        handler's forced side."""
        if self.forced:
            return
        self.forced = True
        file, line = self.handlers[key]
        self.note(file, line, sys._getframe(1).f_code.co_name, True, True)
        message = "raised by ncclcheck preflight: this handler forced on this rank"
        try:
            error = kind(message)
        except Exception:  # an error class that takes other arguments
            error = kind.__new__(kind)
        raise error

    def wrap(self, test: ast.expr, path: str, line: int) -> ast.expr:
        self.keys.append((os.path.realpath(path), line))
        key = len(self.keys) - 1

        class Reads(ast.NodeTransformer):
            """Each value the test reads, wrapped to be noted; a called function itself is not
            a value (``stopper.should_stop`` in ``stopper.should_stop(loss)``)."""

            def visit_Call(self, node: ast.Call) -> ast.AST:
                node.args = [self.visit(arg) for arg in node.args]
                for keyword in node.keywords:
                    keyword.value = self.visit(keyword.value)
                if isinstance(node.func, ast.Attribute):
                    node.func.value = self.visit(node.func.value)
                return _call(_READ, key, node)

            def visit_Name(self, node: ast.Name) -> ast.AST:
                return _call(_READ, key, node) if isinstance(node.ctx, ast.Load) else node

            def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
                return _call(_READ, key, node) if isinstance(node.ctx, ast.Load) else node

            def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
                return _call(_READ, key, node) if isinstance(node.ctx, ast.Load) else node

            def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
                return node  # its body runs later, if at all

            def visit_NamedExpr(self, node: ast.NamedExpr) -> ast.AST:
                node.value = self.visit(node.value)
                return node

        read = Reads().visit(test)
        assert isinstance(read, ast.expr)
        return _call(_DECIDE, key, read)


def _call(helper: str, key: int, node: ast.expr) -> ast.expr:
    call = ast.Call(ast.Name(helper, ast.Load()), [ast.Constant(key), node], [])
    return ast.copy_location(call, node)


def _fraction(value: Any) -> bool:
    """A float, or a small floating tensor, with a fractional part."""
    if isinstance(value, float):
        return math.isfinite(value) and not value.is_integer()
    if type(value).__module__.startswith("torch") and callable(getattr(value, "is_floating_point", None)):
        try:
            if value.is_floating_point() and value.numel() <= 4096:
                return bool(((value - value.trunc()) != 0).any())
        except Exception:  # a meta or fake tensor has no values to read
            return False
    return False


def _digest(value: Any) -> str:
    """What a value is, as far as two ranks could share it: numbers, strings and small
    tensors by value, anything else by its type (an object is not a value two ranks read)."""
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return repr(value)
    if isinstance(value, tuple | list) and len(value) <= 64:
        return "[" + ",".join(_digest(item) for item in value) + "]"
    numel = getattr(value, "numel", None)
    if callable(numel) and type(value).__module__.startswith("torch"):
        try:
            if numel() <= 4096:
                return f"tensor{tuple(value.shape)}:{value.detach().cpu().flatten().tolist()!r}"
            return f"tensor{tuple(value.shape)}"
        except Exception:  # a meta or fake tensor has no values to read
            return f"tensor{tuple(getattr(value, 'shape', ()))}"
    return type(value).__qualname__


class Firing:
    """Which periodic parts have fired; ``note(file, line, function, forced)`` is told each
    first one (``forced``: its own value was false)."""

    def __init__(
        self,
        actions: list[tuple[str, int]],
        note: Callable[[str, int, str, bool], None],
        decisions: Decisions | None = None,
    ) -> None:
        self.lines: dict[str, set[int]] = {}
        for file, line in actions:
            self.lines.setdefault(os.path.realpath(file), set()).add(line)
        self.decisions = decisions
        self.keys: list[tuple[str, int]] = []  # key -> (file, line of the if)
        self.fired: set[int] = set()
        self.note = note

    def fire(self, key: int, value: Any) -> Any:
        if key in self.fired:
            return value
        self.fired.add(key)
        file, line = self.keys[key]
        self.note(file, line, sys._getframe(1).f_code.co_name, not value)
        return value if value else True

    def compile(self, source: str | bytes, path: str) -> CodeType | None:
        """The module's code with its listed tests wrapped; None when it lists none."""
        real = os.path.realpath(path)
        wanted = self.lines.get(real, set())
        decided = self.decisions.lines.get(real, set()) if self.decisions else set()
        handlers = self.decisions is not None and real in self.decisions.handler_files
        if not wanted and not decided and not handlers:
            return None
        tree = ast.parse(source, filename=path)
        if handlers and self.decisions is not None:
            self.decisions.note_handlers(tree, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.lineno in wanted:
                node.test = self._wrapped(node.test, path, node.lineno)
            if self.decisions and isinstance(node, ast.If | ast.While) and node.lineno in decided:
                node.test = self.decisions.wrap(node.test, path, node.lineno)
        return compile(ast.fix_missing_locations(tree), path, "exec", dont_inherit=True)

    def _wrapped(self, test: ast.expr, path: str, line: int) -> ast.expr:
        # lint's reading of a periodic test, imported only where a run lists actions
        from ncclcheck.lint.periodic import periodic_parts

        parts = {id(part) for part in periodic_parts(test)}
        firing = self

        class Wrap(ast.NodeTransformer):
            def visit(self, node: ast.AST) -> ast.AST:
                if id(node) in parts:
                    firing.keys.append((path, line))
                    call = ast.Call(
                        ast.Name(_HELPER, ast.Load()),
                        [ast.Constant(len(firing.keys) - 1), node],  # type: ignore[list-item]
                        [],
                    )
                    return ast.copy_location(call, node)
                return self.generic_visit(node)

        wrapped = Wrap().visit(test)
        assert isinstance(wrapped, ast.expr)
        return wrapped


def install(
    note: Callable[[str, int, str, bool], None],
    note_decision: Callable[[str, int, str, bool, bool], None],
    rank: int,
    note_caught: Callable[[str, int, str, str, tuple[str, int, str] | None], None] | None = None,
    note_read: Callable[[str, int, int, str, bool], None] | None = None,
) -> Firing | None:
    """Compile the listed files with their tests wrapped, from here on; None when the run
    lists none."""
    raw_fire, raw_decisions = os.environ.get(ENV_FIRE), os.environ.get(ENV_DECISIONS)
    if not raw_fire and not raw_decisions:
        return None
    decisions = None
    if raw_decisions:
        listed = json.loads(raw_decisions)
        force = listed.get("force")
        decisions = Decisions(
            [(str(f), int(n)) for f, n in listed.get("watch", [])],
            (str(force[0]), int(force[1])) if force and int(force[2]) == rank else None,
            note_decision,
            [str(f) for f in listed.get("handlers_in", [])],
            note_caught,
            note_read,
        )
        setattr(builtins, _DECIDE, decisions.decide)
        setattr(builtins, _READ, decisions.read)
        setattr(builtins, _CAUGHT, decisions.caught)
        setattr(builtins, _THROW, decisions.throw)
    firing = Firing([(str(f), int(n)) for f, n in json.loads(raw_fire or "[]")], note, decisions)
    setattr(builtins, _HELPER, firing.fire)

    # the main script: runpy reads it with _get_code_from_file ((run_name, fname) -> (code,
    # fname) before Python 3.12, (fname) -> code since)
    original_main = runpy._get_code_from_file  # type: ignore[attr-defined]

    def main_code(*args: Any) -> Any:
        fname = args[-1]
        if isinstance(fname, str | os.PathLike) and os.path.isfile(fname):
            with open(fname, "rb") as handle:
                code = firing.compile(handle.read(), os.fspath(fname))
            if code is not None:
                return (code, fname) if len(args) == 2 else code
        return original_main(*args)

    runpy._get_code_from_file = main_code  # type: ignore[attr-defined]

    # imported modules: a source loader's code, never from a cached .pyc for these files
    loader = importlib.machinery.SourceFileLoader
    original_get_code = loader.get_code

    def get_code(self: importlib.machinery.SourceFileLoader, fullname: str) -> CodeType | None:
        path = self.get_filename(fullname)
        real = os.path.realpath(path)
        if real in firing.lines or (
            decisions is not None and (real in decisions.lines or real in decisions.handler_files)
        ):
            code = firing.compile(self.get_data(path), path)
            if code is not None:
                return code
        return original_get_code(self, fullname)

    loader.get_code = get_code  # type: ignore[method-assign,assignment]
    return firing
