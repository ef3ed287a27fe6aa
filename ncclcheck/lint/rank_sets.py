"""Rank tests across a project: the names other modules give it that hold a rank
(``from dist_utils import leader``), and which ranks a test lets through: `rank == 0`,
`rank in (1, 2)`, `rank % 2` are evaluated on sample ranks, so two tests that split the
ranks between them (an if and its complement) are known to be balanced."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ncclcheck.source.reading import rank_fields, rank_functions

if TYPE_CHECKING:
    from ncclcheck.lint.findings import ParsedModule

# Point-to-point calls (send/recv, batch_isend_irecv) are rank-dependent by design: each
# side's branch is paired with the other's, so lint leaves them out.


_NEGATED_OPS: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


def negates(first: ast.expr, second: ast.expr) -> bool:
    """``not x`` / ``x``, ``rank == 0`` / ``rank != 0``: one test is the other's negation
    (or its complement over the ranks, see _complementary_on_ranks)."""
    if isinstance(first, ast.UnaryOp) and isinstance(first.op, ast.Not):
        return ast.dump(first.operand) == ast.dump(second)
    if isinstance(second, ast.UnaryOp) and isinstance(second.op, ast.Not):
        return ast.dump(second.operand) == ast.dump(first)
    if (
        isinstance(first, ast.Compare)
        and isinstance(second, ast.Compare)
        and len(first.ops) == len(second.ops) == 1
        and ast.dump(first.left) == ast.dump(second.left)
        and ast.dump(first.comparators[0]) == ast.dump(second.comparators[0])
        and _NEGATED_OPS.get(type(first.ops[0])) is type(second.ops[0])
    ):
        return True
    return _complementary_on_ranks(first, second)


# Rank values two tests on one variable are tried on: -1 stands for "not distributed"
# (the HF and YOLO idiom `local_rank in [-1, 0]`), where neither side need hold.
_RANK_SAMPLES = range(-1, 9)


def _is_in(value: int, other: Any) -> bool:
    return value in other


def _not_in(value: int, other: Any) -> bool:
    return value not in other


_COMPARE: dict[type[ast.cmpop], Callable[[int, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: _is_in,
    ast.NotIn: _not_in,
}


def _ranks_where(test: ast.expr) -> tuple[str, frozenset[int]] | None:
    """(the variable, the sampled ranks where ``test`` holds) for ``x OP constant``, the
    constant an int or a list/tuple/set of ints; None for any other test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    compare = _COMPARE.get(type(test.ops[0]))
    try:
        other = ast.literal_eval(test.comparators[0])
    except ValueError:
        return None
    is_int = isinstance(other, int) and not isinstance(other, bool)
    is_ints = isinstance(other, (list, tuple, set)) and all(isinstance(v, int) for v in other)
    if compare is None or not (is_int or is_ints):
        return None
    try:
        holds = frozenset(value for value in _RANK_SAMPLES if compare(value, other))
    except TypeError:  # `x < [0, 1]`
        return None
    return ast.dump(test.left), holds


def same_on_every_rank(test: ast.expr) -> bool:
    """``local_rank != -1``, ``rank >= 0``: a rank test that every rank (>= 0) meets, or
    none does; -1 is the "not distributed" value of the idiom."""
    where = _ranks_where(test)
    if where is None:
        return False
    ranks = frozenset(value for value in _RANK_SAMPLES if value >= 0)
    held = where[1] & ranks
    return not held or held == ranks


def _complementary_on_ranks(first: ast.expr, second: ast.expr) -> bool:
    """``local_rank not in [-1, 0]`` / ``local_rank == 0``: on one variable, every rank
    (>= 0) meets exactly one of the two tests."""
    one, two = _ranks_where(first), _ranks_where(second)
    if one is None or two is None or one[0] != two[0]:
        return False
    ranks = frozenset(value for value in _RANK_SAMPLES if value >= 0)
    return (one[1] & ranks).isdisjoint(two[1]) and (one[1] | two[1]) >= ranks


def imported_rank_names(load: Callable[[Path], ParsedModule | None], module: ParsedModule) -> set[str]:
    """Rank functions and rank-valued config fields of the project's modules ``module``
    imports from (``load``: the linter's, which reads each module once): ``from dist_utils
    import leader`` makes ``leader()`` a rank test, ``dist_utils.leader()`` too, and a
    field of an imported config class its ``cfg.lead``."""
    found: set[str] = set()
    sources: list[tuple[str | None, Path, str | None]] = [
        (local, path, original) for local, (path, original) in module.imported_functions.items()
    ]
    sources += [(None, path, None) for path in module.imported_modules.values()]
    for local, path, original in sources:
        other = load(path)
        if other is None or other is module:
            continue
        functions, fields = _rank_names_of(other)
        found |= fields
        if local is None:
            found |= functions  # read as attributes: dist_utils.leader()
        elif original in functions:
            found.add(local)
    return found


def _rank_names_of(module: ParsedModule) -> tuple[set[str], set[str]]:
    """A module's rank functions and rank fields, read once per module however many
    modules import it."""
    cached = module.__dict__.get("_rank_names")
    if cached is None:
        cached = module.__dict__["_rank_names"] = (rank_functions(module.tree), rank_fields(module.tree))
    return cached
