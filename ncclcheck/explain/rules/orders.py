"""Collectives made once per item of a loop whose items each process orders its own way:
a set (its strings hashed with each interpreter's seed), a dict filled on first sight (each
rank's data decides its order). One reading, for preflight's divergences and for the forks
doctor's stacks and preflight's source show."""

from __future__ import annotations

import ast

from ncclcheck.causes import Cause
from ncclcheck.explain.context import Context
from ncclcheck.explain.engine import Explanation
from ncclcheck.model import CollectiveCall, Frame
from ncclcheck.source import origins, reading
from ncclcheck.wording import who


def loop_in_each_ranks_own_order(
    d: Context,
    members: list[int],
    calls: dict[int, CollectiveCall | None],
    call: CollectiveCall,
    same_call: bool,
    evidence: list[str],
    dicts: bool = True,
) -> Explanation | None:
    """The call is made once per item of a loop whose items each process orders its own
    way: the same calls on every rank, in another order, so the n-th calls pair items of
    other sizes. Two sources of such an order: a set (a set of strings iterates in the
    order of their hashes, which Python randomises per process), and, where ``dicts``, a
    dict that takes each key the first time the process meets it (the order of each
    rank's own data). ``same_call``: the ranks wait in one call with other tensors (else in
    other calls of one pass, its items taking other branches)."""
    stack = call.user_stack
    for level in range(len(stack) - 1, -1, -1):
        frame = stack[level]
        for loop in reading.enclosing_loops(frame.file, frame.line):
            if not isinstance(loop, ast.For | ast.AsyncFor):
                continue
            items = ast.unparse(loop.iter)
            loop_site = d.site(Frame(frame.file, loop.lineno, ""))
            chain = origins.bindings(stack[: level + 1], loop.iter, origins.is_unordered)
            came = [f"{b} at {d.site(b.frame)}" for b in chain]
            unordered = next((b for b in chain if origins.is_unordered(b.value)), None)
            if unordered is not None or origins.is_unordered(loop.iter):
                source = unordered.text if unordered is not None else items
                why = f"whose items come from a set (`{source}`): each process meets them in its own order"
                how = (
                    "a set of strings iterates in the order of their hashes, which Python randomises "
                    "per process (PYTHONHASHSEED): the ranks of one job disagree"
                )
                fix = None  # the playbook's: sort
            else:
                filled = filled_on_first_sight(frame, loop.iter, chain) if dicts else None
                if filled is None:
                    continue
                dict_text, filling, filled_at = filled
                why = (
                    f"a dict (`{dict_text}`) that takes each key the first time the process meets it "
                    f"(`{filling}` at {d.site(filled_at)}): it holds its keys in the order each rank "
                    "first met them"
                )
                how = (
                    "a dict keeps its keys in insertion order: where what each rank meets first is its "
                    "own data's doing (a metric added under a test of the batch, a name read from a "
                    "record), the ranks' orders differ"
                )
                # sorting is not enough: a rank that never met a key has one call fewer
                fix = (
                    f"Create every key of `{dict_text}` up front, on every rank, in one fixed order (zeros "
                    "for what a rank never meets), or iterate a fixed list of names, not the dict's own "
                    "order; where the names cannot be known beforehand, all_gather_object them and "
                    "loop over the sorted union."
                )
            said = (
                f"{who(members)} call {call.op} at {d.site(call.site)}"
                if same_call
                else " and ".join(
                    f"{who([r])} calls {c.op} at {d.site(c.site)}"
                    for r, c in sorted(calls.items())
                    if c is not None
                )
            )
            explanation = d.explanation(
                Cause.COLLECTIVE_ORDER_MISMATCH,
                f"{said} once per item of the loop "
                f"over `{items}` at {loop_site}, {why}, so the n-th calls pair other items"
                + (" (of other sizes)" if same_call else " (which take other branches)"),
                ranks=members,
                absent_ranks=[],
                op=call.op,
                site=d.site(call.site),
                evidence=[
                    *evidence,
                    *([f"where the loop's items come from: {'; '.join(came)}"] if came else []),
                    how,
                ],
            )
            explanation.fix = fix
            return explanation
    return None


def filled_on_first_sight(
    frame: Frame, items: ast.expr, chain: list[origins.Binding]
) -> tuple[str, str, Frame] | None:
    """The dict a loop's items come from, where it is filled key by key on first sight:
    its text, the filling's source (its first line) and where that is."""
    candidates = [(frame, items), *((binding.frame, binding.value) for binding in chain)]
    for where, expr in candidates:
        filling = origins.filled_on_first_sight(where.file, where.line, expr)
        if filling is not None:
            first_line = ast.unparse(filling).splitlines()[0].rstrip(":")
            return ast.unparse(origins.followed(expr)), first_line, Frame(where.file, filling.lineno, "")
    return None
