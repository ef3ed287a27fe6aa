"""Periodic actions: the ``if`` inside a loop that fires every N steps (``step % N == 0``,
``(i + 1) % accumulation == 0``, ``not step % interval``) and reaches a collective, a
checkpoint's barrier, an evaluation's all_reduce. A short dry run may never reach the
step where one fires; preflight reads which did not fire (explain/coverage.py) and does
not call aligned what it did not run."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ncclcheck.errors import InputError
from ncclcheck.lint.findings import Collective, Function, ParsedModule
from ncclcheck.lint.project import Linter
from ncclcheck.lint.syntax import reaching_nodes_in

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)


@dataclass(frozen=True)
class PeriodicAction:
    path: Path
    line: int  # the ``if``
    body: tuple[int, int]  # the first and last line of what it runs when it fires
    test: str  # as written
    collective: Collective  # the first collective its body reaches


def is_periodic(test: ast.expr) -> bool:
    """A test on a remainder: ``x % n == k`` (either side), ``not x % n``."""
    return bool(periodic_parts(test))


def periodic_parts(test: ast.expr) -> list[ast.expr]:
    """The parts of ``test`` that are periodic (``step % 100 == 0`` in ``rank == 0 and
    step % 100 == 0``): what preflight makes fire, leaving the rest of the test as it is."""
    found: list[ast.expr] = []
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and all(isinstance(op, ast.Eq) for op in node.ops)
            and any(_remainder(side) for side in (node.left, *node.comparators))
        ) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and _remainder(node.operand)):
            found.append(node)
    return found


def actions_to_fire(script: Path) -> list[tuple[str, int]]:
    """(file, line) of every periodic action in the script and the local modules it
    imports: what a dry run makes fire once (record/firing.py). A file that cannot be
    read gives none: the run itself reports on it."""
    linter = Linter()
    try:
        linter.load(script)
    except InputError:
        return []
    found: list[tuple[str, int]] = []
    for path in list(linter.modules):
        try:
            found += [(str(a.path), a.line) for a in periodic_actions(linter, path)]
        except InputError:
            continue
    return found


def _remainder(node: ast.expr) -> bool:
    """``a % b`` as arithmetic, not ``"%d" % step`` (printf-style formatting)."""
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Mod)
        and not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str | bytes))
    )


def periodic_actions(linter: Linter, path: Path) -> list[PeriodicAction]:
    """The periodic ``if``s inside loops of the module at ``path`` whose bodies reach a
    collective, in source order."""
    module = linter.load(path)
    if module is None:
        return []
    scopes: dict[int, tuple[Function | None, ast.AST]] = {id(module.tree): (None, module.tree)}
    for defined in [*(f for group in module.functions.values() for f in group), *module.methods.values()]:
        scopes.setdefault(id(defined.node), (defined, defined.node))
    found: list[PeriodicAction] = []
    for function, node in scopes.values():
        ddp_names = linter.ddp_names_of(node)
        for test_if in _ifs_in_loops(node):
            if not is_periodic(test_if.test):
                continue
            reached = _first_collective(linter, module, function, ddp_names, test_if.body)
            if reached is not None:
                last = test_if.body[-1]
                found.append(
                    PeriodicAction(
                        module.path,
                        test_if.lineno,
                        (test_if.body[0].lineno, last.end_lineno or last.lineno),
                        ast.unparse(test_if.test),
                        reached,
                    )
                )
    return sorted(found, key=lambda action: action.line)


def _ifs_in_loops(scope: ast.AST) -> list[ast.If]:
    """``if`` statements of this scope (not of a function or class inside it) that sit in
    one of its loops."""
    found: list[ast.If] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _SCOPES):
                continue
            if isinstance(child, ast.If) and in_loop:
                found.append(child)
            visit(child, in_loop or isinstance(child, _LOOPS))

    visit(scope, False)
    return found


def _first_collective(
    linter: Linter,
    module: ParsedModule,
    function: Function | None,
    ddp_names: set[str],
    body: list[ast.stmt],
) -> Collective | None:
    uncertain = None
    for statement in body:
        for node in reaching_nodes_in(statement):
            reached = linter.collective_of_node(node, module, function, ddp_names)
            if reached is not None and reached.certain:
                return reached
            uncertain = uncertain or reached
    return uncertain
