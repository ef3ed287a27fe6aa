"""Decisions each rank takes on a value of its own, as places in the source.

lint reads a test as unsynchronized-decision (each rank's own loss, clock, random draw)
or data-dependent-branch (each rank's own batch: a NaN, an empty record) when the ranks
that take it skip or reach a collective the others do not. A dry run in which the ranks
did not part there has not shown that they cannot: within a few steps on alike data
they took it alike. preflight watches each such test in its dry run (which side each
rank took, record/firing.py), lists the ones that did not part the ranks as not
checked (explain/coverage.py) and runs again with one rank made to take the other side
of one test (commands/preflight.py). A rank test (rank-early-exit on ``rank``, a name
assigned a rank or a test of one) is not among them: it decides the same on every run,
so the dry run took it as the real run will. A test lint calls rank-early-exit because
it reads a value computed from what the rank holds (``stopper.step(val_loss)``, the loss
of a shard chosen by rank) is among them: that value moves as the model trains, and the
day it crosses the line on one rank comes after any short run.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.communicates import SHARDED_FORWARD
from ncclcheck.errors import InputError
from ncclcheck.lint.findings import ParsedModule, located
from ncclcheck.lint.project import Linter
from ncclcheck.source import reading

LOCAL_DECISIONS = frozenset({Cause.UNSYNCHRONIZED_DECISION, Cause.DATA_DEPENDENT_BRANCH})


@dataclass(frozen=True)
class LocalDecision:
    path: str  # the file of the test (lint's checked file)
    line: int  # the line of the ``if`` or ``while`` whose test decides
    cause: Cause  # lint's reading
    reading: str  # lint's words for what the test skips or reaches
    # a value the test reads is given to a collective somewhere in the function, on some
    # path (`dist.broadcast(epoch_loss, 0)` under an option): where the run saw every rank
    # read the same values, that path is the likely one, and the decision is not forced
    synced_somewhere: bool = False
    call_line: int = 0  # the call the test skips or reaches (lint's finding's line)
    # that call is a forward of a model whose parameters FSDP or ZeRO-3 shard: a rank that
    # skips it skips the all-gathers of that module's parameters (forward and backward)
    skips_a_sharded_forward: bool = False


def local_decisions(linter: Linter, module: ParsedModule) -> list[LocalDecision]:
    """The tests in ``module`` that lint reads as a decision on a rank's own value, one
    per test, in source order."""
    found: dict[tuple[str, int], LocalDecision] = {}
    for finding in linter.check(module):
        if finding.location is None or finding.cause not in (*LOCAL_DECISIONS, Cause.RANK_EARLY_EXIT):
            continue
        where = located(finding)
        path = where.checked_path or where.path
        line = where.condition_line or where.line
        if finding.cause is Cause.RANK_EARLY_EXIT and _tests_the_rank(path, line):
            continue
        reading, _, rest = finding.message.partition(": ranks that take it")
        if "; `" in rest:
            # why the test is rank-local where another line decided it (the callback that
            # set the flag the test reads, the rank that dist.reduce left it on)
            reading += rest[rest.index("; `") :].rsplit(" (in ", 1)[0].rsplit(" (at module level", 1)[0]
        synced = _synced_somewhere(linter, module, path, line)
        found.setdefault(
            (path, line),
            LocalDecision(
                path,
                line,
                finding.cause,
                reading,
                synced,
                where.call_line or where.line,
                where.label.endswith(SHARDED_FORWARD),
            ),
        )
    return sorted(found.values(), key=lambda decision: decision.line)


def _tests_the_rank(path: str, line: int) -> bool:
    """Whether the ``if``/``while`` test at ``line`` reads the rank itself, or a name assigned
    a rank or a test of one (reading.condition_kind), rather than only a value computed
    from what the rank holds."""
    chain = reading.enclosing_chain(path, line)
    test = next(
        (n.test for n in reversed(chain) if isinstance(n, ast.If | ast.While) and n.lineno == line), None
    )
    return test is None or reading.condition_kind(path, test) == reading.RANK


def _synced_somewhere(linter: Linter, module: ParsedModule, path: str, line: int) -> bool:
    """Whether a name the test at ``line`` reads, or a name its value is computed from in
    the function, is passed to (or returned by) a collective anywhere in that function."""
    if os.path.realpath(path) != os.path.realpath(module.path):
        return False
    scope = reading.enclosing_function(str(module.path), line)
    chain = reading.enclosing_chain(str(module.path), line)
    test = next((n.test for n in reversed(chain) if isinstance(n, ast.If | ast.While)), None)
    if scope is None or test is None:
        return False
    # what a collective itself agreed: a constant (`patience = 30`) agrees everywhere, but it is
    # no sign that the function synchronises what its test reads
    synced = linter.passed_to_collectives(scope, module)
    values: dict[str, list[ast.expr]] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in reading.bound_names(target):
                    values.setdefault(name, []).append(node.value)
    seen: set[str] = set()
    pending = reading.names_read(test)[0]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in synced:
            return True
        for value in values.get(name, []):
            if _calls_a_collective(linter, module, value):
                return True  # `val_loss = evaluate_mean(model)`: a helper that all-reduces
            pending |= reading.names_read(value)[0]
    return False


def _calls_a_collective(linter: Linter, module: ParsedModule, value: ast.expr) -> bool:
    for call in (node for node in ast.walk(value) if isinstance(node, ast.Call)):
        if linter.collective_of_call(call, module, None, set()) is not None:
            return True
    return False


def decision_at(path: str, line: int) -> LocalDecision | None:
    """lint's reading of the test at ``path:line``, if it reads one there."""
    linter = Linter()
    try:
        module = linter.load(Path(path))
    except InputError:
        return None
    if module is None:
        return None
    real = os.path.realpath(path)
    return next(
        (d for d in local_decisions(linter, module) if os.path.realpath(d.path) == real and d.line == line),
        None,
    )


def decisions_to_watch(script: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(file, line of the test) of every local decision in the script and the local modules
    it imports, and those files: what a dry run watches (record/firing.py: the decisions'
    tests, and every except handler of the files). A file that cannot be read gives none:
    the run itself reports on it."""
    decisions, files = decisions_of_the_program(script)
    return [(d.path, d.line) for d in decisions], files


def decisions_of_the_program(script: Path) -> tuple[list[LocalDecision], list[str]]:
    """Every local decision in the script and the local modules it imports, and those files."""
    linter = Linter()
    try:
        linter.load(script)
    except InputError:
        return [], []
    found: list[LocalDecision] = []
    done: set[Path] = set()
    # checking a module loads the local modules its calls resolve into: those too, in turn
    while pending := [path for path in linter.modules if path not in done]:
        for path in pending:
            done.add(path)
            try:
                module = linter.load(path)
            except InputError:
                continue
            if module is not None:
                found += local_decisions(linter, module)
    return found, sorted(str(path) for path in done)
