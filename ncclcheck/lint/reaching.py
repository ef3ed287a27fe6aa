"""Which rank-derived names still hold a rank-derived value at a line: the reaching
definitions lint needs to tell a test on the rank from a test on a value that was once
computed from it and has since been replaced or synchronised.

    train_loss = train_one_epoch(model, loader_of(rank))    # rank-derived
    mean = torch.tensor(train_loss)
    dist.all_reduce(mean)                                   # the same on every rank now
    train_loss = mean.item() / world                        # replaces the local value
    if train_loss < 0.4: break                              # a test on the synced value
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from ncclcheck.source.reading import RANK, blocks, bound_names, contains, kind_of, names_read, paired

# a binding that leaves the name the same on every rank: a collective it was passed to
_SYNCED = ast.Constant(value=None)


def _blocks(scope: ast.AST) -> list[tuple[int, int]]:
    """The line spans of the statement lists in ``scope`` below its top level: each branch
    of an if, a loop's body, a try's body and handlers, a with's body."""
    return [
        (block[0].lineno, max(s.end_lineno or s.lineno for s in block))
        for node in ast.walk(scope)
        if node is not scope
        for block in blocks(node)
    ]


def reaching_rank_names(
    scope: ast.AST, derived: set[str], line: int, synced_at: dict[str, list[int]] | None = None
) -> set[str]:
    """reaching_names for values computed from the rank."""
    return reaching_names(scope, derived, line, synced_at, lambda value, names: kind_of(value, names) == RANK)


def reaching_names(
    scope: ast.AST,
    derived: set[str],
    line: int,
    synced_at: dict[str, list[int]] | None,
    holds: Callable[[ast.expr, set[str]], bool],
) -> set[str]:
    """Of the ``derived`` names (each assigned, somewhere in ``scope``, a value ``holds`` of:
    computed from the rank, or local to a rank), those whose such value can reach
    ``line`` of ``scope``: assigned so above it, unless a later binding that every path
    to ``line`` passes (one in no block that leaves ``line`` out) replaces it, or a
    collective it is passed to (``synced_at``: the lines) makes it every rank's; or below
    it inside a loop around both whose body does not bind the name again between the
    loop's start and ``line``; each assignment judged by the names that reach it in turn.

    ``value = chunk(value, rank)`` at the end of a loop body does not make the loop's
    earlier ``placement = value.placements[0]`` rank-dependent when the body starts with
    ``value = states[name]`` (torch's fsdp/_optim_utils.py)."""
    bindings: dict[str, list[tuple[int, ast.expr | None]]] = {}  # None: a for target
    guarded = tests_over(scope)
    guard_of: dict[tuple[str, int], list[ast.expr]] = {}  # the tests a binding is made under
    for node in ast.walk(scope):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            for name in bound_names(node.target) & derived:
                bindings.setdefault(name, []).append((node.lineno, None))
        if (
            isinstance(node, ast.AugAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id in derived
        ):
            # `bad += 1`: the old value and the new part
            whole = ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value)
            bindings.setdefault(node.target.id, []).append((node.lineno, whole))
            guard_of[(node.target.id, node.lineno)] = guarded.get(id(node), [])
            continue
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for whole_target in targets:
            for target, value in paired(whole_target, node.value):
                for name in bound_names(target) & derived:
                    if node.lineno in (synced_at or {}).get(name, []):
                        # bound to what a collective returns (`stop = broadcast_flag(stop or
                        # rank0_saw_it)`): every rank's, whatever went in
                        continue
                    bindings.setdefault(name, []).append((node.lineno, value))
                    guard_of[(name, node.lineno)] = guarded.get(id(node), [])
    for name, lines in (synced_at or {}).items():
        if name in derived:
            bindings.setdefault(name, []).extend((at, _SYNCED) for at in lines)
    loops = [n for n in ast.walk(scope) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]
    blocks = _blocks(scope)
    known: dict[tuple[str, int], bool] = {}

    def passed_on_every_path(at: int, to: int) -> bool:
        return all(start <= to <= end for start, end in blocks if start <= at <= end)

    def flows(at: int, to: int, name: str) -> bool:
        if at < to:
            return not any(
                at < other < to and passed_on_every_path(other, to) for other, _ in bindings.get(name, [])
            )
        return any(
            contains(loop, at)
            and contains(loop, to)
            and not any(loop.lineno <= other < to for other, _ in bindings.get(name, []))
            for loop in loops
        )

    def reaches(name: str, to: int) -> bool:
        if name not in bindings:
            return True  # bound some other way (a parameter, an augmented assignment)
        key = (name, to)
        if key not in known:
            known[key] = False  # a cycle through the loop reaches nothing new
            known[key] = any(
                value is not None
                and flows(at, to, name)
                and any(
                    # attributes are bound outside the scope (a class's members): they reach
                    holds(
                        read,
                        {n for n in names_read(read)[0] & derived if reaches(n, at)}
                        | (names_read(read)[1] & derived),
                    )
                    for read in (value, *guard_of.get((name, at), []))
                )
                for at, value in bindings[name]
            )
        return known[key]

    return {name for name in derived if reaches(name, line)}


def tests_over(scope: ast.AST) -> dict[int, list[ast.expr]]:
    """id of each assignment in ``scope`` -> the tests of the ``if``s it is made under: a
    value assigned in one branch differs between ranks wherever the test does (`bad += 1`
    in the else of `if val_loss < best`)."""
    found: dict[int, list[ast.expr]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.If):
            for inner in (
                n for branch in (node.body, node.orelse) for stmt in branch for n in ast.walk(stmt)
            ):
                if isinstance(inner, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                    found.setdefault(id(inner), []).append(node.test)
    return found
