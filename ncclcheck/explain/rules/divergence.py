"""The rules for the first divergence of a dry run's histories: which ranks parted at
which call, and why (a cycle across groups, shapes, a rank that died or left, an uneven
loader, a skipped step, a straggler); the source reasoning is branch.py's."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from ncclcheck.causes import Cause
from ncclcheck.evidence.align import Divergence, Mismatch
from ncclcheck.evidence.traces import Decided, LoaderPass
from ncclcheck.explain.context import Context, Fork, death_cause, uncaught_fix
from ncclcheck.explain.engine import Explanation, Reason, first_explanation, reason_of_local_decision
from ncclcheck.explain.rules.branch import explain_fork, rank_test_around_the_call
from ncclcheck.explain.rules.orders import loop_in_each_ranks_own_order
from ncclcheck.lint.decisions import LocalDecision, decision_at
from ncclcheck.model import CollectiveCall, Frame, Severity
from ncclcheck.record.tracefile import End
from ncclcheck.source import origins, reading
from ncclcheck.wording import (
    collapse,
    op_text,
    signal_name,
    who,
)


@dataclass
class Parting:
    """The first divergence of a dry run's histories, as the rules read it: the ranks
    that made the call (the majority's) and the others, with each rank's call as
    evidence."""

    d: Context
    found: list[Divergence]
    first: Divergence
    made: list[int]
    other: list[int]
    evidence: list[str]


def explain_divergence(d: Context, found: list[Divergence]) -> Explanation:
    """The first divergence, explained by the first rule of DIVERGENCE_RULES that can."""
    first = found[0]
    made, other = first.majority()
    calls = first.calls
    evidence = [
        f"rank {r}: {d.describe_call(calls[r])}"
        + (
            " (it ran to the end of the script)"
            if calls[r] is None and d.exit_of(r)[0] is End.RETURNED
            else ""
        )
        for r in sorted(calls)
    ]
    parting = Parting(d, found, first, made, other, collapse(evidence))
    explanation = first_explanation(DIVERGENCE_RULES, parting)
    assert explanation is not None, "the last rule, the source reading, always answers"
    return explanation


def cycle_across_groups(p: Parting) -> Explanation | None:
    cycle = _cycle(p.found)
    if cycle is None:
        return None
    evidence = _cycle_evidence(p.d, *cycle)
    # a cycle is also what one rank's extra call on a group of its own makes: rank 0
    # alone saves, and its save all-reduces on a side group while the others went on to
    # the next step's gradients. A rank test on that side's chain sends it there alone,
    # whatever the other group shows: the order is no mismatch, the rank test decided
    for side in cycle:
        fork = Fork.of(p.d, side.members, side.calls, side.present, side.absent, evidence)
        sent_alone = rank_test_around_the_call(fork)
        if sent_alone is not None:
            return sent_alone
    return order_mismatch(p.d, *cycle, evidence)


def shapes_differ(p: Parting) -> Explanation | None:
    if p.first.kind is not Mismatch.SHAPE:
        return None
    call = p.first.calls[p.made[0]]
    # a tensor whose size the data sets differs per rank as it is: a dict it sits in is not
    # then what differs, whatever order that dict keeps
    sized = _where_the_tensor_comes_from(p.d, call) if call is not None else []
    in_another_order = (
        loop_in_each_ranks_own_order(
            p.d, p.first.members, p.first.calls, call, True, p.evidence, dicts=not sized
        )
        if call is not None
        else None
    )
    if in_another_order is not None:
        return in_another_order
    return p.d.explanation(
        Cause.COLLECTIVE_SHAPE_MISMATCH,
        f"{who(p.first.members)} call {call.op if call else '?'} at the same "
        f"site with different shapes or dtypes"
        + (f": {sized[0]}, a size each rank's own data gives" if sized else ""),
        ranks=p.first.members,
        absent_ranks=[],
        op=call.op if call else None,
        site=p.d.site(call.site if call else None),
        evidence=[
            *p.evidence,
            *(
                f"{origin}: its size is what each rank's own data gives; gather the sizes first "
                "and pad to the largest (or all_gather_object)"
                for origin in sized
            ),
        ],
    )


def _where_the_tensor_comes_from(d: Context, call: CollectiveCall) -> list[str]:
    """The tensor given at the call, followed back to where its size is set, where the source
    says: boolean indexing or a call whose size the data gives. One line per argument:
    "`t` comes from `pieces.append(x[mask])` at train.py:49"."""
    site = call.site
    if site is None:
        return []
    said: list[str] = []
    for made in reading.calls_on_line(site.file, site.line):
        if reading.callee_name(made) != call.op:
            continue
        for argument in made.args:
            chain = origins.bindings(call.user_stack, argument, origins.sized_by_data)
            # the deepest: `torch.cat(pieces)` is sized by its pieces, each cut by a mask
            sized = next((b for b in reversed(chain) if origins.sized_by_data(b.value)), None)
            if sized is not None:
                said.append(f"`{ast.unparse(argument)}` comes from {sized} at {d.site(sized.frame)}")
    return said


def requests_differ(p: Parting) -> Explanation | None:
    if p.first.kind is not Mismatch.REQUEST:
        return None
    # one rank's reduction in an eval step beside another's deferred to the epoch's end:
    # the same name, and that rank had a batch more (Lightning's self.log(on_step=True))
    return uneven_eval(p.d, p.first, p.evidence) or mixed_requests(p.d, p.first, p.made, p.evidence)


def rank_died_before_the_call(p: Parting) -> Explanation | None:
    """A rank that died *here*: it never made this call (a rank that aborts inside a
    mismatched collective made it, and is explained by the mismatch)."""
    dead = [r for r in p.first.absent if p.d.died(r)]
    return crashed(p.d, dead, p.first) if dead else None


def rank_killed_in_the_call(p: Parting) -> Explanation | None:
    """A rank killed inside (or just after) its call, and the ranks that had not got
    there stopped by torchrun because of it: the divergence is the crash's echo.
    (SIGABRT is gloo's own abort on a mismatched collective: explained by the mismatch.)"""
    d, first = p.d, p.first
    killed_inside = [
        r for r in first.present if d.died(r) and signal_name(d.exit_of(r)[1]) not in (None, "SIGABRT")
    ]
    if killed_inside and first.absent and all(d.stopped_by_launcher(r) for r in first.absent):
        return killed_in_call(d, killed_inside, first)
    return None


def ranks_left_the_script(p: Parting) -> Explanation | None:
    left = [r for r in p.first.absent if p.d.exit_of(r)[0] is End.SYS_EXIT and not p.d.died(r)]
    if left and len(left) == len(p.first.absent):
        return exited_early(p.d, p.first, p.made, left, p.evidence)
    return None


def ran_out_of_batches_under_join(p: Parting) -> Explanation | None:
    return join_without_stand_in(p.d, p.first, p.evidence)


def eval_loaders_of_different_lengths(p: Parting) -> Explanation | None:
    return uneven_eval(p.d, p.first, p.evidence)


def train_passes_end_apart(p: Parting) -> Explanation | None:
    """The ranks' first passes over one train loader yield different numbers of batches,
    and the dry run ran them to their ends (--train-end-batches): at the divergence the
    ranks with more batches are still in the pass, the others past its end."""
    d, first = p.d, p.first
    in_train = {
        r: c.position
        for r, c in first.calls.items()
        if c is not None and (c.position or {}).get("role") == "train"
    }
    loaders = {str(position.get("loader")) for position in in_train.values() if position}
    if len(loaders) != 1:
        return None
    loader = loaders.pop()
    lengths: dict[int, int] = {}
    firsts: dict[int, LoaderPass] = {}
    for rank in first.members:
        trace = d.ev.traces.get(rank)
        ran = [
            lp
            for lp in (trace.passes if trace is not None else [])
            if lp.loader == loader and lp.role == "train" and (lp.head or lp.exhausted)
        ]
        length = ran[0].true_length if ran else None
        if length is None:
            return None
        lengths[rank], firsts[rank] = length, ran[0]
    estimates = sorted(
        {lp.length for lp in firsts.values() if lp.yields is not None and lp.length is not None}
    )
    fewest = min(lengths.values())
    # still in the pass past the shortest rank's end: the batches only they have
    longer = sorted(
        r
        for r, position in in_train.items()
        if position and position.get("loader") == loader and int(position.get("batch", 0)) > fewest
    )
    if not longer or len(set(lengths.values())) < 2:
        return None
    shorter = sorted(r for r in first.members if r not in longer)
    call = first.calls.get(longer[0])
    where = f" ({op_text(call)} at {d.model_call_site(call)})" if call is not None else ""
    sampled_by_hand = all(lp.sampled_by_hand for lp in firsts.values())
    return d.explanation(
        Cause.MISSING_DISTRIBUTED_SAMPLER if sampled_by_hand else Cause.UNEVEN_EVAL_BATCHES,
        f"train loader {loader} yields different numbers of batches per rank ("
        + ", ".join(f"rank {r}: {n}" for r, n in sorted(lengths.items()))
        + f"): the dry run ran the epoch's end, where {who(shorter)} ended the pass and moved on "
        f"while {who(longer)} went on with a step of its own{where}, a collective nobody else makes "
        "at that point"
        + (
            f"; its sampler is a {firsts[shorter[0]].sampler}, not a DistributedSampler, over a dataset "
            "each rank cut for itself"
            if sampled_by_hand
            else ""
        )
        + ". Shard with DistributedSampler, drop the remainder, or wrap the loop in DDP's join()",
        ranks=longer,
        absent_ranks=shorter,
        op=call.op if call is not None else None,
        site=d.model_call_site(call) if call is not None else None,
        evidence=p.evidence
        + (
            [
                f"the loaders' len() said {' or '.join(map(str, estimates))}: the batches each rank's "
                "sampler yields were counted before the pass (its len() is an estimate)"
            ]
            if estimates
            else []
        ),
    )


def a_step_skipped(p: Parting) -> Explanation | None:
    if p.first.kind is not Mismatch.STEP:
        return None
    return skipped_step(p.d, p.first, p.made, p.other, p.evidence)


def a_rank_busy_elsewhere(p: Parting) -> Explanation | None:
    return straggler(p.d, p.first, p.made, p.other, p.evidence)


def the_source_decides(p: Parting) -> Explanation | None:
    return explain_fork(Fork.of(p.d, p.first.members, p.first.calls, p.made, p.other, p.evidence))


def mixed_requests(d: Context, first: Divergence, made: list[int], evidence: list[str]) -> Explanation:
    """The ranks' n-th reductions are for values logged under different names (one
    d.log_dict call, other keys per rank): each rank's value is reduced with
    another name's, silently, and a rank with more names than the others hangs."""
    calls = {r: c for r, c in first.calls.items() if c is not None}
    call = calls[made[0]]
    by_request: dict[str, list[int]] = {}
    for rank, each in sorted(calls.items()):
        by_request.setdefault(each.later.request if each.later else each.op, []).append(rank)
    sides = "; ".join(f"{who(ranks)}: {request}" for request, ranks in by_request.items())
    by = call.later.by if call.later else "the framework"
    return d.explanation(
        Cause.COLLECTIVE_SHAPE_MISMATCH,
        f"{who(first.members)} reach {by}'s {call.op} at {d.site(call.site)} for values "
        f"logged under different names ({sides}): they pair with each other, and a rank "
        f"that logged more names than the others waits forever",
        ranks=first.members,
        absent_ranks=[],
        op=call.op,
        site=d.site(call.site),
        evidence=evidence,
        libraries=call.libraries,
    )


def _cycle(found: list[Divergence]) -> tuple[Divergence, Divergence] | None:
    """Two groups each waiting on ranks that are waiting in the other, lowest present
    rank first (so the report does not depend on which call was first)."""
    missing = sorted((d for d in found if d.kind is Mismatch.MISSING), key=lambda d: (d.present[:1], d.group))
    for i, one in enumerate(missing):
        for two in missing[i + 1 :]:
            if one.group == two.group:
                continue
            if set(one.present) & set(two.absent) and set(one.absent) & set(two.present):
                return one, two
    return None


def _cycle_evidence(d: Context, one: Divergence, two: Divergence) -> list[str]:
    return [
        *(
            f"group {side.group}: {who(side.present)} are in {d.describe_call(side.calls[side.present[0]])}; "
            f"{who(side.absent)} have not made that call"
            for side in (one, two)
        ),
        "each side waits for the other in a different process group: a cycle",
    ]


def order_mismatch(d: Context, one: Divergence, two: Divergence, evidence: list[str]) -> Explanation:
    """A cycle across groups that no rank test explains: the same calls, in another order."""
    call_one = one.calls[one.present[0]]
    return d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"{who(one.present)} and {who(two.present)} "
        f"issue the same collectives in a different order across process groups "
        f"{one.group} and {two.group}",
        ranks=one.present,
        absent_ranks=one.absent,
        op=call_one.op if call_one else None,
        site=d.site(call_one.site if call_one else None),
        evidence=evidence,
    )


def exited_early(
    d: Context, first: Divergence, made: list[int], left: list[int], evidence: list[str]
) -> Explanation:
    """The absent ranks ended the script (sys.exit) while the others went on to a call."""
    call = first.calls[made[0]]
    trace = d.ev.traces.get(left[0])
    left_at = trace.exit.site if trace and trace.exit else None  # where sys.exit was called
    evidence = [*evidence, *(f"rank {r} ended: {d.exit_text(r)}" for r in left)]
    return d.explanation(
        Cause.RANK_EARLY_EXIT,
        f"{who(left)} left the script early"
        + (f" (sys.exit at {d.site(left_at)})" if left_at else "")
        + f" while {who(made)} went on to {call.op if call else '?'} at "
        + f"{d.site(call.site if call else None)}",
        ranks=made,
        absent_ranks=left,
        op=call.op if call else None,
        site=d.site(left_at) if left_at else d.site(call.site if call else None),
        evidence=evidence,
    )


def killed_in_call(d: Context, dead: list[int], first: Divergence) -> Explanation:
    call = first.calls[dead[0]]
    signal = signal_name(d.exit_of(dead[0])[1])
    finding = crashed(d, dead, None)
    finding.message = (
        f"{who(dead)} died ({signal}) in or right after {d.describe_call(call)}; "
        f"torchrun then stopped {who(first.absent)} before reaching it"
    )
    finding.op = call.op if call else None
    finding.site = d.site(call.site if call else None)
    return finding


def crashed(d: Context, dead: list[int], divergence: Divergence | None) -> Explanation:
    evidence = []
    for rank in dead:
        _how, code = d.exit_of(rank)
        trace = d.ev.traces.get(rank)
        error, error_site = d.exit_error(rank)
        signal = signal_name(code)
        last = trace.calls[-1] if trace and trace.calls else None
        text = f"rank {rank} ended: {error or ('exit code ' + str(code))}"
        if error_site:
            text += f" at {d.site(error_site)} in {error_site.function}"
        if signal:
            text += f" ({signal})"
        evidence.append(text)
        evidence.append(f"rank {rank}'s last collective: {d.describe_call(last)}")
    empty = {rank: found for rank in dead if (found := d.empty_eval_pass(rank)) is not None}
    for rank, (loader, others) in empty.items():
        evidence.append(
            f"rank {rank}'s eval loader {loader} yielded no batch in its last pass (the other "
            f"ranks: {', '.join(f'rank {r}: {n}' for r, n in sorted(others.items()))}), and what "
            "follows the loop failed on this rank alone"
        )
    survivors = []
    site = None
    op = None
    if divergence is not None:
        survivors = [r for r in divergence.present if r not in dead]
        if survivors:
            call = divergence.calls[survivors[0]]
            site = d.site(call.site if call else None)
            op = call.op if call else None
            evidence.append(f"{who(survivors)} waited in {d.describe_call(call)}")
    message = f"{who(dead)} died" + (f" while {who(survivors)} waited in {op}" if survivors else "")
    if not survivors:
        # No one waited at a call of the user's: the line the error left from is the site
        # (a CUDA or NCCL set-up error on one rank, before any collective).
        error, error_site = d.exit_error(dead[0])
        site = d.site(error_site)
        if error:
            message += ": " + error
    if empty:
        message = message.replace(
            f"{who(dead)} died", f"{who(dead)} died after an eval pass with no batch", 1
        )
    sent = None if empty else _decided_before_dying(d, dead)
    if sent is not None:
        # The error is what the rank died of; the test it alone took just before is why it
        # was there (a training_step returning None on a NaN batch, which Lightning refuses
        # under DDP): that decision's cause and fix, at the test's line.
        decision, test, deciding, taken = sent
        message = (
            f"{who(dead)} took `{test}` at {d.site(deciding)} {'true' if taken else 'false'}, which "
            f"no other rank did, then died" + message.removeprefix(f"{who(dead)} died")
        )
        evidence.append(
            f"the test, watched in the run: {who(dead)} found it {'true' if taken else 'false'} after "
            f"{'its' if len(dead) == 1 else 'their'} last collective; no other rank did"
        )
        evidence.append(f"lint's reading of it: {decision.reading}")
        return d.explanation(
            decision.cause,
            message,
            ranks=survivors,
            absent_ranks=dead,
            op=op,
            site=d.site(deciding),
            evidence=evidence,
            reason=Reason(reason_of_local_decision(decision.cause), deciding, test),
        )
    error, error_site = d.exit_error(dead[0])
    cause = Cause.RANK_CRASHED if empty else death_cause(error)
    if cause is Cause.RANK_EXCEPTION and error_site is not None:
        # the line that raised sent the rank away; where the others wait is in the evidence
        message = message.replace(
            f"{who(dead)} died", f"{who(dead)} raised at {d.site(error_site)} and died", 1
        )
        if survivors and not message.endswith(error or ""):
            message += f" ({error})"
        site = d.site(error_site)
    finding = d.explanation(
        cause,
        message,
        ranks=survivors,
        absent_ranks=dead,
        op=op,
        site=site,
        evidence=evidence,
    )
    if cause is Cause.RANK_EXCEPTION:
        finding.fix = uncaught_fix(site, error or "")
    if empty:
        finding.fix = (
            f"An empty eval shard killed {who(sorted(empty))}: give every rank the same number of "
            "batches (DistributedSampler(val_set, shuffle=False) pads the shards to equal length), "
            "or make the code after the eval loop handle zero batches and still make its "
            "collectives (reduce a sum and a count, not a mean of a list)."
        )
    return finding


def _decided_before_dying(d: Context, dead: list[int]) -> tuple[LocalDecision, str, Frame, bool] | None:
    """The last watched decision (lint/decisions.py) the dead ranks took one way after their
    last collective, that no rank still alive ever took that way: what sent them to the
    error they died of. None where the run did not watch one, or another rank took it too."""
    others = [r for r in d.ev.traces if r not in dead]
    if not others:
        return None
    taken_elsewhere = {
        (os.path.realpath(x.site.file), x.site.line, x.taken) for r in others for x in d.ev.traces[r].decided
    }
    found: list[tuple[float, Decided]] = []
    for rank in dead:
        trace = d.ev.traces.get(rank)
        if trace is None:
            continue
        last_call = max((c.time for c in trace.calls), default=None)
        for decided in trace.decided:
            key = (os.path.realpath(decided.site.file), decided.site.line, decided.taken)
            if decided.forced or key in taken_elsewhere:
                continue
            if last_call is not None and decided.time < last_call:
                continue
            found.append((decided.time, decided))
    for _time, decided in sorted(found, key=lambda pair: pair[0], reverse=True):
        path = os.path.realpath(decided.site.file)
        decision = decision_at(path, decided.site.line)
        test = reading.decision_at(path, decided.site.line)
        if decision is not None and test is not None:
            return decision, test, decided.site, decided.taken
    return None


def join_without_stand_in(d: Context, first: Divergence, evidence: list[str]) -> Explanation | None:
    """Ranks that ran out of batches inside DDP's Join, facing a collective of the
    user's own in the others' step: Join stands in for DDP's collectives only."""
    joined = sorted(r for r, c in first.calls.items() if c is not None and c.shadow)
    own = sorted(r for r, c in first.calls.items() if c is not None and not c.shadow and c.issuer is None)
    if not joined or not own:
        return None
    call, stand_in = first.calls[own[0]], first.calls[joined[0]]
    assert call is not None and stand_in is not None
    batches = {
        r: sum(p.batches for p in d.ev.traces[r].passes if p.role == "train")
        for r in first.members
        if r in d.ev.traces
    }
    return d.explanation(
        Cause.UNEVEN_EVAL_BATCHES,
        f"{who(joined)} ran out of batches and joined at {d.site(stand_in.site)} "
        f"(DDP's Join), which stands in for DDP's own collectives only; {who(own)} "
        f"made the {op_text(call)} at {d.site(call.site)} in a later step, and "
        f"nothing on {who(joined)} answers it",
        ranks=own,
        absent_ranks=joined,
        op=call.op,
        site=d.site(call.site),
        evidence=[
            *evidence,
            "batches drawn per rank: " + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items())),
            "DDP's Join shadows the gradient all-reduce and its own notification, not "
            "a collective the loop body calls: reduce that value after the loop, give "
            "Join a Joinable that shadows it, or shard so every rank has the same "
            "number of batches (DistributedSampler)",
        ],
    )


def uneven_eval(d: Context, first: Divergence, evidence: list[str]) -> Explanation | None:
    """Some ranks still in an eval loop's per-batch collective, the others past it (a call
    a framework deferred to the epoch's end is past the loop, whatever batch it shows)."""
    inside = sorted(
        r
        for r, c in first.calls.items()
        if c is not None and (c.position or {}).get("role") == "eval" and c.later is None
    )
    outside = sorted(r for r in first.members if r not in inside)
    if not inside or not outside:
        return None
    counts = {r: d.ev.traces[r].eval_batches() for r in first.members if r in d.ev.traces}
    if None in counts.values() or len({str(c) for c in counts.values()}) <= 1:
        return None
    call = first.calls[inside[0]]
    assert call is not None
    passes = [p for t in d.ev.traces.values() for p in t.eval_passes]
    evidence = [
        *evidence,
        "eval batches per rank: " + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items())),
    ]
    for loader_pass in {p.loader: p for p in passes}.values():
        told = loader_pass.told
        if told and len({n for n in told.values()}) > 1:
            evidence.append(
                f"lengths the ranks' loaders had as the pass over {loader_pass.loader} began, "
                "before any batch: " + ", ".join(f"rank {r}: {n}" for r, n in sorted(told.items()))
            )
        if loader_pass.skipped:
            evidence.append(
                f"the first {loader_pass.skipped} batches of {loader_pass.loader} were "
                + ("read ahead without the loop body" if loader_pass.read else "skipped alike on every rank")
                + " (--eval-batches); the ones after them ran for real"
            )
        if loader_pass.iterable:
            # No sampler applies: the playbook's DistributedSampler fix does not either.
            evidence.append(
                f"eval loader {loader_pass.loader}: dataset {loader_pass.dataset} is an "
                "IterableDataset (it shards itself; no sampler applies)"
            )
            continue
        evidence.append(
            f"eval loader {loader_pass.loader}: sampler {loader_pass.sampler}, "
            f"dataset {loader_pass.dataset}"
            + ("" if loader_pass.distributed_sampler else " (no DistributedSampler)")
        )
    cause = Cause.UNEVEN_EVAL_BATCHES
    if any(not p.distributed_sampler for p in passes) and d.eval_samples_overlap():
        cause = Cause.MISSING_DISTRIBUTED_SAMPLER
        evidence.append(
            "the ranks evaluate overlapping samples: each rank draws its own "
            "eval set instead of a shard of one"
        )
    return d.explanation(
        cause,
        f"eval loaders yield different numbers of batches per rank; "
        f"{who(inside)} made a per-batch {op_text(call)} that "
        f"{who(outside)} never made",
        ranks=inside,
        absent_ranks=outside,
        op=call.op,
        site=d.model_call_site(call),
        evidence=evidence,
    )


def skipped_step(
    d: Context, first: Divergence, made: list[int], other: list[int], evidence: list[str]
) -> Explanation:
    """Same op and site, different loader batches: some ranks skipped a step's call."""
    earlier = min(
        (c for c in first.calls.values() if c is not None),
        key=lambda c: (c.position or {}).get("batch", 0),
    )
    did = sorted(r for r, c in first.calls.items() if c is not None and c.position == earlier.position)
    skipped = sorted(r for r in first.members if r not in did)
    site = earlier.site
    step = earlier.position or {}
    evidence = [
        *evidence,
        f"{who(skipped)} made no {op_text(earlier)} at "
        f"{d.site(site)} for {step.get('loader')} batch {step.get('batch')}",
    ]
    cause, reason = Cause.DATA_DEPENDENT_BRANCH, ""
    deciding: Frame | None = None  # a test elsewhere that decided, where one is read
    caught: list[str] = []  # what the skipping ranks' handlers caught, as the run noted it
    if site is not None:
        # the try may be a caller's, around the step function the error left early
        swallow, swallow_file = None, site.file
        for frame in reversed(earlier.user_stack or [site]):
            swallow, swallow_file = reading.swallowing_try(frame.file, frame.line), frame.file
            if swallow is not None:
                break
        loop = reading.innermost_loop(site.file, site.line)
        exits = reading.conditional_exits(site.file, loop, site.line) if loop else []
        helper = (
            reading.enclosing_function(site.file, site.line) if loop is None and swallow is None else None
        )
        if helper is not None:
            # a step function that returns early under a test (`if not torch.isfinite(loss):
            # return None`) before the call skips it, whatever loop calls the function
            exits = reading.conditional_exits(site.file, helper, before_line=site.line)
        # the call may sit in a helper (step()): the loop that skipped it is a caller's
        for frame in reversed(earlier.user_stack[:-1]):
            if exits or loop is not None:
                break
            loop = reading.innermost_loop(frame.file, frame.line)
            if loop is not None:
                # any exit of that loop: a break after the call ends the pass early too
                exits = reading.conditional_exits(frame.file, loop)
                site = frame
        # a try before the call in the loop whose handler goes on to the next pass: what
        # the skipping ranks caught there decides over a test's exit, which only could have
        continuing = None
        if loop is not None and swallow is None:
            continuing = reading.try_that_continues(loop, site.line)
        caught_before = d.caught_by(skipped, site.file, continuing[0]) if continuing is not None else []
        if swallow is not None:
            cause = Cause.RANK_EXCEPTION
            handlers = ", ".join(d.site(Frame(swallow_file, h.lineno, "")) or "" for h in swallow.handlers)
            reason = (
                f"the call is inside a try at {d.site(Frame(swallow_file, swallow.lineno, ''))}"
                f" whose handler (at {handlers}) swallows the error and continues"
            )
            caught = d.caught_by(skipped, swallow_file, swallow)
        elif continuing is not None and (caught_before or not exits):
            handler = continuing[1]
            kinds = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
            cause = Cause.RANK_EXCEPTION
            reason = (
                f"the handler `except{kinds}` at {d.site(Frame(site.file, handler.lineno, ''))} swallows "
                f"an error and goes on to the next pass, skipping the rest of this one"
            )
            caught = caught_before
        elif exits:
            guard = exits[-1]
            # `if loss is None: continue` passes on a None a step function returned under a
            # test of its own: that test decides (the data, the rank), sited where it is
            inner = reading.where_the_sentinel_comes_from(site.file, guard)
            decided = inner or guard
            cause = {
                "rank": Cause.RANK_CONDITIONAL_COLLECTIVE,
                "data": Cause.DATA_DEPENDENT_BRANCH,
            }.get(decided.kind, Cause.UNSYNCHRONIZED_DECISION)
            reason = (
                f"`{guard.statement}` under `if {guard.text}` at "
                f"{d.site(Frame(site.file, guard.line, ''))} skips it"
            )
            if inner is not None:
                reason += (
                    f", after a None returned under `if {inner.text}` at "
                    f"{d.site(Frame(site.file, inner.decided_at, ''))}: the test that decided"
                )
                deciding = Frame(site.file, inner.decided_at, "")
    if reason:
        evidence.append(reason)
    evidence += caught
    return d.explanation(
        cause,
        f"{who(skipped)} skipped the {op_text(earlier)} at {d.site(site)} for one "
        f"step ({step.get('loader')} batch {step.get('batch')}); their later calls pair with "
        f"the other ranks' earlier ones",
        ranks=did,
        absent_ranks=skipped,
        op=earlier.op,
        site=d.site(deciding or site),
        evidence=evidence,
    )


def straggler(
    d: Context, first: Divergence, made: list[int], other: list[int], evidence: list[str]
) -> Explanation | None:
    if not d.ev.stalled or first.kind is not Mismatch.MISSING:
        return None
    # A rank is late only while its script still runs with frames to show where: one that
    # ran to its end (and sits in the interpreter's teardown, no Python frame) is no
    # evidence of work elsewhere, whatever its process is doing.
    late = [
        r
        for r in other
        if r in d.ev.stacks
        and not d.ev.stacks[r].in_collective
        and d.exit_of(r)[0] is End.RUNNING
        and d.frames_text(r)
    ]
    if not late or len(late) != len(other):
        return None
    call = first.calls[made[0]]
    for rank in late:
        evidence.append(f"rank {rank} is outside any collective: {d.frames_text(rank)}")
    return Explanation(
        cause=Cause.STRAGGLER,
        severity=Severity.ERROR,
        message=(
            f"{who(made)} waited in {call.op if call else '?'} for "
            f"{who(late)}, still busy outside any collective{d.busy_where(late[0])} "
            f"({d.stall_against_timeout()})"
        ),
        ranks=made,
        absent_ranks=late,
        op=call.op if call else None,
        site=d.site(call.site if call else None),
        evidence=evidence,
        fix=d.fix(Cause.STRAGGLER),
    )


# The order is the precedence: a cycle across groups before anything one group shows;
# what the calls' own fields prove (shapes, requests) before how the ranks ended; the
# ranks' ends (died, killed, left) before the loaders; the source reading last, since it
# always answers (with no reason when nothing in the source explains the parting).
DIVERGENCE_RULES = (
    cycle_across_groups,
    shapes_differ,
    requests_differ,
    rank_died_before_the_call,
    rank_killed_in_the_call,
    ranks_left_the_script,
    ran_out_of_batches_under_join,
    eval_loaders_of_different_lengths,
    train_passes_end_apart,
    a_step_skipped,
    a_rank_busy_elsewhere,
    the_source_decides,
)
