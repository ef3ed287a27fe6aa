"""The explanation engine: ordered tables of rules, each a function of the evidence.

A rule looks at one situation (ranks that parted at a call, ranks that wait at
different lines, a stall with every rank in the same call) and either explains it
or returns None; the first rule of a table that explains it wins, so the order of
a table is the order of precedence, written down once. preflight and doctor call
the same rules; each turns the ``Explanation`` into a ``Finding`` of its report.

An Explanation is typed: the cause, the ranks that made the call and those absent,
the op and site, and the ``Reason`` the source gave (the rank test, the early exit,
the loop exit, the test on the data...). A rule that could say only where the
ranks parted, not why, leaves ``reason`` empty: callers test that, never the
wording of a message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from ncclcheck.catalogue import Catalogue
from ncclcheck.causes import Cause
from ncclcheck.model import Finding, Frame, Severity
from ncclcheck.source import reading


class ReasonKind(str, Enum):
    """What in the source sends the ranks different ways."""

    RANK_TEST = "rank-test"  # `if rank == 0:` around the call
    EARLY_EXIT = "early-exit"  # a return or raise, under a test, before the call
    LOOP_EXIT = "loop-exit"  # a break, return or while test that ended a loop on some ranks
    DATA_TEST = "data-test"  # `if` on the data (a shape, a NaN)
    LOCAL_TEST = "local-test"  # `if` on a value each rank reads for itself (a clock, a file)
    SWALLOWED_ERROR = "swallowed-error"  # a try whose handler swallows the error
    LOADER_LENGTH = "loader-length"  # a loop over loaders of different lengths
    LOOP_ORDER = "loop-order"  # one call in a loop reaching other functions per rank (its items' order)


# What a test reads (reading.condition_kind), as the reason it gives and the cause an
# exit or skip under it names: read by the source rules (rules/branch.py) and by the
# line evidence (explain/lines.py) alike.
REASON_OF_KIND = {
    reading.RANK: ReasonKind.RANK_TEST,
    reading.DATA: ReasonKind.DATA_TEST,
    reading.OTHER: ReasonKind.LOCAL_TEST,
}


def cause_of_exit(condition_kind: str) -> Cause:
    """The cause an early exit or skip names, by what its condition reads."""
    return {
        reading.RANK: Cause.RANK_EARLY_EXIT,
        reading.DATA: Cause.DATA_DEPENDENT_BRANCH,
    }.get(condition_kind, Cause.UNSYNCHRONIZED_DECISION)


def reason_of_local_decision(cause: Cause) -> ReasonKind:
    """The reason a decision on a rank's own value gives, by lint's cause for it."""
    return ReasonKind.DATA_TEST if cause is Cause.DATA_DEPENDENT_BRANCH else ReasonKind.LOCAL_TEST


@dataclass(frozen=True)
class Reason:
    kind: ReasonKind
    site: Frame | None  # the statement that decides (its line; no function)
    text: str  # the statement, as the source has it ("if rank == 0", "break")


@dataclass
class Explanation:
    """What a rule found; a command turns it into a Finding (``finding``)."""

    cause: Cause
    message: str
    ranks: list[int] = field(default_factory=list)
    absent_ranks: list[int] = field(default_factory=list)
    op: str | None = None
    site: str | None = None
    evidence: list[str] = field(default_factory=list)
    severity: Severity = Severity.ERROR
    reason: Reason | None = None
    # a fix of the rule's own, said instead of the playbook's (an empty eval shard)
    fix: str | None = None
    # where the source alone did not say why the ranks parted: what a replay of the dry
    # run would trace to decide it (explain/lines.py plan_of); preflight runs it
    replay_plan: dict[str, Any] | None = None

    def finding(self, catalogue: Catalogue) -> Finding:
        fix = self.fix
        if fix is None:
            fix = catalogue.get(self.cause).fix.direct if self.cause in catalogue else ""
        return Finding(
            cause=self.cause,
            severity=self.severity,
            message=self.message,
            ranks=self.ranks,
            absent_ranks=self.absent_ranks,
            op=self.op,
            site=self.site,
            evidence=self.evidence,
            fix=fix,
        )


Situation = TypeVar("Situation")


def first_explanation(
    rules: Sequence[Callable[[Situation], Explanation | None]], situation: Situation
) -> Explanation | None:
    """The first rule of the table that explains the situation, or None."""
    for rule in rules:
        explanation = rule(situation)
        if explanation is not None:
            return explanation
    return None


def framework_fixes(catalogue: Catalogue, cause: Cause, libraries: Sequence[str]) -> list[str]:
    """The playbook's fix in the terms of each framework on the call's stack (Lightning's
    self.log, accelerate's gather), said beside the finding."""
    fixes = catalogue.get(cause).fix.frameworks if cause in catalogue else {}
    return [f"with {name}: {fixes[name]}" for name in libraries if name in fixes]
