"""How each kind of statement is checked: one visitor per kind, and the table that
picks it. A statement of another kind is checked for the calls it makes.

A visitor reads and extends the checker's state (the guards over it, the loop it is
in, the exits pending); the checker itself walks blocks and reports.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any, Protocol

from ncclcheck.causes import Cause
from ncclcheck.lint.findings import CAUGHT, Collective, Guard
from ncclcheck.lint.rank_sets import negates
from ncclcheck.lint.syntax import clean_exit, is_exit_call
from ncclcheck.source.reading import RANK, kind_of


class Checker(Protocol):
    """What a visitor reads and extends of the checker of one scope (lint/scope.py)."""

    derived: set[str]
    complementary: set[int]  # ifs balanced by a sibling with the negated test
    pending_exits: list[tuple[Guard, ast.stmt, ast.stmt | None]]

    def block(
        self, statements: list[ast.stmt], guards: list[Guard], loop: ast.stmt | None = None
    ) -> None: ...
    def calls_here(self, node: ast.AST, guards: list[Guard]) -> None: ...
    def kind(self, test: ast.expr, branches: list[ast.stmt]) -> str: ...
    def branches_differ(self, node: ast.If) -> bool: ...
    def collectives(self, statements: list[ast.stmt]) -> list[tuple[ast.expr, Collective]]: ...
    def check_ordered_loop(self, loop: ast.For | ast.AsyncFor) -> None: ...
    def check_while_test(self, loop: ast.While) -> None: ...
    def report_exit(
        self, guard: Guard, exit_node: ast.stmt, call: ast.expr | ast.stmt, collective: Collective
    ) -> None: ...
    def add(
        self,
        cause: Cause,
        severity: str,
        call: ast.expr | ast.stmt,
        message: str,
        collective: Collective,
        guard: Guard | None = None,
    ) -> None: ...


def is_exit(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Raise)) or is_exit_call(node)


def visit_exit(c: Checker, node: ast.stmt, guards: list[Guard], loop: ast.stmt | None) -> None:
    """A return, break, continue, raise or sys.exit: what it skips is reported where the
    loop or function it leaves is checked."""
    c.calls_here(node, guards)  # `return helper(x)`: the value runs before the exit
    # A raise (or a non-zero exit) fails the rank, and torchrun stops the others:
    # a crash (rank-crashed), not a silent wait. A clean sys.exit() leaves them waiting.
    if isinstance(node, ast.Raise) or (is_exit_call(node) and not clean_exit(node)):
        return
    # the test right above the exit decides it (an outer rank test around an inner
    # `if not isinstance(state, Tensor): return` does not make that return rank-driven)
    if guards and guards[-1].kind != "other":
        c.pending_exits.append((guards[-1], node, loop))


def visit_if(c: Checker, node: ast.If, guards: list[Guard], loop: ast.stmt | None) -> None:
    """An if: each branch is checked under the guard its test makes."""
    c.calls_here(node.test, guards)
    kind = c.kind(node.test, [*node.body, *node.orelse])
    balanced = kind == "other" or id(node) in c.complementary or not c.branches_differ(node)
    peer = (
        isinstance(node.test, ast.Compare)
        and kind == RANK
        and all(kind_of(side, c.derived) == RANK for side in [node.test.left, *node.test.comparators])
    )
    guard = Guard(kind, node.lineno, ast.unparse(node.test), balanced, peer, node.test)
    # An exit in one branch does not skip what the other branch runs: each branch
    # starts from the exits seen before the if; both sets apply after it.
    exits_before = list(c.pending_exits)
    c.block(node.body, [*guards, guard], loop)
    from_body = c.pending_exits[len(exits_before) :]
    c.pending_exits = list(exits_before)
    if _elif_decides_alone(node, c.derived):
        guard = Guard("other", node.lineno, guard.text, True, False, node.test)
    c.block(node.orelse, [*guards, guard], loop)
    c.pending_exits += from_body


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [part for value in test.values for part in _conjuncts(value)]
    return [test]


def _elif_decides_alone(node: ast.If, derived: set[str]) -> bool:
    """``if not in_order and is_main: ... elif in_order: wait()``: the elif's test denies a
    part of the if's that names no rank, so wherever the elif holds the if was false on
    every rank, whatever its rank part: the elif branch is decided by its own test."""
    if len(node.orelse) != 1 or not isinstance(node.orelse[0], ast.If):
        return False
    parts = [p for p in _conjuncts(node.test) if kind_of(p, derived) != RANK]
    return any(negates(part, other) for part in parts for other in _conjuncts(node.orelse[0].test))


def visit_loop(
    c: Checker, node: ast.For | ast.AsyncFor | ast.While, guards: list[Guard], loop: ast.stmt | None
) -> None:
    """A loop: its body, and the collectives a conditional break or continue skips."""
    if isinstance(node, ast.While):
        c.calls_here(node.test, guards)
        c.check_while_test(node)
    else:
        c.calls_here(node.iter, guards)
        c.check_ordered_loop(node)
    before = len(c.pending_exits)
    c.block(node.body, guards, node)
    # A continue under a diverging condition skips the collectives after it in
    # this pass; a break skips those and every later pass's.
    in_loop = sorted(c.collectives(node.body), key=lambda pair: (pair[0].lineno, pair[0].col_offset))
    for guard, exit_node, exit_loop in c.pending_exits[before:]:
        if exit_loop is not node or not isinstance(exit_node, (ast.Break, ast.Continue)):
            continue
        skipped = [pair for pair in in_loop if pair[0].lineno > exit_node.lineno]
        if isinstance(exit_node, ast.Break):
            skipped += in_loop
        certain = [pair for pair in skipped if pair[1].certain]
        if certain or skipped:
            call, collective = (certain or skipped)[0]
            c.report_exit(guard, exit_node, call, collective)
    c.pending_exits[before:] = [
        p for p in c.pending_exits[before:] if not isinstance(p[1], (ast.Break, ast.Continue))
    ]
    c.block(node.orelse, guards, loop)


def visit_try(c: Checker, node: ast.Try, guards: list[Guard], loop: ast.stmt | None) -> None:
    """A try: a handler that swallows the error lets a failed rank skip the collectives
    the others wait in."""
    c.block(node.body, guards, loop)
    # a handler of StopIteration ends an iteration: no error swallowed (uneven data, where
    # one rank's iterator ends first, is read by the loop rules)
    swallowing = [
        h
        for h in node.handlers
        if not any(isinstance(n, ast.Raise) for n in ast.walk(h))
        and not (isinstance(h.type, ast.Name) and h.type.id in ("StopIteration", "StopAsyncIteration"))
    ]
    if swallowing:
        handled = {c.label for _call, c in c.collectives(list(swallowing[0].body))}
        for call, collective in c.collectives(node.body):
            if collective.label not in handled:
                c.add(
                    Cause.RANK_EXCEPTION,
                    "warning",
                    call,
                    f"{collective.label} inside a try whose except (line "
                    f"{swallowing[0].lineno}) swallows the error: a rank that fails before "
                    f"it skips the collective the others wait in",
                    collective,
                )
    for handler in node.handlers:
        # a swallowing handler runs where the try failed on this rank: an exit in it
        # (`return None`, `continue`) skips what the others go on to, a collective in it
        # is one the others never make
        caught = Guard(CAUGHT, handler.lineno, _except_text(handler))
        c.block(handler.body, [*guards, caught] if handler in swallowing else guards, loop)
    c.block(node.orelse, guards, loop)
    c.block(node.finalbody, guards, loop)


def _except_text(handler: ast.ExceptHandler) -> str:
    return f"except {ast.unparse(handler.type)}" if handler.type is not None else "except"


def visit_with(
    c: Checker, node: ast.With | ast.AsyncWith, guards: list[Guard], loop: ast.stmt | None
) -> None:
    """A with: its context managers' calls, then its body."""
    for item in node.items:
        c.calls_here(item.context_expr, guards)
    c.block(node.body, guards, loop)


def visit_match(c: Checker, node: ast.Match, guards: list[Guard], loop: ast.stmt | None) -> None:
    """A match: each case's body."""
    for case in node.cases:
        c.block(case.body, guards, loop)


VISITORS: dict[type[ast.stmt], Callable[[Checker, Any, list[Guard], ast.stmt | None], None]] = {
    ast.If: visit_if,
    ast.For: visit_loop,
    ast.AsyncFor: visit_loop,
    ast.While: visit_loop,
    ast.Try: visit_try,
    ast.With: visit_with,
    ast.AsyncWith: visit_with,
    ast.Match: visit_match,
}
