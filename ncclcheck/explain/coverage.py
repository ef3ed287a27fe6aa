"""What a dry run covered of the script, and what it did not: preflight calls aligned only
what ran.

A dry run is short: a few train steps a pass, a few eval batches. Two parts of a real
run that hang often lie past it, and both are read here after the run:

- **the end of a train pass** the budget cut: the ranks' loaders told their lengths as
  each pass began, so whether the passes end at the same step on every rank is known
  without running to the end (where they do not, rules/quiet.uneven_train_loader says
  so). Where a length is unknown (an IterableDataset), it was not checked.
- **a periodic action** (``if step % N == 0:`` in a loop, lint/periodic.py) whose body
  reaches a collective and which never fired: no recorded collective has its body on
  its call chain. Whether every rank takes it together (a barrier inside ``try/except``
  one rank takes, a save only rank 0 finishes) was not checked.
- **an order each process draws** (lint's collective-order-mismatch: collectives in a loop
  over a set's items, a directory listing): where the ranks' orders agreed in the dry run,
  they agreed by chance (each interpreter's string-hash seed, one host's file system), and
  what ran cannot vouch for a run whose ranks draw other orders.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.evidence.traces import LoaderPass
from ncclcheck.explain.context import Context
from ncclcheck.lint.decisions import LocalDecision, local_decisions
from ncclcheck.lint.findings import located
from ncclcheck.lint.periodic import PeriodicAction, periodic_actions
from ncclcheck.lint.project import Linter
from ncclcheck.lint.syntax import reaching_nodes_in
from ncclcheck.model import Finding, Severity
from ncclcheck.record.tracefile import End
from ncclcheck.source import reading
from ncclcheck.wording import is_user, line_ranges, relative, who


@dataclass(frozen=True)
class Gap:
    """A part of the script the dry run did not run."""

    text: str
    communicates: bool  # it reaches a collective: what ran cannot vouch for it
    decision: LocalDecision | None = None  # a decision on a rank's own value (lint/decisions.py)
    reached: bool = False  # that test ran in the dry run (record/firing.py watched it)
    alike: bool = False  # there, every rank's test read the same values


@dataclass
class Coverage:
    ran: list[str] = field(default_factory=list)  # what the run covered, in words
    not_run: list[Gap] = field(default_factory=list)
    # what the source alone decides of a part that did not run (lint's errors in a
    # periodic action that never fired: a rank-0-only evaluation every N steps)
    found_in_source: list[Finding] = field(default_factory=list)
    checked: dict[Path, list[Finding]] = field(default_factory=dict)  # lint's findings per file


def coverage(d: Context) -> Coverage:
    found = Coverage()
    linter = Linter()
    after = _after_the_stop(d, linter, found)
    if after is not None:
        found.not_run.append(after)
    _train_pass_ends(d, found)
    _periodic_actions(d, found, linter)
    _decisions_on_local_values(d, found, linter)
    _orders_each_process_draws(d, found, linter)
    _handlers_that_caught_nothing(d, found, linter)
    return found


def _handlers_that_caught_nothing(d: Context, found: Coverage, linter: Linter) -> None:
    """lint's rank-exception findings in the user's files whose except no rank entered in
    the dry run: the error it swallows never came, so what a rank does when it comes alone
    (skip a step, return None, continue past a collective) did not run."""
    caught = {
        (os.path.realpath(c.site.file), c.site.line) for trace in d.ev.traces.values() for c in trace.caught
    }
    # the functions the recorded collectives were called through: a handler in one of them
    # sat in code the run went through (its try ran), the forcing run can raise there
    went_through = {
        (os.path.realpath(frame.file), frame.function)
        for trace in d.ev.traces.values()
        for call in trace.calls
        for frame in call.user_stack
    }
    for path in _user_files(d):
        for finding in _checked(linter, Path(path), found):
            where = finding.location
            if finding.cause is not Cause.RANK_EXCEPTION or where is None or where.condition_line is None:
                continue
            handler = (os.path.realpath(where.checked_path or where.path), where.condition_line)
            if handler in caught:
                continue  # it caught on some rank: what followed ran, and was checked
            function = reading.enclosing_function(handler[0], handler[1])
            name = getattr(function, "name", "")
            reading_of_it = finding.message.split(": ranks that take it")[0]
            found.not_run.append(
                Gap(
                    f"{relative(handler[0], d.ev.cwd)}:{handler[1]}: {finding.message} (as lint reads it); "
                    "no rank caught an error there in the dry run, so a rank that does alone was not "
                    "checked",
                    True,
                    decision=LocalDecision(handler[0], handler[1], Cause.RANK_EXCEPTION, reading_of_it),
                    reached=(handler[0], name) in went_through,
                )
            )


def _orders_each_process_draws(d: Context, found: Coverage, linter: Linter) -> None:
    """lint's collective-order-mismatch findings in the user's files, as parts the run did
    not check: where the ranks of this dry run met the items in one order, chance (or a
    shared PYTHONHASHSEED, one host's directory order) made them agree."""
    for path in _user_files(d):
        for finding in _checked(linter, Path(path), found):
            if finding.cause is not Cause.COLLECTIVE_ORDER_MISMATCH or finding.location is None:
                continue
            where = finding.location
            found.not_run.append(
                Gap(
                    f"{relative(where.path, d.ev.cwd)}:{where.line}: {finding.message} (as lint reads it). "
                    "Where the ranks of this dry run met the items in one order, they did by chance (each "
                    "process draws its string-hash seed; one host lists a directory one way): what ran "
                    "cannot vouch for it",
                    True,
                )
            )


def _decisions_on_local_values(d: Context, found: Coverage, linter: Linter) -> None:
    """Each decision lint reads as taken on a rank's own value (lint/decisions.py), in the
    user's files, as a part the dry run did not check: the ranks took it alike (or not at
    all) within the budget, so what ran cannot vouch for the run where one rank takes it
    alone (an early stop on its own loss, a save on its own clock, a batch skipped for its
    own NaN). What the watched test did on each rank is said (record/firing.py)."""
    said = {(f.location.path, f.location.line) for f in found.found_in_source if f.location}
    sides = _sides_taken(d)
    # the files whose tests were watched too: a module no recorded collective was called
    # through (a save that never fired) still holds the decision
    files = {*_user_files(d), *(path for path, _line in sides if os.path.isfile(path))}
    for path in sorted(files):
        module = linter.load(Path(path))
        if module is None:
            continue
        for decision in local_decisions(linter, module):
            if (decision.path, decision.line) in said:
                continue
            said.add((decision.path, decision.line))
            key = (os.path.realpath(decision.path), decision.line)
            taken = sides.get(key, {})
            if len({frozenset(taken_sides) for taken_sides in taken.values()}) > 1:
                continue  # the ranks took it apart in the run: what followed was checked (or found)
            # every rank's test read the same values: a value they share on the path that ran,
            # where a value was a fraction (no coincidence) or the function synchronises it on
            # some path (counts that agree, a patience still at 0, are no such sign)
            same, fraction = _reads_alike(d, key)
            alike = same and (fraction or decision.synced_somewhere)
            what = _what_the_test_did(taken, d.ev.world_size)
            if alike:
                what += (
                    ", and it read the same values on every rank each time (a value synchronised on "
                    "the path that ran, or drawn alike on every rank); whether it can "
                    "differ per rank was not checked: where every path synchronises it first, nothing "
                    "is wrong; where not, `--perturb` makes rank-local values differ"
                )
            else:
                what += (
                    "; the ranks did not part there, which is not that they cannot. Not checked: make "
                    "it fire on one rank (its test true on rank 1 only), or `--perturb`"
                )
            found.not_run.append(
                Gap(
                    f"{relative(decision.path, d.ev.cwd)}:{decision.line}: a decision each rank takes on "
                    f"a value of its own ({decision.cause}, as lint reads it: {decision.reading}); {what}",
                    True,
                    decision=decision,
                    reached=bool(taken),
                    alike=alike,
                )
            )


def _sides_taken(d: Context) -> dict[tuple[str, int], dict[int, set[bool]]]:
    """(file, line) of each watched test -> rank -> the sides it took, unforced."""
    sides: dict[tuple[str, int], dict[int, set[bool]]] = {}
    for rank, trace in d.ev.traces.items():
        for decided in trace.decided:
            if not decided.forced:
                key = (os.path.realpath(decided.site.file), decided.site.line)
                sides.setdefault(key, {}).setdefault(rank, set()).add(decided.taken)
    return sides


def _reads_alike(d: Context, key: tuple[str, int]) -> tuple[bool, bool]:
    """Whether every rank's test at ``key`` read the same values over the evaluations they
    all made, and whether a value among them was a fraction (record/firing.py)."""
    reads = [trace.decision_reads.get(key, {}) for trace in d.ev.traces.values()]
    common = set.intersection(*(set(r) for r in reads)) if reads else set()
    if len(reads) < 2 or not common:
        return False, False
    most = max(common)
    return len({r[most][0] for r in reads}) == 1, any(r[most][1] for r in reads)


def _what_the_test_did(taken: dict[int, set[bool]], world: int) -> str:
    if not taken:
        return "the dry run never reached its test (or ran without watching it)"
    by_sides: dict[tuple[bool, ...], list[int]] = {}
    for rank, sides in sorted(taken.items()):
        by_sides.setdefault(tuple(sorted(sides)), []).append(rank)
    words = {(False,): "false each time", (True,): "true each time", (False, True): "both true and false"}
    parts = [f"{words[s]} on {who(ranks)}" for s, ranks in by_sides.items()]
    unreached = world - len(taken)
    if unreached > 0:
        parts.append(f"not reached on {unreached} rank(s)")
    return "in the dry run its test was " + "; ".join(parts)


def _after_the_stop(d: Context, linter: Linter, found: Coverage) -> Gap | None:
    """What the script does after the point where the budget stopped the dry run (a final
    evaluation, a save, a barrier after the epochs): not checked, and said so; lint's errors
    decided there (a save on rank 0 whose helper all-reduces) are what the source decides
    of it."""
    stopped = next(
        (
            t.exit.stack
            for _rank, t in sorted(d.ev.traces.items())
            if t.exit is not None and t.exit.how is End.DRY_RUN_COMPLETE and t.exit.stack
        ),
        None,
    )
    if not stopped:
        return None
    parts: list[str] = []
    reaches: list[str] = []
    for frame in stopped:  # outermost first
        after, in_loop = reading.statements_after(frame.file, frame.line)
        if after:
            lines = line_ranges([(stmt.lineno, stmt.end_lineno or stmt.lineno) for stmt in after])
            parts.append(f"{lines} of {frame.function}() in {relative(frame.file, d.ev.cwd)}")
            reaches += _collectives_in(linter, frame.file, after)
            _lint_errors_after(d, linter, frame.file, after, found)
        if in_loop:
            break  # deeper frames ran in the loop's earlier passes
    if not parts:
        return None
    innermost = stopped[-1]
    return Gap(
        f"the budget stopped the dry run at {d.site(innermost)} in {innermost.function}(): "
        f"what the script does after that did not run ({'; '.join(parts)})"
        + (f" and it reaches {reaches[0]}" if reaches else "")
        + ", so a final evaluation, save or barrier there is not checked: run the script for "
        "one epoch (its own option) to check it too",
        bool(reaches),
    )


def _lint_errors_after(
    d: Context, linter: Linter, path: str, statements: list[ast.stmt], found: Coverage
) -> None:
    """lint's errors in ``path`` whose test or call lies in these statements, which the dry
    run never reached: the source decides them, as for a periodic action that never fired."""
    spans = [(stmt.lineno, stmt.end_lineno or stmt.lineno) for stmt in statements]
    for finding in _checked(linter, Path(path), found):
        where = located(finding)
        if finding.severity is not Severity.ERROR:
            continue
        if os.path.realpath(where.checked_path or where.path) != os.path.realpath(path):
            continue
        lines = [n for n in (where.condition_line, where.call_line) if n is not None]
        if any(first <= n <= last for n in lines for first, last in spans):
            _decided_by_the_source(d, finding, "the budget stopped the run before it", found)


def _checked(linter: Linter, path: Path, found: Coverage) -> list[Finding]:
    """lint's findings on ``path``, read once for the whole coverage pass."""
    if path not in found.checked:
        module = linter.load(path)
        found.checked[path] = linter.check(module) if module is not None else []
    return found.checked[path]


def _decided_by_the_source(d: Context, finding: Finding, why: str, found: Coverage) -> None:
    """A lint error in code the dry run never ran, reported as what the source decides
    (with the playbook's fix), once however many gaps hold it."""
    if any(finding is said for said in found.found_in_source):
        return
    if not finding.fix and finding.cause in d.catalogue:
        finding.fix = d.catalogue.get(finding.cause).fix.direct
    finding.evidence = [*finding.evidence, f"the dry run never ran it ({why}): the source decides"]
    found.found_in_source.append(finding)


def _collectives_in(linter: Linter, path: str, statements: list[ast.stmt]) -> list[str]:
    """The collectives these statements of ``path`` reach, as lint labels them."""
    module = linter.load(Path(path))
    if module is None:
        return []
    found = []
    for statement in statements:
        for node in reaching_nodes_in(statement):
            reached = linter.collective_of_node(node, module, None, module.ddp_names)
            if reached is not None and reached.certain:
                found.append(" -> ".join(reached.chain))
                break
    return found


def _train_pass_ends(d: Context, found: Coverage) -> None:
    first: dict[str, dict[int, LoaderPass]] = {}  # loader -> rank -> its first train pass
    for rank, trace in sorted(d.ev.traces.items()):
        for loader_pass in trace.passes:
            if loader_pass.role == "train":
                first.setdefault(loader_pass.loader, {}).setdefault(rank, loader_pass)
    train_calls = any(call.phase == "train" for t in d.ev.traces.values() for call in t.calls)
    for loader, by_rank in first.items():
        if any(p.head for p in by_rank.values()):
            found.ran.append(_fast_forwarded(loader, by_rank))
            continue
        if not any(p.budget_cut for p in by_rank.values()):
            continue  # the passes ran to their ends: the run itself shows them
        ran = max(p.batches for p in by_rank.values())
        lengths = {r: p.length for r, p in by_rank.items()}
        known = {n for n in lengths.values() if n is not None}
        if None in lengths.values():
            if train_calls:
                found.not_run.append(
                    Gap(
                        f"the end of a pass over train loader {loader}: the dry run stopped it after "
                        f"{ran} batches and its length is unknown (an IterableDataset), so whether "
                        "every rank's pass ends at the same step was not checked",
                        True,
                    )
                )
            continue
        if len(known) == 1:
            found.ran.append(
                f"train loader {loader}: {ran} of {known.pop()} batches a pass ran; the same length "
                "on every rank, so every rank's pass ends at the same step"
            )
        # lengths that differ: rules/quiet.uneven_train_loader says so, an error


def _fast_forwarded(loader: str, by_rank: dict[int, LoaderPass]) -> str:
    """A train pass run to its end past a skip (record/fastforward.py), in words."""
    some = next(p for p in by_rank.values() if p.head)
    lengths = sorted({n for p in by_rank.values() if (n := p.true_length) is not None})
    span = f"{lengths[0]:,}" + (f" to {lengths[-1]:,}" if len(lengths) > 1 else "")
    ended = [r for r, p in sorted(by_rank.items()) if p.exhausted]
    if len(ended) == len(by_rank):
        reached = "to its end on every rank"
    elif ended:
        reached = f"and rank(s) {', '.join(map(str, ended))} ended it"
    else:
        reached = "and no rank ended it (the findings say where they stopped)"
    if not some.skipped:
        return f"train loader {loader}: its first pass ran in full ({span} batches), {reached}"
    return (
        f"train loader {loader}: the first {some.head} and the last batches of {span} of its first "
        f"pass ran, the {some.skipped:,} between them skipped alike on every rank (not loaded), {reached}"
    )


def _lint_errors_in(action: PeriodicAction, checked: list[Finding]) -> list[Finding]:
    """Of lint's findings on the action's file, the errors its test decides or a call in
    its body reaches."""
    first, last = action.body
    errors = []
    for finding in checked:
        where = located(finding)
        if finding.severity is not Severity.ERROR:
            continue
        if where.condition_line == action.line or (where.call_line and first <= where.call_line <= last):
            errors.append(finding)
    return errors


def _user_files(d: Context) -> list[str]:
    """The script and the user's files its recorded collectives were called through."""
    files = {t.script for t in d.ev.traces.values() if t.script}
    for trace in d.ev.traces.values():
        for call in trace.calls:
            files.update(f.file for f in call.user_stack if is_user(f.file))
    return sorted(f for f in files if f.endswith(".py") and os.path.isfile(f))


def _periodic_actions(d: Context, found: Coverage, linter: Linter) -> None:
    actions: list[PeriodicAction] = []
    for path in _user_files(d):
        actions += periodic_actions(linter, Path(path))
    if not actions:
        return
    reached: set[tuple[str, int]] = set()
    for trace in d.ev.traces.values():
        for call in trace.calls:
            reached.update((os.path.realpath(f.file), f.line) for f in call.user_stack)
            if call.site is not None:
                reached.add((os.path.realpath(call.site.file), call.site.line))
    made_to_fire = {
        (os.path.realpath(f.file), f.line)
        for t in d.ev.traces.values()
        for kind, f in t.fired
        if kind == "made to fire"
    }
    for action in actions:
        path = os.path.realpath(action.path)
        first, last = action.body
        where = f"{relative(str(action.path), d.ev.cwd)}:{action.line}"
        if any(p == path and first <= line <= last for p, line in reached):
            made = (path, action.line) in made_to_fire
            found.ran.append(
                f"`if {action.test}` at {where} "
                + ("was made to fire at its first test (its own step was not reached)" if made else "fired")
                + ": its collectives ran"
            )
            continue
        chain = " -> ".join(action.collective.chain)
        for finding in _lint_errors_in(action, _checked(linter, action.path, found)):
            _decided_by_the_source(d, finding, f"`if {action.test}` at {where} never fired", found)
        found.not_run.append(
            Gap(
                f"`if {action.test}` at {where} never fired in the dry run: it reaches "
                f"{action.collective.label} ({chain}); whether every rank takes it together was "
                "not checked (run with a larger --train-steps, or make it fire early to check it)",
                action.collective.certain,
            )
        )
