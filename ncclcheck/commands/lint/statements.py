"""How each kind of statement is checked: one visitor per kind, and the table that
picks it. A statement of another kind is checked for the calls it makes.

A visitor reads and extends the checker's state (the guards over it, the loop it is
in, the exits pending); the checker itself walks blocks and reports.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ncclcheck.causes import Cause
from ncclcheck.commands.lint.findings import _Guard
from ncclcheck.commands.lint.syntax import _clean_exit, _is_exit_call
from ncclcheck.explain.source import RANK, kind_of

if TYPE_CHECKING:
    from ncclcheck.commands.lint.scope import _ScopeChecker


def is_exit(node: ast.stmt) -> bool:
    return isinstance(node, (ast.Return, ast.Break, ast.Continue, ast.Raise)) or _is_exit_call(node)


def visit_exit(c: _ScopeChecker, node: ast.stmt, guards: list[_Guard], loop: ast.stmt | None) -> None:
    """A return, break, continue, raise or sys.exit: what it skips is reported where the
    loop or function it leaves is checked."""
    c.calls_here(node, guards)  # `return helper(x)`: the value runs before the exit
    # A raise (or a non-zero exit) fails the rank, and torchrun stops the others:
    # a crash (rank-crashed), not a silent wait. A clean sys.exit() leaves them waiting.
    if isinstance(node, ast.Raise) or (_is_exit_call(node) and not _clean_exit(node)):
        return
    # the test right above the exit decides it (an outer rank test around an inner
    # `if not isinstance(state, Tensor): return` does not make that return rank-driven)
    if guards and guards[-1].kind != "other":
        c.pending_exits.append((guards[-1], node, loop))


def visit_if(c: _ScopeChecker, node: ast.If, guards: list[_Guard], loop: ast.stmt | None) -> None:
    """An if: each branch is checked under the guard its test makes."""
    c.calls_here(node.test, guards)
    kind = c.kind(node.test, [*node.body, *node.orelse])
    balanced = kind == "other" or id(node) in c.complementary or not c.branches_differ(node)
    peer = (
        isinstance(node.test, ast.Compare)
        and kind == RANK
        and all(kind_of(side, c.derived) == RANK for side in [node.test.left, *node.test.comparators])
    )
    guard = _Guard(kind, node.lineno, ast.unparse(node.test), balanced, peer, node.test)
    # An exit in one branch does not skip what the other branch runs: each branch
    # starts from the exits seen before the if; both sets apply after it.
    exits_before = list(c.pending_exits)
    c.block(node.body, [*guards, guard], loop)
    from_body = c.pending_exits[len(exits_before) :]
    c.pending_exits = list(exits_before)
    c.block(node.orelse, [*guards, guard], loop)
    c.pending_exits += from_body


def visit_loop(
    c: _ScopeChecker, node: ast.For | ast.AsyncFor | ast.While, guards: list[_Guard], loop: ast.stmt | None
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


def visit_try(c: _ScopeChecker, node: ast.Try, guards: list[_Guard], loop: ast.stmt | None) -> None:
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
        c.block(handler.body, guards, loop)
    c.block(node.orelse, guards, loop)
    c.block(node.finalbody, guards, loop)


def visit_with(
    c: _ScopeChecker, node: ast.With | ast.AsyncWith, guards: list[_Guard], loop: ast.stmt | None
) -> None:
    """A with: its context managers' calls, then its body."""
    for item in node.items:
        c.calls_here(item.context_expr, guards)
    c.block(node.body, guards, loop)


def visit_match(c: _ScopeChecker, node: ast.Match, guards: list[_Guard], loop: ast.stmt | None) -> None:
    """A match: each case's body."""
    for case in node.cases:
        c.block(case.body, guards, loop)


VISITORS: dict[type[ast.stmt], Callable[[_ScopeChecker, Any, list[_Guard], ast.stmt | None], None]] = {
    ast.If: visit_if,
    ast.For: visit_loop,
    ast.AsyncFor: visit_loop,
    ast.While: visit_loop,
    ast.Try: visit_try,
    ast.With: visit_with,
    ast.AsyncWith: visit_with,
    ast.Match: visit_match,
}
