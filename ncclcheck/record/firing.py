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

The main script is compiled through runpy's own reader, imported modules through their
loader's ``get_code``; files not listed are compiled as always. Lines and file names
are kept, so stacks and sites read the same.
"""

from __future__ import annotations

import ast
import builtins
import importlib.machinery
import json
import os
import runpy
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

ENV_FIRE = "NCCLCHECK_FIRE"  # JSON: [[file, line of the if], ...]
_HELPER = "__ncclcheck_fire__"


class Firing:
    """Which periodic parts have fired; ``note(file, line, function, forced)`` is told each
    first one (``forced``: its own value was false)."""

    def __init__(self, actions: list[tuple[str, int]], note: Callable[[str, int, str, bool], None]) -> None:
        self.lines: dict[str, set[int]] = {}
        for file, line in actions:
            self.lines.setdefault(os.path.realpath(file), set()).add(line)
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
        wanted = self.lines.get(os.path.realpath(path))
        if not wanted:
            return None
        tree = ast.parse(source, filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.lineno in wanted:
                node.test = self._wrapped(node.test, path, node.lineno)
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


def install(note: Callable[[str, int, str, bool], None]) -> Firing | None:
    """Compile the listed files with their tests wrapped, from here on; None when the run
    lists none."""
    raw = os.environ.get(ENV_FIRE)
    if not raw:
        return None
    firing = Firing([(str(f), int(n)) for f, n in json.loads(raw)], note)
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
        if os.path.realpath(path) in firing.lines:
            code = firing.compile(self.get_data(path), path)
            if code is not None:
                return code
        return original_get_code(self, fullname)

    loader.get_code = get_code  # type: ignore[method-assign,assignment]
    return firing
