"""Reading the source around a call that only some ranks made: the rank test, early exit,
loop exit or test on the data that sent the ranks different ways. Preflight reaches it
from a divergence of the traces, doctor from ranks waiting at different lines."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.communicates import shards_parameters
from ncclcheck.explain import lines
from ncclcheck.explain.context import Context, Fork
from ncclcheck.explain.engine import (
    REASON_OF_KIND,
    Explanation,
    Reason,
    ReasonKind,
    cause_of_exit,
    first_explanation,
    reason_of_local_decision,
)
from ncclcheck.explain.rules.orders import loop_in_each_ranks_own_order
from ncclcheck.lint.decisions import decision_at, decisions_of_the_program
from ncclcheck.model import CollectiveCall, Frame
from ncclcheck.record.tracefile import End
from ncclcheck.source import loaders, reading
from ncclcheck.wording import (
    issuer_advice,
    its,
    op_text,
    who,
)


def explain_fork(fork: Fork) -> Explanation:
    """The source's reading of the fork, then what a replay measured, where there is one.

    A rank test around the call itself is certain from the source alone. Where the
    replay saw the construct the source named, the source's cause stands (it sees what a
    replay does not: a read of a dist.reduce result, a clock) and the lines and values
    are added to its finding, unless the values themselves told that an unspecific test
    tested the data. Where the replay saw another construct, or the source found none,
    the measurement replaces the source's reading."""
    explanation = first_explanation(FORK_RULES, fork)
    assert explanation is not None, "the last rule always answers"
    replay = fork.d.ev.lines
    if replay is None and fork.d.ev.traces and not is_certain(explanation):
        # a first run's fork the source was not certain of: a replay would decide it
        explanation.replay_plan = lines.plan_of(fork)
    found = lines.decided(fork, replay) if replay is not None and replay.usable else None
    if found is None or is_certain(explanation):
        return explanation
    measured = what_the_lines_show(fork, found)
    reason = explanation.reason
    same = reason is not None and fork.d.site(reason.site) in {
        fork.d.site(Frame(found.frame.file, n, "")) for n in found.lines
    }
    if same and (measured.cause is explanation.cause or not found.sharpened):
        explanation.evidence += measured.evidence[len(fork.evidence) :]
        return explanation
    return measured


def is_certain(explanation: Explanation) -> bool:
    """A rank test around the call itself: the source alone says why, no replay needed."""
    reason = explanation.reason
    return (
        reason is not None
        and reason.kind is ReasonKind.RANK_TEST
        and explanation.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    )


_EXITS = ("return", "break", "continue")  # Decided.statement's first word for an exit


def what_the_lines_show(f: Fork, found: lines.Decided) -> Explanation:
    """The construct a replay saw one side take and the other not (explain/lines.py):
    the except that swallowed an exception, the exit and the values its test read, the
    loop that ran more passes."""
    d = f.d
    seconds = d.ev.lines.seconds if d.ev.lines is not None else 0.0
    call, made, other = f.call, f.made, f.other
    if f.alt is not None and set(found.side) == set(made) and found.statement.split()[0] in _EXITS:
        # the ranks that took the exit are the ones that went on: the call they left behind,
        # the other side's, is the one the exit skips (a rank-0 block the others return from)
        call, made, other = f.alt, f.other, f.made
    finding = call_finding(
        d,
        found.cause,
        f"{found.headline}: the ranks parted there, and {who(made)} went on to {op_text(call)} at "
        f"{d.site(call.site)} that {who(other)} never made",
        call,
        made,
        other,
        [
            *f.evidence,
            f"line evidence from a replay of the dry run up to the divergence ({seconds:.1f} s), "
            f"in {found.frame.function}():",
            *found.evidence,
        ],
        Reason(found.kind, found.frame, found.statement),
    )
    if found.kind is ReasonKind.LOOP_EXIT:
        # a loop's extra pass: its call of a sharded model, not a layer inside the model
        finding.site = d.model_call_site(call)
    return finding


def rank_test_around_the_call(f: Fork) -> Explanation | None:
    """A rank test around the call, in the shared frame or below it; the minority's
    call too (on 16 ranks, rank 0's lone all_reduce is the minority, not the barrier)."""
    d, alt = f.d, f.alt
    alt_made = sorted(
        r
        for r in f.other
        if alt is not None
        and (theirs := f.calls[r]) is not None
        and (theirs.op, theirs.site) == (alt.op, alt.site)
    )
    sides = [(f.call, f.stack, f.made, f.other)]
    if alt is not None and alt_made:
        sides.append((alt, alt.user_stack, alt_made, sorted(set(f.members) - set(alt_made))))
    for side_call, side_stack, side_made, side_other in sides:
        around = _guard_around(side_stack[max(f.common - 1, 0) :], reading.RANK)
        if around is not None:
            frame, guard = around
            deciding = Frame(frame.file, guard.line, "")
            where = d.site(deciding)
            return call_finding(
                d,
                Cause.RANK_CONDITIONAL_COLLECTIVE,
                f"only {who(side_made)} reached {op_text(side_call)} at "
                f"{d.site(side_call.site)} in "
                f"{side_call.site.function if side_call.site else '?'}(), under "
                f"`if {guard.text}`; {who(side_other)} never called it",
                side_call,
                side_made,
                side_other,
                [*f.evidence, f"`if {guard.text}` at {where} sends {who(side_made)} to it"],
                Reason(ReasonKind.RANK_TEST, deciding, f"if {guard.text}"),
            )
    return None


def early_exit_before_the_call(f: Fork) -> Explanation | None:
    """An early exit, in a function the absent ranks left, before the call: a ``return``
    or ``raise`` under a test, or a handler that returns (a step that raised on one rank,
    caught, `return None`). The function is on the side that made the call; or, where that
    side's own frames end in the frames both share (it waits in library code called from
    there: a Lightning loop's own broadcast), on the other side, which is still in it."""
    d = f.d
    sides = [(f.stack[f.common :] or f.stack[-1:], f.call, f.made, f.other)]
    if f.alt is not None and f.common > 0 and len(f.stack) <= f.common < len(f.alt_stack):
        sides.append((f.alt_stack[f.common :], f.alt, f.other, f.made))
    for frames, call, made, other in sides:
        for frame in frames:
            function = reading.enclosing_function(frame.file, frame.line)
            if function is None:
                continue
            exits = [
                g
                for g in reading.conditional_exits(frame.file, function, frame.line)
                if g.statement in ("return", "raise")
            ]
            caught = reading.try_that_returns(function, frame.line)
            if caught is not None and (not exits or caught[1].lineno > exits[-1].line):
                return _a_handler_returned(f, frame, caught, call, made, other)
            if exits:
                guard = exits[-1]
                deciding = Frame(frame.file, guard.line, "")
                where = d.site(deciding)
                return call_finding(
                    d,
                    cause_of_exit(guard.kind),
                    f"{who(other)} left {frame.function}() early through the "
                    f"`{guard.statement}` at {where} and "
                    f"missed the {op_text(call)} at {d.site(call.site)} that "
                    f"{who(made)} waited in",
                    call,
                    made,
                    other,
                    [
                        *f.evidence,
                        f"`{guard.statement}` under `if {guard.text}` at {where} leaves "
                        f"{frame.function}() before the call",
                    ],
                    Reason(ReasonKind.EARLY_EXIT, deciding, f"{guard.statement} under if {guard.text}"),
                )
    return None


def _a_handler_returned(
    f: Fork,
    frame: Frame,
    caught: tuple[ast.Try, ast.ExceptHandler],
    call: CollectiveCall,
    made: list[int],
    other: list[int],
) -> Explanation:
    """``except ...: return`` before the call in the function ``frame`` is in: a rank whose
    step raised there left the function and missed the call (rank-exception)."""
    d = f.d
    swallowing, handler = caught
    deciding = Frame(frame.file, handler.lineno, "")
    where = d.site(deciding)
    kinds = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
    return call_finding(
        d,
        Cause.RANK_EXCEPTION,
        f"{who(made)} waited in {op_text(call)} at {d.site(call.site)} in {frame.function}(); "
        f"{who(other)} did not reach it: the handler at {where} (`except{kinds}: ... return`) leaves "
        f"{frame.function}() before that call on a rank whose try at "
        f"{d.site(Frame(frame.file, swallowing.lineno, ''))} raised, the likely way {who(other)} missed it",
        call,
        made,
        other,
        [
            *f.evidence,
            f"`except{kinds}` at {where} returns from {frame.function}() before the call: a rank "
            "whose try raised skips it, while the others go on to it",
            *(
                d.caught_by(sorted([*made, *other]), frame.file, swallowing)
                or [
                    f"what would decide: {its(other)} output from the handler (an error logged there), "
                    "or `ncclcheck preflight`, whose ranks record each error a handler catches"
                ]
            ),
        ],
        Reason(ReasonKind.SWALLOWED_ERROR, deciding, "except"),
    )


def a_loop_one_side_left(f: Fork) -> Explanation | None:
    """A loop one side left: the break/return that ended it, and its condition. A side
    that ran to the end of the script has left every loop its last call was in."""
    d, evidence = f.d, list(f.evidence)
    if f.alt is None and f.other and all(d.exit_of(r)[0] is End.RETURNED for r in f.other):
        left = loop_left(d, f.stack[-1], None, f.made, f.other, f.call, evidence)
        if left is not None:
            return left
    if f.common and f.alt_stack:
        shared = f.stack[f.common - 1]
        alt_frame = f.alt_stack[f.common - 1]
        for inside, outside, inside_ranks, outside_ranks in (
            (shared, alt_frame, f.made, f.other),
            (alt_frame, shared, f.other, f.made),
        ):
            left = loop_left(d, inside, outside.line, inside_ranks, outside_ranks, f.call, evidence)
            if left is not None:
                return left
    return None


def a_function_one_side_returned_from(f: Fork) -> Explanation | None:
    """A function one side has returned from, whose loop the other is still in; the loop
    may be in a function called from there (a comprehension's frame, then generate()'s
    decoding loop): the outermost that has an exit."""
    if 0 < f.common < len(f.stack) and len(f.alt_stack) <= f.common:
        for frame in f.stack[f.common :]:
            left = loop_left(f.d, frame, None, f.made, f.other, f.call, list(f.evidence))
            if left is not None:
                return left
    return None


def a_test_the_ranks_answered_differently(f: Fork) -> Explanation | None:
    """A test around the call that the ranks answered differently: one on the data
    (`if h.shape[0] > 1: h = self.bn(h)`), or one on a value each rank reads for itself
    (`if os.path.exists(ckpt)` while rank 0 writes it, a clock, a random draw)."""
    d = f.d
    for kind in (reading.DATA, reading.OTHER):
        around = _guard_around(f.stack[max(f.common - 1, 0) :], kind)
        if around is None:
            continue
        frame, guard = around
        if kind == reading.DATA:
            cause, what, test_is = Cause.DATA_DEPENDENT_BRANCH, "a test on the data", "tests the data"
            reason_kind = ReasonKind.DATA_TEST
        else:
            reads = " and ".join(reading.rank_local_reads(guard.text, frame.file, guard.line))
            if not reads:
                continue
            cause = Cause.UNSYNCHRONIZED_DECISION
            what = f"a test each rank answers for itself ({reads}, never synchronised)"
            test_is = f"is {reads} each rank makes for itself"
            reason_kind = ReasonKind.LOCAL_TEST
        deciding = Frame(frame.file, guard.line, "")
        where = d.site(deciding)
        return call_finding(
            d,
            cause,
            f"only {who(f.made)} reached {op_text(f.call)} at {d.site(f.call.site)}, under "
            f"`if {guard.text}`, {what}; {who(f.other)} skipped it",
            f.call,
            f.made,
            f.other,
            [
                *f.evidence,
                f"`if {guard.text}` at {where} {test_is}: {who(f.made)} passed it, {who(f.other)} did not",
            ],
            Reason(reason_kind, deciding, f"if {guard.text}"),
        )
    return None


def a_watched_decision_the_ranks_took_apart(f: Fork) -> Explanation | None:
    """A test lint reads as a decision on a rank's own value (lint/decisions.py), watched in
    the run (record/firing.py), that the two sides took differently, in a function on
    either side's call chain: measured, not read. The collective it decides is the one on
    the side whose chain passes through the test's function after the test (the save a
    clock let one rank into), else the call the ranks parted at."""
    d = f.d
    sides: dict[tuple[str, int], dict[int, set[bool]]] = {}
    function_of: dict[tuple[str, int], str] = {}
    for rank in f.members:
        trace = d.ev.traces.get(rank)
        for decided in trace.decided if trace else []:
            key = (os.path.realpath(decided.site.file), decided.site.line)
            sides.setdefault(key, {}).setdefault(rank, set()).add(decided.taken)
            function_of[key] = decided.site.function
    on_the_way = {
        (os.path.realpath(frame.file), frame.function.rsplit(".", 1)[-1])
        for frame in [*f.stack[max(f.common - 1, 0) :], *f.alt_stack[max(f.common - 1, 0) :]]
    }
    for (path, line), taken in sides.items():
        if (path, function_of[(path, line)].rsplit(".", 1)[-1]) not in on_the_way:
            continue
        made_sides = set().union(*(taken.get(r, set()) for r in f.made))
        other_sides = set().union(*(taken.get(r, set()) for r in f.other))
        if made_sides == other_sides:
            continue
        decision = decision_at(path, line)
        test = reading.decision_at(path, line)
        if decision is None or test is None:
            continue
        call, made, other = f.call, f.made, f.other
        if f.alt is not None and _after_the_test(f.alt.user_stack, path, line):
            call, made, other = f.alt, f.other, f.made
        deciding = Frame(path, line, function_of[(path, line)])
        where = d.site(deciding)
        took = "; ".join(
            f"{who(ranks)} {_sides_said(taken_sides)}"
            for ranks, taken_sides in ((f.made, made_sides), (f.other, other_sides))
        )
        return call_finding(
            d,
            decision.cause,
            f"`{test}` at {where}, a decision each rank takes on a value of its own, went one way "
            f"on {who(made)} and another on {who(other)}: {who(made)} went on to {op_text(call)} at "
            f"{d.site(call.site)} that {who(other)} never made",
            call,
            made,
            other,
            [
                *f.evidence,
                f"the test, watched in the run: {took}",
                f"lint's reading of it: {decision.reading}",
            ],
            Reason(reason_of_local_decision(decision.cause), deciding, test),
        )
    return None


def _after_the_test(stack: list[Frame], path: str, line: int) -> bool:
    """A frame of ``stack`` in the test's function, past the test: the call it let through."""
    function = reading.enclosing_function(path, line)
    return function is not None and any(
        os.path.realpath(frame.file) == path
        and line < frame.line <= (function.end_lineno or frame.line)
        and function.lineno <= line
        for frame in stack
    )


def _sides_said(sides: set[bool]) -> str:
    if sides == {True, False}:
        return "took both sides"
    if not sides:
        return "never reached it"
    return f"found it {'true' if True in sides else 'false'} each time"


def one_call_in_a_loop_reaches_other_functions(f: Fork) -> Explanation | None:
    """Both sides reached their collectives from the same call of a loop, through different
    functions (``for name, meter in meters.items(): meter.compute()``): the loop meets its
    items in another order on each rank (a dict or set filled in the order each rank met
    its own data), or meets other items. Their collectives pair in a different order."""
    if f.alt is None or f.common == 0 or f.common >= min(len(f.stack), len(f.alt_stack)):
        return None
    caller, alt_caller = f.stack[f.common - 1], f.alt_stack[f.common - 1]
    if caller.line != alt_caller.line:
        return None
    loop = reading.innermost_loop(caller.file, caller.line)
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    d = f.d
    callee, alt_callee = f.stack[f.common], f.alt_stack[f.common]
    items = ast.unparse(loop.iter)
    loop_site = Frame(caller.file, loop.lineno, "")
    return call_finding(
        d,
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"{who(f.made)} called {op_text(f.call)} at {d.site(f.call.site)} in {callee.function}(), "
        f"{who(f.other)} {op_text(f.alt)} at {d.site(f.alt.site)} in {alt_callee.function}(), both "
        f"from the call at {d.site(caller)} in the loop over `{items}` at {d.site(loop_site)}: the "
        "loop meets its items in a different order on each rank (a dict or set filled in the "
        "order each rank met its own data), or meets other items",
        f.call,
        f.made,
        f.other,
        [
            *f.evidence,
            f"on every rank, loop over the same items in the same order: `sorted({items})`, or a "
            "fixed list every rank builds alike, not one filled from the rank's own data",
        ],
        Reason(ReasonKind.LOOP_ORDER, loop_site, f"for ... in {items}"),
    )


def a_pass_one_side_skipped(f: Fork) -> Explanation | None:
    """Both sides in one pass of a loop, at different calls: a ``continue`` under a test
    (a NaN loss, an empty batch) let some rank skip the rest of a pass, its collectives
    included, and the ranks have been a call apart since; or a try whose handler
    swallowed an error did."""
    if not f.common or len(f.alt_stack) < f.common:
        return None
    here, there = f.stack[f.common - 1], f.alt_stack[f.common - 1]
    for loop in reading.enclosing_loops(here.file, here.line):
        if not reading.contains(loop, there.line) or here.line == there.line:
            continue
        d, loop_site = f.d, f.d.site(Frame(here.file, loop.lineno, ""))
        guard = skipped_pass(here.file, loop, max(here.line, there.line))
        if guard is not None:
            skip = SkippedPass.of(d, here.file, guard)
            return call_finding(
                d,
                skip.cause,
                f"{who(f.made)} and {who(f.other)} are at different calls of one pass of the loop at "
                f"{loop_site}: {skip.said} skips the rest of a pass, its collectives included, on the "
                f"ranks where {kind_said(guard.kind)}, and the ranks have been a call apart since",
                f.call,
                f.made,
                f.other,
                [*f.evidence, skip.evidence],
                skip.reason,
            )
        swallowing = reading.swallowing_try(here.file, here.line) or reading.swallowing_try(
            there.file, there.line
        )
        inside = swallowing is not None and reading.contains(loop, swallowing.lineno)
        deciding_file = here.file
        if not inside:
            # a function a pass calls, its call inside a try whose handler swallows errors
            # (a checkpoint's barrier in `try: save; barrier / except: warn`): a rank that
            # raised before it in that try left the call and went on to the next pass
            for frame in [*f.stack[f.common :], *f.alt_stack[f.common :]]:
                swallowing = reading.swallowing_try(frame.file, frame.line)
                if swallowing is not None:
                    inside, deciding_file = True, frame.file
                    break
        if swallowing is not None and inside:
            deciding = Frame(deciding_file, swallowing.lineno, "")
            where = d.site(deciding)
            call, made, other = f.call, f.made, f.other
            in_the_try = [
                fr
                for fr in f.alt_stack
                if fr.file == deciding_file and any(reading.contains(b, fr.line) for b in swallowing.body)
            ]
            if f.alt is not None and in_the_try:
                # the side waiting inside the try is at the call the raising side skipped
                call, made, other = f.alt, f.other, f.made
            return call_finding(
                d,
                Cause.RANK_EXCEPTION,
                f"{who(made)} and {who(other)} are at different calls of one pass of the loop at "
                f"{loop_site}, inside a try whose handler swallows errors ({where}): a rank that "
                f"raised there skipped {op_text(call)} at {d.site(call.site)}, the rest of its pass, and "
                "went on",
                call,
                made,
                other,
                [*f.evidence, *d.caught_by(sorted([*made, *other]), deciding_file, swallowing)],
                Reason(ReasonKind.SWALLOWED_ERROR, deciding, "try"),
            )
        return None
    return None


def kind_said(kind: str) -> str:
    return {
        reading.RANK: "the test reads the rank",
        reading.DATA: "the test reads the data, which differs per rank",
    }.get(kind, "the test reads a value each rank computes for itself")


@dataclass(frozen=True)
class SkippedPass:
    """A ``continue`` under a test that let some ranks skip the rest of a pass, as said."""

    cause: Cause
    said: str  # "`continue` under `if ...` (site)", for a message
    evidence: str
    reason: Reason

    @classmethod
    def of(cls, d: Context, path: str, guard: reading.Guard) -> SkippedPass:
        deciding = Frame(path, guard.line, "")
        where = d.site(deciding)
        inner = reading.where_the_sentinel_comes_from(path, guard)
        if inner is not None:
            # `if loss is None: continue` passes on a decision taken inside the function that
            # returned None: that test, on the data or the rank, is the deciding line
            decided = Frame(path, inner.decided_at, "")
            at = d.site(decided)
            return cls(
                cause_of_exit(inner.kind),
                f"`continue` under `if {guard.text}` ({where}), after a None returned under "
                f"`if {inner.text}` ({at})",
                f"`if {guard.text}: continue` at {where} passes on the test at {at}: `if {inner.text}: "
                f"return None`: {kind_said(inner.kind)}",
                Reason(
                    REASON_OF_KIND.get(inner.kind, ReasonKind.LOCAL_TEST),
                    decided,
                    f"if {inner.text}: return None",
                ),
            )
        return cls(
            cause_of_exit(guard.kind),
            f"`continue` under `if {guard.text}` ({where})",
            f"`if {guard.text}: continue` at {where}: {kind_said(guard.kind)}",
            Reason(
                REASON_OF_KIND.get(guard.kind, ReasonKind.LOCAL_TEST), deciding, f"if {guard.text}: continue"
            ),
        )


def skips_a_pass(inside: Frame, loop: ast.stmt) -> reading.Guard | None:
    """The ``continue`` that explains one collective fewer on some ranks in ``loop``, when
    its passes are the same on every rank: not over a loader built without a sampler
    (unsharded or sharded by hand), whose length is the likelier difference."""
    origin = loaders.loader_origin([(inside.file, inside.line)], loop)
    if origin is not None and origin.sampler is None:
        return None
    return skipped_pass(inside.file, loop, inside.line + 1)


def skipped_pass(path: str, loop: ast.stmt, before_line: int) -> reading.Guard | None:
    """The ``continue`` under a test of ``loop`` itself (not of a loop inside it) that
    comes before ``before_line``: the way a rank skips the rest of a pass."""
    for guard in reading.conditional_exits(path, loop, before_line):
        innermost = reading.innermost_loop(path, guard.line)
        if guard.statement == "continue" and innermost is not None and innermost.lineno == loop.lineno:
            return guard
    return None


def a_sharded_forward_each_rank_decides(f: Fork) -> Explanation | None:
    """Both sides at one line of the user's (a ``loss.backward()``, a model call), each in
    another collective of a sharded model (FSDP's or ZeRO-3's gathers and reduce-scatters,
    one per module a pass runs): the ranks ran other modules in that pass. A test lint
    reads as each rank's own decision that skips a sharded module's forward (LayerDrop on
    a per-rank random draw, a branch on the batch) is the likely reason: said as such,
    with what would confirm it, and with no rank set apart (each side made a call the
    other did not)."""
    if f.alt is None or not f.stack or not (_shards_parameters(f.call) and _shards_parameters(f.alt)):
        return None
    if [(x.file, x.line) for x in f.stack] != [(x.file, x.line) for x in f.alt_stack]:
        return None
    found = [
        decision
        for decision in decisions_of_the_program(Path(f.stack[0].file))[0]
        if decision.skips_a_sharded_forward
    ]
    if not found:
        return None
    d, decision = f.d, found[0]
    test = reading.decision_at(decision.path, decision.line) or "the test"
    deciding = Frame(decision.path, decision.line, "")
    skipped = Frame(decision.path, decision.call_line, "")
    ranks = sorted(f.members)
    others = [
        f"also each rank's own: `{reading.decision_at(x.path, x.line)}` at "
        f"{d.site(Frame(x.path, x.line, ''))}"
        for x in found[1:4]
    ]
    return d.explanation(
        decision.cause,
        f"{who(f.made)} waits in {op_text(f.call)}, {who(f.other)} in {op_text(f.alt)}, both at "
        f"{d.site(f.call.site)}: the ranks ran other modules of the sharded model in this pass. "
        f"`{test}` at {d.site(deciding)} skips the forward at {d.site(skipped)} on a value each "
        "rank draws for itself, the likely reason",
        ranks=ranks,
        absent_ranks=[],
        op=f.call.op,
        site=d.site(skipped),
        evidence=[
            *f.evidence,
            f"lint's reading of it: {decision.reading}",
            *others,
            "what would confirm it: the value each rank read there (py-spy dump --locals in the "
            "forward, or `ncclcheck preflight`, which makes one rank take the other side); make "
            "the decision once for all ranks (draw from a generator seeded alike on every rank, or "
            "broadcast rank 0's draw), or run the module and zero its output instead of skipping it",
            *issuer_advice(f.call),
        ],
        reason=Reason(reason_of_local_decision(decision.cause), deciding, test),
    )


def _shards_parameters(call: CollectiveCall) -> bool:
    return shards_parameters(call.issuer, call.op)


def nothing_in_the_source(f: Fork) -> Explanation:
    """Nothing in the source explains it: say so, report the place with no reason, list
    what the source shows on the way (each test, exit and swallowing try around or before
    the calls) and what would decide, and give no cause's fix. A value one side logged for
    a framework to reduce that the other side never did is a reason of its own."""
    evidence = list(f.evidence)
    for mine, mine_ranks, theirs_ranks, theirs in (
        (f.call, f.made, f.other, f.alt),
        (f.alt, f.other, f.made, f.call),
    ):
        if mine is not None and mine.later is not None and (theirs is None or theirs.later is None):
            evidence.append(
                f"{who(mine_ranks)}: {mine.later.by} reduces {mine.later.request} here; "
                f"{who(theirs_ranks)}: no such reduction at this point. If the names a rank logs "
                f"depend on its data (self.log_dict of per-rank keys), log the same names on "
                f"every rank"
            )
            return call_finding(
                f.d,
                Cause.RANK_CONDITIONAL_COLLECTIVE,
                f"{who(f.made)} called {op_text(f.call)} at {f.d.site(f.call.site)}; "
                f"{who(f.other)} did something else at that point",
                f.call,
                f.made,
                f.other,
                evidence,
                None,
            )
    candidates = _candidates(f)
    replay = f.d.ev.lines
    if replay is not None and replay.usable:
        differing = lines.differing(f, replay)
        evidence += [f"line evidence (a replay up to the divergence): {line}" for line in differing] or [
            "line evidence (a replay up to the divergence): the functions on the call chains ran the same "
            "lines the same number of times on every rank"
        ]
    evidence += [f"on the way, the source shows: {line}" for line in candidates] or [
        "on the way, the source shows no test, exit or swallowing try around or before these calls"
    ]
    evidence.append(
        "what would decide: the values each rank read there (`ncclcheck preflight --perturb` makes "
        "rank-local values differ on purpose; doctor reads py-spy's --locals), or the ranks' "
        "collective sequences (run with TORCH_FR_BUFFER_SIZE=2000 and give doctor the Flight "
        "Recorder dumps)"
    )
    explanation = f.d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"{who(f.made)} called {op_text(f.call)} at {f.d.site(f.call.site)}; {who(f.other)} did not: "
        "the ranks parted here, and the reason was not found in the source (no rank test, exit, "
        "loop exit, skipped pass or test on the data or on a rank-local value on the way)",
        ranks=f.made,
        absent_ranks=f.other,
        op=f.call.op,
        site=f.d.site(f.call.site),
        evidence=evidence,
    )
    explanation.fix = ""  # no cause was found: no cause's fix
    return explanation


def _candidates(f: Fork) -> list[str]:
    """Each test, exit and swallowing try around or before the two sides' calls."""
    found: dict[str, None] = {}
    for stack in (f.stack[max(f.common - 1, 0) :], f.alt_stack[max(f.common - 1, 0) :]):
        for frame in stack:
            for guard in reading.guards_of(frame.file, frame.line):
                found[f"`if {guard.text}` at {f.d.site(Frame(frame.file, guard.line, ''))}"] = None
            function = reading.enclosing_function(frame.file, frame.line)
            if function is not None:
                for exit_ in reading.conditional_exits(frame.file, function, before_line=frame.line):
                    deciding = Frame(frame.file, exit_.line, "")
                    where = f.d.site(deciding)
                    found[f"`{exit_.statement}` under `if {exit_.text}` at {where}"] = None
            swallowing = reading.swallowing_try(frame.file, frame.line)
            if swallowing is not None:
                deciding = Frame(frame.file, swallowing.lineno, "")
                where = f.d.site(deciding)
                found[f"a try at {where} whose handler swallows errors"] = None
    return list(found)[:8]


def one_pass_of_a_loop_over_items_each_rank_orders(fork: Fork) -> Explanation | None:
    """The two sides wait in other calls of one function, both inside one loop of it, and
    that loop's items come from a set (or a dict filled on first sight): the ranks are at
    one pass with other items, which took other branches (rules/orders.py)."""
    if fork.alt is None or not fork.call.user_stack or not fork.alt.user_stack:
        return None
    here, there = fork.call.user_stack[-1], fork.alt.user_stack[-1]
    if (here.file, here.function) != (there.file, there.function) or here.line == there.line:
        return None
    shared = {loop.lineno for loop in reading.enclosing_loops(here.file, here.line)} & {
        loop.lineno for loop in reading.enclosing_loops(there.file, there.line)
    }
    if not shared:
        return None
    return loop_in_each_ranks_own_order(fork.d, fork.members, fork.calls, fork.call, False, fork.evidence)


FORK_RULES = (
    rank_test_around_the_call,
    one_pass_of_a_loop_over_items_each_rank_orders,
    early_exit_before_the_call,
    a_loop_one_side_left,
    a_function_one_side_returned_from,
    a_pass_one_side_skipped,
    a_test_the_ranks_answered_differently,
    one_call_in_a_loop_reaches_other_functions,
    # measured where the source reading found nothing: the rules above say more (the loop
    # left, the values a replay read) where they apply
    a_watched_decision_the_ranks_took_apart,
    a_sharded_forward_each_rank_decides,
    nothing_in_the_source,
)


def call_finding(
    d: Context,
    cause: Cause,
    message: str,
    call: CollectiveCall,
    made: list[int],
    absent: list[int],
    evidence: list[str],
    reason: Reason | None = None,
) -> Explanation:
    """A finding sited at ``call``, with what to do when library code issued it (which,
    when there is some, replaces the playbook's fix in the framework's terms: that one
    is about another API of the framework)."""
    advice = issuer_advice(call)
    return d.explanation(
        cause,
        message,
        ranks=made,
        absent_ranks=absent,
        op=call.op,
        site=d.site(call.site),
        evidence=[*evidence, *advice],
        libraries=() if advice else call.libraries,
        reason=reason,
    )


def loop_left(
    d: Context,
    inside: Frame,
    outside_line: int | None,
    inside_ranks: list[int],
    outside_ranks: list[int],
    call: CollectiveCall,
    evidence: list[str],
) -> Explanation | None:
    """The loop around ``inside`` that the outside ranks left (one that does not hold
    ``outside_line``; any, when they left the whole function), through which
    break/return, under which condition."""
    exits: list[reading.Guard] = []
    skipped: tuple[ast.stmt, reading.Guard] | None = None
    for loop in reading.enclosing_loops(inside.file, inside.line):
        if outside_line is not None and reading.contains(loop, outside_line):
            return None  # both sides are in this loop: it is not the one left
        exits = [
            g for g in reading.conditional_exits(inside.file, loop) if g.statement in ("break", "return")
        ]
        ended = reading.while_test(inside.file, loop)
        if not exits and ended is not None:
            exits = [ended]  # no break: the loop's own test ended it
        if exits:
            break
        if isinstance(loop, (ast.For, ast.AsyncFor)) and _counts_from_the_rank(inside.file, loop):
            return _passes_from_the_rank(d, inside, loop, inside_ranks, outside_ranks, call, evidence)
        if skipped is None:
            found = skips_a_pass(inside, loop)
            skipped = (loop, found) if found is not None else None
    if not exits:
        if skipped is None:
            return None
        loop, guard = skipped
        skip = SkippedPass.of(d, inside.file, guard)
        return d.explanation(
            skip.cause,
            f"{who(inside_ranks)} made one {op_text(call)} more than {who(outside_ranks)} in the loop at "
            f"{d.site(Frame(inside.file, loop.lineno, ''))}: its passes are the same on every rank, but "
            f"{skip.said} skips the rest of a pass, its collectives included, on the ranks where "
            f"{kind_said(guard.kind)}",
            ranks=inside_ranks,
            absent_ranks=outside_ranks,
            op=call.op,
            site=d.model_call_site(call),
            evidence=[*evidence, skip.evidence],
            reason=skip.reason,
        )
    guard = exits[-1]
    cause = cause_of_exit(guard.kind)
    # sited at the exit, like every exit; the test above it is said beside it
    deciding = Frame(inside.file, guard.line, "")
    where = d.site(deciding)
    tested_at = d.site(Frame(inside.file, guard.decided_at, ""))
    # a test on what dist.reduce left on a rank that is not its dst (rooted.py)
    rooted = [
        (rank, read)
        for rank, trace in sorted(d.ev.traces.items())
        for read in trace.rooted_reads
        if read.site.file == inside.file
        and reading.decision_at(read.site.file, read.site.line) in (f"if {guard.text}", f"while {guard.text}")
    ]
    how = (
        f"when `{guard.text}` turned false"
        if guard.statement == "while"
        else f"through `{guard.statement}` at {where} under `if {guard.text}` at {tested_at}"
    )
    evidence.append(
        f"{who(outside_ranks)} left the loop at {d.site(Frame(inside.file, loop.lineno, ''))} "
        f"in {inside.function}() {how}; {who(inside_ranks)} stayed in it"
    )
    keyword = "while" if guard.statement == "while" else "if"
    message = (
        f"{who(outside_ranks)} and {who(inside_ranks)} decided differently at "
        f"`{keyword} {guard.text}` ({tested_at})"
    )
    if rooted:
        cause = Cause.UNSYNCHRONIZED_DECISION
        rank, read = rooted[0]
        message += (
            f": it reads what dist.reduce at {d.site(read.reduce_site)} left on rank {rank}, "
            f"not the result, which only rank {read.dst} receives"
        )
    elif cause == Cause.UNSYNCHRONIZED_DECISION:
        message += ": its value differs per rank and was never synchronised"
    return d.explanation(
        cause,
        message,
        ranks=outside_ranks,
        absent_ranks=inside_ranks,
        op=call.op,
        site=where,
        evidence=evidence,
        reason=Reason(ReasonKind.LOOP_EXIT, deciding, f"{guard.statement} under {keyword} {guard.text}"),
    )


def _counts_from_the_rank(path: str, loop: ast.For | ast.AsyncFor) -> bool:
    """``for ... in range(...)`` whose bounds are computed from the rank. A loop over a
    loader built from the rank is left to the rules that read loaders (uneven eval
    batches, a missing sampler), which know what it iterates."""
    if not isinstance(loop.iter, ast.Call):
        return False
    return reading.callee_name(loop.iter) == "range" and reading.reads_the_rank(path, loop.iter)


def _passes_from_the_rank(
    d: Context,
    inside: Frame,
    loop: ast.For | ast.AsyncFor,
    inside_ranks: list[int],
    outside_ranks: list[int],
    call: CollectiveCall,
    evidence: list[str],
) -> Explanation:
    """A loop without an exit over a range computed from the rank (``range(rank, n,
    world_size)``, ``range(num_batches)`` with a per-rank count): it ran more passes
    on some ranks, as the source alone shows. Over eval data, uneven-eval-batches; else
    an exit decided by the rank (what a replay's line counts name it too)."""
    header = f"for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}"
    deciding = Frame(inside.file, loop.lineno, "")
    where = d.site(deciding)
    cause = Cause.UNEVEN_EVAL_BATCHES if call.phase == "eval" else cause_of_exit(reading.RANK)
    return d.explanation(
        cause,
        f"{who(inside_ranks)} made one {op_text(call)} more than {who(outside_ranks)} in the loop "
        f"`{header}` at {where}: its iterable is computed from the rank, so its passes differ per rank",
        ranks=inside_ranks,
        absent_ranks=outside_ranks,
        op=call.op,
        site=d.model_call_site(call),
        evidence=[*evidence, f"the loop's iterable `{ast.unparse(loop.iter)}` is computed from the rank"],
        reason=Reason(ReasonKind.LOOP_EXIT, deciding, header),
    )


def _guard_around(frames: list[Frame], kind: str) -> tuple[Frame, reading.Guard] | None:
    """The first ``if`` of ``kind`` around the frames' lines: frames outermost first,
    each frame's tests innermost first."""
    for frame in frames:
        for guard in reading.guards_of(frame.file, frame.line):
            if guard.kind == kind:
                return frame, guard
    return None
