"""Decisions each rank takes on a value of its own, as places in the source.

lint reads a test as unsynchronized-decision (each rank's own loss, clock, random draw)
or data-dependent-branch (each rank's own batch: a NaN, an empty record) when the ranks
that take it skip or reach a collective the others do not. A dry run in which the ranks
did not part there has not shown that they cannot: within a few steps on alike data
they took it alike. preflight watches each such test in its dry run (which side each
rank took, record/firing.py), lists the ones that did not part the ranks as not
checked (explain/coverage.py) and runs again with one rank made to take the other side
of one test (commands/preflight.py). A rank test (rank-early-exit) is not among them:
it decides the same on every run, so the dry run took it as the real run will.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.errors import InputError
from ncclcheck.lint.findings import ParsedModule, located
from ncclcheck.lint.project import Linter

LOCAL_DECISIONS = frozenset({Cause.UNSYNCHRONIZED_DECISION, Cause.DATA_DEPENDENT_BRANCH})


@dataclass(frozen=True)
class LocalDecision:
    path: str  # the file of the test (lint's checked file)
    line: int  # the line of the ``if`` or ``while`` whose test decides
    cause: Cause  # lint's reading
    reading: str  # lint's words for what the test skips or reaches


def local_decisions(linter: Linter, module: ParsedModule) -> list[LocalDecision]:
    """The tests in ``module`` that lint reads as a decision on a rank's own value, one
    per test, in source order."""
    found: dict[tuple[str, int], LocalDecision] = {}
    for finding in linter.check(module):
        if finding.cause not in LOCAL_DECISIONS or finding.location is None:
            continue
        where = located(finding)
        path = where.checked_path or where.path
        line = where.condition_line or where.line
        reading = finding.message.split(": ranks that take it")[0]
        found.setdefault((path, line), LocalDecision(path, line, finding.cause, reading))
    return sorted(found.values(), key=lambda decision: decision.line)


def decisions_to_watch(script: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(file, line of the test) of every local decision in the script and the local modules
    it imports, and those files: what a dry run watches (record/firing.py: the decisions'
    tests, and every except handler of the files). A file that cannot be read gives none:
    the run itself reports on it."""
    linter = Linter()
    try:
        linter.load(script)
    except InputError:
        return [], []
    watched: list[tuple[str, int]] = []
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
                watched += [(d.path, d.line) for d in local_decisions(linter, module)]
    return watched, sorted(str(path) for path in done)
