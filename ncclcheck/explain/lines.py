"""Line evidence: the plan of a replay up to the divergence, what it saw, and the
construct that decided, read from the lines each rank ran.

preflight's first run says where the ranks parted (a ``Fork``); when the source
alone cannot say which construct sent them different ways with certainty (anything
but a rank test around the call itself), preflight replays the dry run with
record/lines.py tracing the functions on both sides' call chains and ending every
rank at its call of the divergence. This module writes that plan, reads what each
rank saw, checks that the replay made the same calls as the first run (a script
that draws unseeded random numbers or reads the clock may not), and names the
construct that decided from the lines one side ran and the other did not: the
``except`` that swallowed an exception (with the exception and the line that
raised it), the ``continue``/``break``/``return`` and the values its test read,
the loop that ran a different number of times.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ncclcheck.causes import Cause
from ncclcheck.evidence.replayed import Key, Replay
from ncclcheck.explain.context import Fork
from ncclcheck.explain.engine import REASON_OF_KIND, ReasonKind, cause_of_exit
from ncclcheck.model import Frame
from ncclcheck.source import reading
from ncclcheck.wording import who

# -- the plan ------------------------------------------------------------------------


def plan_of(fork: Fork) -> dict[str, Any]:
    """What to trace (the functions on both sides' call chains), which values to keep
    (the names the tests of their exits, branches and loops read) and where each rank
    stops (its call at the divergence, before it runs)."""
    targets: dict[tuple[str, str, int, int], None] = {}
    watch: dict[Key, list[str]] = {}
    for frame in [*fork.stack, *fork.alt_stack]:
        function = reading.enclosing_function(frame.file, frame.line)
        if function is None:
            targets[(frame.file, "<module>", 0, 0)] = None
            scope: ast.AST | None = reading.parse(frame.file)
        else:
            first = min([function.lineno, *(d.lineno for d in function.decorator_list)])
            targets[(frame.file, function.name, first, function.end_lineno or function.lineno)] = None
            scope = function
        if scope is not None:
            for key, names in _tests_in(frame.file, scope):
                watch.setdefault(key, names)
    stop = {str(rank): call.n for rank, call in fork.calls.items() if call is not None and call.n}
    return {
        "targets": [list(target) for target in targets],
        "watch": [[file, line, names] for (file, line), names in watch.items()],
        "stop": stop,
    }


def _tests_in(path: str, scope: ast.AST) -> Iterable[tuple[Key, list[str]]]:
    """(line, names) for each exit under an if (the if's test, read where the exit runs),
    each if, while and for header (its test or iterable), in ``scope`` but not in the
    functions it defines (module level: not inside any function)."""
    for guard in reading.conditional_exits(path, scope):
        names = read_names(ast.parse(guard.text, mode="eval").body)
        if names:
            yield (path, guard.line), names
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        expr = (
            node.test
            if isinstance(node, (ast.If, ast.While))
            else node.iter
            if isinstance(node, (ast.For, ast.AsyncFor))
            else None
        )
        if expr is not None and isinstance(node, ast.stmt):
            names = read_names(expr)
            if names:
                yield (path, node.lineno), names
        pending.extend(ast.iter_child_nodes(node))


def read_names(expr: ast.AST) -> list[str]:
    """The names and plain attribute chains an expression reads (``loss``,
    ``self.patience``), not the functions it calls: what a snapshot can show without
    running anything."""
    found: dict[str, None] = {}

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):  # loss.isnan(): loss is read
                visit(node.func.value)
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                visit(argument)
            return
        name = dotted(node)
        if name is not None:
            found[name] = None
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(expr)
    return list(found)[:6]


# -- what decided --------------------------------------------------------------------


@dataclass(frozen=True)
class Decided:
    """The construct the lines show one side took and the other did not."""

    kind: ReasonKind
    cause: Cause
    side: list[int]  # the ranks that took it (ran the line more often)
    others: list[int]
    frame: Frame  # the line of the construct (its function's name)
    statement: str  # "continue", "except ValueError", "while ...", "for ... in ..."
    headline: str  # what one side did and the other did not, for a message
    evidence: list[str]
    lines: frozenset[int] = frozenset()  # the lines that are this construct (its if, its try)
    sharpened: bool = False  # the values read, not the source, told that the test read the data


def decided(fork: Fork, replay: Replay) -> Decided | None:
    """The construct nearest the divergence that one side's lines show and the other's
    do not: a handler that swallowed an exception, then an exit under a test, then a
    loop that ran a different number of passes; in the deepest function first."""
    made = [r for r in fork.made if r in replay.ranks]
    other = [r for r in fork.other if r in replay.ranks]
    if not made or not other:
        return None
    # how deep each function is on the stack it lies on (not the place in both stacks one
    # after the other: the other side's main() is no deeper than this side's evaluate())
    depth: dict[tuple[str, str], int] = {}
    for stack in (fork.stack, fork.alt_stack):
        for i, f in enumerate(stack):
            depth[(f.file, f.function)] = max(depth.get((f.file, f.function), -1), i)
    # where the ranks last made a call alike: they parted after it, so of two loops that
    # ran more passes each on one side, the one around it decided (a rank that left its
    # validation loop a batch early then ran one more train pass: the train loop's extra
    # pass came after the parting)
    parted_after = _last_call_alike(fork)
    found: list[tuple[int, int, int, Decided]] = []
    keys = {key for rank in (*made, *other) for key in replay.ranks[rank].counts}
    for key in sorted(keys):
        sides = _ran_more(key, made, other, replay)
        if sides is None:
            continue
        side, rest = sides
        construct = _construct(fork, key, side, rest, replay)
        if construct is not None:
            priority, found_here = construct
            function = found_here.frame.function
            around = 0 if _around(found_here, parted_after) else 1
            found.append((priority, around, -depth.get((key[0], function), -1), found_here))
    if not found:
        return None
    found = [item for item in found if not _inside_a_loop_that_ran_more(item[3], found, fork)]
    found.sort(key=lambda item: item[:3])
    return found[0][3]


def _inside_a_loop_that_ran_more(
    inner: Decided, found: list[tuple[int, int, int, Decided]], fork: Fork
) -> bool:
    """A loop that ran more passes on one side only because a loop around its call ran more
    on that side too (the blocks of a model's forward(), run once more in an extra eval
    batch): the outer one decided. A loop whose outer loop ran alike on every rank (the
    ranks parted inside one pass) is not this."""
    if inner.kind != ReasonKind.LOOP_EXIT:
        return False
    stack = fork.stack if any(f.file == inner.frame.file for f in fork.stack) else fork.alt_stack
    here = next(
        (i for i, f in enumerate(stack) if f.file == inner.frame.file and f.function == inner.frame.function),
        None,
    )
    if here is None:
        return False
    for *_, outer in found:
        if outer is inner or outer.kind != ReasonKind.LOOP_EXIT or set(outer.side) != set(inner.side):
            continue
        for frame in stack[:here]:  # the callers of the inner loop's function
            if frame.file == outer.frame.file and any(
                loop.lineno == outer.frame.line for loop in reading.enclosing_loops(frame.file, frame.line)
            ):
                return True
    return False


def _last_call_alike(fork: Fork) -> list[Frame]:
    """The stack of the call each side made just before the divergence, where it is the
    same call site on both sides (the last point their histories share); none otherwise."""
    before: list[list[Frame]] = []
    for rank, call in ((fork.made[0], fork.call), (fork.other[0], fork.alt)):
        trace = fork.d.ev.traces.get(rank)
        if trace is None or call is None:
            return []
        earlier = [c for c in trace.calls if c.n < call.n]
        if not earlier:
            return []
        before.append(earlier[-1].user_stack)
    one, two = before
    if not one or not two or (one[-1].file, one[-1].line) != (two[-1].file, two[-1].line):
        return []
    return one


def _around(construct: Decided, stack: list[Frame]) -> bool:
    """Whether ``construct`` (a loop, by its header line) encloses a frame of ``stack``."""
    if construct.kind != ReasonKind.LOOP_EXIT:
        return False
    return any(
        frame.file == construct.frame.file and construct.frame.line == loop.lineno
        for frame in stack
        for loop in reading.enclosing_loops(frame.file, frame.line)
    )


def _ran_more(
    key: Key, made: list[int], other: list[int], replay: Replay
) -> tuple[list[int], list[int]] | None:
    """(the side that ran ``key`` more often on every rank, the other side), or None
    where the counts of the two sides overlap."""
    if not made or not other:
        return None
    a = [replay.ranks[r].count(key) for r in made]
    b = [replay.ranks[r].count(key) for r in other]
    if max(a) < min(b):
        return other, made
    if max(b) < min(a):
        return made, other
    return None


def _construct(
    fork: Fork, key: Key, side: list[int], rest: list[int], replay: Replay
) -> tuple[int, Decided] | None:
    path, line = key
    where = fork.d.site(Frame(path, line, ""))
    chain = reading.enclosing_chain(path, line)
    if not chain:
        return None
    node = chain[-1]
    function = reading.enclosing_function(path, line)
    frame = Frame(path, line, function.name if function is not None else "<module>")
    counts = _counts_text(key, side, rest, replay)
    if isinstance(node, ast.ExceptHandler) and node.lineno == line:
        caught = [
            e
            for r in side
            for e in replay.ranks[r].exceptions
            if e.get("file") == path
            and e.get("next_line") is not None
            and node.lineno <= int(e["next_line"]) <= (node.end_lineno or node.lineno)
        ]
        if not caught:
            return None
        handler = f"except {ast.unparse(node.type)}" if node.type is not None else "except"
        first = caught[0]
        raised = first.get("raised_at") or [first["file"], first["line"], first.get("function", "")]
        raised_site = fork.d.site(Frame(str(raised[0]), int(raised[1]), ""))
        reraises = any(isinstance(n, ast.Raise) for n in ast.walk(node))
        evidence = [
            f"{who(side)} raised {first['type']}: {first['message']} at {raised_site} in {raised[2]}() "
            f"({_times(int(first['count']))}); {who(rest)} raised nothing there",
            f"the handler `{handler}` at {where} ran {counts}"
            + ("" if reraises else " and does not re-raise: the error was swallowed"),
        ]
        return 0, Decided(
            ReasonKind.SWALLOWED_ERROR,
            Cause.RANK_EXCEPTION,
            side,
            rest,
            frame,
            handler,
            f"{who(side)} entered the `{handler}` at {where} with {first['type']}: {first['message']} "
            f"(raised at {raised_site}) and {who(rest)} did not",
            evidence,
            frozenset({line, *(n.lineno for n in chain if isinstance(n, ast.Try) and node in n.handlers)}),
        )
    if isinstance(node, (ast.Continue, ast.Break, ast.Return, ast.Raise)):
        guards = reading.guards_of(path, line)
        if not guards:
            return None
        guard = guards[0]
        statement = {ast.Continue: "continue", ast.Break: "break", ast.Return: "return", ast.Raise: "raise"}[
            type(node)
        ]
        values = _values_text(key, side, replay, "first")
        kind = _kind(guard.kind, guard.text, path, key, side, replay)
        evidence = [f"`{statement}` under `if {guard.text}` at {where} ran {counts}"]
        if values:
            evidence.append(f"the test read, when it sent {who(side)} out: {values}")
        if kind == reading.RANK:
            evidence.append(f"the test `{guard.text}` is computed from the rank")
        evidence += _where_the_flag_is_set(fork, guard.text)
        return 1, Decided(
            REASON_OF_KIND[kind],
            cause_of_exit(kind),
            side,
            rest,
            frame,
            f"{statement} under if {guard.text}",
            f"{who(side)} took the `{statement}` under `if {guard.text}` at {where}"
            + (f" ({values})" if values else "")
            + f" and {who(rest)} did not",
            evidence,
            frozenset({line, guard.line}),
            kind != guard.kind,
        )
    branch = _branch_entered(chain, line)
    if branch is not None:
        entered = _entered(fork, path, branch, key, side, rest, replay)
        if entered is not None:
            return entered
    loops = reading.enclosing_loops(path, line)
    if loops and (function is None or reading.contains(function, loops[0].lineno)):
        return _loop(fork, path, loops[0], replay)
    return None


def _branch_entered(chain: list[ast.AST], line: int) -> ast.If | None:
    """The innermost ``if`` whose body holds ``line``, within its loop and function."""
    for node in reversed(chain[:-1]):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if isinstance(node, ast.If):
            first, last = _body_span(node)
            return node if first <= line <= last else None
    return None


def _where_the_flag_is_set(fork: Fork, test: str) -> list[str]:
    """A test of a flag attribute decides what set the flag: where the files on either
    side's chain set it, and under which test (a callback's `if logs["loss"] <= target:
    control.should_training_stop = True`), the line a user looks for next."""
    paths = [f.file for f in (*fork.stack, *fork.alt_stack)]
    said = []
    for path, line, guard in reading.where_a_flag_is_set(paths, test)[:3]:
        where = fork.d.site(Frame(path, line, ""))
        under = f", under `if {guard.text}` ({fork.d.site(Frame(path, guard.line, ''))})" if guard else ""
        said.append(f"where `{test.rsplit('.', 1)[-1]}` is set: {where}{under}")
    return said


def _body_span(branch: ast.If) -> tuple[int, int]:
    """The first and last line of what ``branch`` runs when its test holds."""
    return branch.body[0].lineno, branch.body[-1].end_lineno or branch.body[-1].lineno


# the cause of a collective some ranks reach through an `if` and others do not, by what
# the test reads
_ENTERED_CAUSE = {reading.RANK: Cause.RANK_CONDITIONAL_COLLECTIVE, reading.DATA: Cause.DATA_DEPENDENT_BRANCH}


def _entered(
    fork: Fork, path: str, branch: ast.If, key: Key, side: list[int], rest: list[int], replay: Replay
) -> tuple[int, Decided] | None:
    """One side entered ``branch``, on the way to its call (a frame of a side's stack lies
    in its body), and the other came to its test as often and did not: the test decided
    differently, with what it read on each rank."""
    first, last = _body_span(branch)
    if not any(f.file == path and first <= f.line <= last for f in [*fork.stack, *fork.alt_stack]):
        return None  # a branch that only changed a value (a NaN injected): not where the calls part
    test_key = (path, branch.lineno)
    entered = max(replay.ranks[r].count(key) for r in side)
    if min(replay.ranks[r].count(test_key) for r in rest) < entered:
        return None  # the others did not come to the test as often: something before it parted them
    if _read_alike(branch.test, test_key, [*side, *rest], replay):
        # a test of plain values that read the same on every rank, as often, cannot have
        # gone two ways by itself: something the replay does not see made the sides differ
        # (an action made to fire on one rank, a pass cut short), so it is not the answer
        return None
    text = ast.unparse(branch.test)
    source_kind = reading.condition_kind(path, branch.test)
    kind = _kind(source_kind, text, path, test_key, side, replay)
    where = fork.d.site(Frame(path, branch.lineno, ""))
    values = _values_text(test_key, [*side, *rest], replay, "last")
    evidence = [f"the body of `if {text}` at {where} ran {_counts_text(key, side, rest, replay)}"]
    if values:
        evidence.append(f"what the test read last: {values}")
    if kind == reading.RANK:
        evidence.append(f"the test `{text}` is computed from the rank")
    function = reading.enclosing_function(path, branch.lineno)
    return 1, Decided(
        REASON_OF_KIND[kind],
        _ENTERED_CAUSE.get(kind, Cause.UNSYNCHRONIZED_DECISION),
        side,
        rest,
        Frame(path, branch.lineno, function.name if function is not None else "<module>"),
        f"if {text}",
        f"{who(side)} entered `if {text}` at {where} and {who(rest)} did not"
        + (f" ({values})" if values else ""),
        evidence,
        frozenset({branch.lineno}),
        kind != source_kind,
    )


def _loop(fork: Fork, path: str, loop: ast.stmt, replay: Replay) -> tuple[int, Decided] | None:
    """The loop around a line the sides ran a different number of times, when its passes
    differ (its first statement's count: a pass stopped at the divergence counts)."""
    if not isinstance(loop, (ast.While, ast.For, ast.AsyncFor)) or not loop.body:
        return None
    if isinstance(loop, ast.While) and isinstance(loop.test, ast.Constant):
        return None  # `while True`: its break/return decides
    first = (path, loop.body[0].lineno)
    sides = _ran_more(
        first,
        [r for r in fork.made if r in replay.ranks],
        [r for r in fork.other if r in replay.ranks],
        replay,
    )
    if sides is None:
        return None
    side, rest = sides
    header_key = (path, loop.lineno)
    if isinstance(loop, ast.While):
        expr, read, header = loop.test, "test", f"while {ast.unparse(loop.test)}"
    else:
        expr, read = loop.iter, "iterable"
        header = f"for {ast.unparse(loop.target)} in {ast.unparse(loop.iter)}"
    last = {r: _values_text(header_key, [r], replay, "last") for r in (*side, *rest)}
    shown = "; ".join(f"rank {r}: {v}" for r, v in last.items() if v)
    kind = _kind(reading.condition_kind(path, expr), ast.unparse(expr), path, header_key, side, replay)
    if kind != reading.RANK and reading.reads_the_rank(path, expr):
        kind = reading.RANK  # `range(num_batches)`, num_batches computed from the rank
    cause = cause_of_exit(kind)
    if not isinstance(loop, ast.While) and fork.call.phase == "eval":
        cause = Cause.UNEVEN_EVAL_BATCHES  # a loop of different length over eval data
    passes = _counts_text(first, side, rest, replay, ("pass", "passes"))
    where = fork.d.site(Frame(path, loop.lineno, ""))
    evidence = [f"the loop `{header}` at {where} ran {passes}"]
    if shown:
        evidence.append(f"what its {read} read last: {shown}")
    if kind == reading.RANK:
        evidence.append(f"its {read} `{ast.unparse(expr)}` is computed from the rank")
    function = reading.enclosing_function(path, loop.lineno)
    return 2, Decided(
        ReasonKind.LOOP_EXIT,
        cause,
        side,
        rest,
        Frame(path, loop.lineno, function.name if function is not None else "<module>"),
        header,
        f"{who(side)} ran more passes of the loop `{header}` at {where} than {who(rest)} ({passes})",
        evidence,
        frozenset({loop.lineno}),
        kind != reading.condition_kind(path, expr) and kind == reading.DATA,
    )


def _kind(kind: str, text: str, path: str, key: Key, side: list[int], replay: Replay) -> str:
    """The source's kind of a test, sharpened by what it read: a test that reads whole
    tensors only (a batch, not a scalar loss or metric), and no clock, file or random
    draw, tests the data."""
    if kind != reading.OTHER or reading.rank_local_reads(text, path):
        return kind
    seen = [v for r in side for v in replay.ranks[r].values.get(key, {}).get("first", {}).values()]
    # describe_value writes a tensor of more than 4 elements as "tensor dtype[shape]..."
    if seen and all(v.startswith("tensor ") for v in seen):
        return reading.DATA
    return kind


def _read_alike(test: ast.expr, key: Key, ranks: list[int], replay: Replay) -> bool:
    """Whether every rank came to the test as often and read the same values in it last,
    for a test of names and constants alone (a call in it may read what the snapshot
    does not hold: a clock, a file, a draw)."""
    if any(isinstance(node, ast.Call) for node in ast.walk(test)):
        return False
    if len({replay.ranks[r].count(key) for r in ranks}) != 1:
        return False
    snapshots = [replay.ranks[r].values.get(key, {}).get("last") for r in ranks]
    return all(snapshots) and all(s == snapshots[0] for s in snapshots)


def _values_text(key: Key, ranks: list[int], replay: Replay, which: str) -> str:
    parts = []
    for rank in ranks:
        snapshot = replay.ranks[rank].values.get(key, {}).get(which)
        if snapshot:
            shown = ", ".join(f"{name} = {value}" for name, value in snapshot.items())
            parts.append(f"{shown} on rank {rank}" if len(ranks) > 1 else shown)
    return "; ".join(parts)


def _counts_text(
    key: Key, side: list[int], rest: list[int], replay: Replay, unit: tuple[str, str] = ("time", "times")
) -> str:
    """'once on rank 1, 0 times on rank 0'; with unit ("pass", "passes"): '5 passes on ...'."""

    def text(ranks: list[int]) -> str:
        counts = sorted({replay.ranks[r].count(key) for r in ranks})
        if len(counts) == 1:
            return f"{_times(counts[0], unit)} on {who(ranks)}"
        return f"{'/'.join(map(str, counts))} {unit[1]} on {who(ranks)}"

    return f"{text(side)}, {text(rest)}"


def _times(count: int, unit: tuple[str, str] = ("time", "times")) -> str:
    if count == 1:
        return "once" if unit[0] == "time" else f"1 {unit[0]}"
    return f"{count} {unit[1]}"


def differing(fork: Fork, replay: Replay, limit: int = 6) -> list[str]:
    """The lines the two sides ran a different number of times, in the functions on the
    call chains, for a report that found no construct to name: what was seen."""
    made = [r for r in fork.made if r in replay.ranks]
    other = [r for r in fork.other if r in replay.ranks]
    if not made or not other:
        return []
    shown = []
    keys = sorted({key for rank in (*made, *other) for key in replay.ranks[rank].counts})
    for key in keys:
        a = {replay.ranks[r].count(key) for r in made}
        b = {replay.ranks[r].count(key) for r in other}
        if a != b:
            where = fork.d.site(Frame(key[0], key[1], ""))
            shown.append(f"{where} ran {_counts_text(key, made, other, replay)}")
    return shown[:limit]
