"""The rules for ranks' stacks merged into classes (doctor): who waits in which
collective, who is elsewhere, and why. Where ranks wait at different lines, the
source reading is the one preflight uses (branch.py), on the calls the stacks show.
"""

from __future__ import annotations

import ast
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.evidence import device
from ncclcheck.evidence.classes import CREATED_GROUP, StackClass, after_loop, state_split
from ncclcheck.evidence.stacks import STORE_GET
from ncclcheck.explain.context import Context, Fork
from ncclcheck.explain.engine import Explanation, Reason, ReasonKind, cause_of_exit, first_explanation
from ncclcheck.explain.rules.branch import SkippedPass, explain_fork, kind_said, skips_a_pass
from ncclcheck.model import CollectiveCall, Frame, Severity
from ncclcheck.source import loaders, reading
from ncclcheck.wording import its, relative, who


@dataclass
class Standoff:
    """Every rank's stack, merged into classes of identical stacks: the ranks that wait
    for their peers (``waiting``), those elsewhere (``outside``), those the OS froze, and
    those not found on this host (``missing``)."""

    d: Context
    classes: list[StackClass]
    world: int
    found: list[int]
    evidence: list[str]
    # False where the evidence does not say how many ranks the job has (one rank's dump
    # posted alone): ``world`` is then only the ranks seen, and others may exist
    world_known: bool = True
    # ranks the files name (a log, a summary) whose stacks are not among them
    not_dumped: tuple[int, ...] = ()
    # whether the ranks' processes were listed (a live host): only then is a rank without a
    # stack known to be gone; of files, a rank without a stack was only not dumped
    processes_listed: bool = True

    @property
    def missing(self) -> list[int]:
        """Ranks that should run on the hosts seen and do not: ended, or crashed."""
        if not self.processes_listed:
            return []
        return sorted(set(range(self.world)) - set(self.found) - set(self.d.ev.on_other_hosts))

    @property
    def unseen(self) -> list[int]:
        """Ranks on other hosts: nothing here says where they are."""
        return sorted(set(self.d.ev.on_other_hosts) - set(self.found))

    @property
    def waiting(self) -> list[StackClass]:
        return [c for c in self.classes if c.in_collective]

    @property
    def outside(self) -> list[StackClass]:
        return [c for c in self.classes if not c.in_collective]

    @property
    def frozen(self) -> list[int]:
        return sorted(r for c in self.outside if c.blocking.startswith("stopped") for r in c.ranks)

    @property
    def one_call(self) -> StackClass | None:
        """The class every rank is in, when all wait in one (the frozen aside)."""
        if len(self.waiting) == 1 and len(self.outside) == (1 if self.frozen else 0):
            return self.waiting[0]
        return None


def explain_classes(
    d: Context,
    classes: list[StackClass],
    world: int,
    found: list[int],
    world_known: bool = True,
    not_dumped: tuple[int, ...] = (),
    processes_listed: bool = True,
) -> Explanation:
    """The playbooks' doctor signals, applied to the merged stack classes."""
    evidence = [_seen(c) for c in classes]
    # what to do about a collective library code issued (SyncBatchNorm in training mode)
    evidence += dict.fromkeys(c.advice for c in classes if c.advice is not None)
    explanation = first_explanation(
        STACK_RULES, Standoff(d, classes, world, found, evidence, world_known, not_dumped, processes_listed)
    )
    assert explanation is not None, "the last rule always answers"
    synchronising = [c for c in classes if c.sync is not None and set(c.ranks) & set(explanation.ranks)]
    if synchronising:
        # NCCL's shape: say where these ranks really are
        explanation.message += "; " + "; ".join(
            f"{who(c.ranks)} {_verb(c.ranks)} at a device sync point ({c.sync}): the collective was "
            "enqueued and never completed"
            for c in synchronising
        )
    return explanation


def _seen(c: StackClass) -> str:
    if c.sync is None:
        return f"{who(c.ranks)}: {c.blocking} {_where(c)}"
    return f"{who(c.ranks)}: at a device sync point, {c.sync} ({c.blocking} enqueued {_where(c)})"


def ranks_missing_from_the_host(s: Standoff) -> Explanation | None:
    missing, waiting = s.missing, s.waiting
    if not missing:
        return None
    ranks = sorted(r for c in s.classes for r in c.ranks)
    return s.d.explanation(
        Cause.RANK_CRASHED,
        f"{who(missing)} of {s.world} are not running on this host while {who(ranks)} wait",
        ranks=ranks,
        absent_ranks=missing,
        op=waiting[0].blocking if waiting else None,
        site=_site(waiting[0]) if waiting else None,
        evidence=[*s.evidence, "a rank on another host? run doctor there too, with --dump-to"],
    )


def group_names_differ(s: Standoff) -> Explanation | None:
    """Every rank in new_group at one line, each naming the group differently."""
    only = s.one_call
    split = state_split(only) if only is not None else None
    if only is None or split is None or not all(CREATED_GROUP in state for state in only.states.values()):
        return None
    parts, lines = split
    return s.d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"every rank waits in new_group{_at(only)}, but they give the group "
        "different names: "
        + "; ".join(lines)
        + ". torch names a group by a count of new_group calls, so the ranks made "
        "different numbers of them before: an earlier new_group ran on some ranks "
        "only (under a rank or membership test), and each side now waits for peers "
        "of a group the others call by another name",
        ranks=parts[0],
        absent_ranks=sorted(r for part in parts[1:] for r in part),
        op="new_group",
        site=_site(only),
        evidence=[
            *s.evidence,
            *lines,
            "find the new_group under a test of the rank: `ncclcheck lint` on the "
            "script names it, `ncclcheck preflight` shows which ranks called it",
        ],
    )


def a_loop_ran_unequal_passes(s: Standoff) -> Explanation | None:
    """Every rank at one line past a loop whose counter they left at different values
    (``step`` of ``for step, batch in enumerate(val_loader)``): the loop ran more passes
    on some ranks, and their extra collectives paired with the others' next call. The
    common NCCL shape: the extra all_reduce returned at once, and every rank now waits
    at the same barrier or read."""
    only = s.one_call
    if only is None or len(only.states) < 2:
        return None
    shared = set.intersection(*(set(state) for state in only.states.values()))
    differing = {k for k in shared if len({state[k] for state in only.states.values()}) > 1}
    for depth, frame in enumerate(only.frames):
        for loop in reading.loops_before(frame.file, frame.line):
            keys = [after_loop(t, frame.function, loop.lineno) for t in reading.loop_targets(loop)]
            key = next((k for k in keys if k in differing), None)
            if key is None or not differing <= set(keys):
                continue
            passes = {rank: int(state[key]) for rank, state in only.states.items()}
            most = max(passes.values())
            more = sorted(r for r, n in passes.items() if n == most)
            fewer = sorted(r for r, n in passes.items() if n != most)
            loop_frame = Frame(frame.file, loop.lineno, "")
            loop_site = s.d.site(loop_frame)
            enqueued = device.last_collective_in(frame.file, loop)
            chain = [*only.frames[:depth], *(enqueued.frames if enqueued else [frame])]
            lines = [
                f"{who(ranks)}: {key} = {value}"
                for value, ranks in sorted(
                    {v: sorted(r for r in passes if passes[r] == v) for v in set(passes.values())}.items()
                )
            ]
            message = (
                f"every rank waits in {only.blocking}{_at(only)}, but the loop at {loop_site} ran "
                f"more passes on {who(more)} than on {who(fewer)} ({'; '.join(lines)}): the extra "
                + (f"{enqueued.what} at {_frame_site(enqueued.frames[-1])}" if enqueued else "collectives")
                + " paired with the others' next call"
            )
            evidence = [*s.evidence, *lines]
            cause, detail = _loader_cause(chain[: depth + 1], loop, loaders.trains(loop), evidence)
            return s.d.explanation(
                cause,
                message + detail,
                ranks=more,
                absent_ranks=fewer,
                op=enqueued.op if enqueued else only.blocking,
                site=_frame_site(chain[-1]),
                evidence=evidence,
                reason=Reason(ReasonKind.LOADER_LENGTH, loop_frame, ast.unparse(loop).splitlines()[0]),
            )
    return None


def same_line_different_points(s: Standoff) -> Explanation | None:
    """Every rank at one line, with loop variables or groups that say they are at
    different points of their collective sequences."""
    only = s.one_call
    split = state_split(only) if only is not None else None
    if only is None or split is None:
        return None
    parts, lines = split
    return s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"every rank waits in {only.blocking}{_at(only)}, but not at the same point "
        f"of its sequence: "
        + "; ".join(lines)
        + ". Each side waits for a call the other makes later (or on another group)",
        ranks=parts[0],
        absent_ranks=sorted(r for part in parts[1:] for r in part),
        op=only.blocking,
        site=_site(only),
        evidence=[*s.evidence, *lines],
    )


def threads_issue_collectives_at_once(s: Standoff) -> Explanation | None:
    """Ranks on which two threads wait in collectives at the same time (a checkpoint saved
    on a background thread while the main thread reaches a barrier). A process group
    matches collectives by the order each rank issues them; two threads issuing on one
    group interleave in whatever order each rank's scheduler gives, so the ranks can pair
    one thread's call with the other thread's. Stacks do not show the groups: on two
    different groups the calls are independent, which is what decides."""
    both = [c for c in s.waiting if c.concurrent]
    if not both:
        return None
    ranks = sorted(r for c in both for r in c.ranks)
    first = both[0]
    others = "; ".join(dict.fromkeys(what for c in both for what in c.concurrent))
    explanation = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"on {who(ranks)}, two threads wait in collectives at once: {first.blocking}"
        f"{_at(first)}, and {others}. A process group pairs the "
        "collectives of the ranks in the order each rank issues them, and two threads issue theirs "
        "in whatever order the rank's scheduler gives: one rank's barrier can meet another's "
        "all-gather, and both wait. Unless the two threads use different process groups, this "
        "is the hang",
        ranks=ranks,
        absent_ranks=[],
        op=first.blocking,
        site=_site(first),
        evidence=s.evidence,
    )
    explanation.fix = (
        "Keep one thread's collectives off the other's group, or out of its time: give the "
        'background work its own process group (`dist.new_group(backend="gloo")` for a '
        "checkpoint's planning or the barrier after it), or wait for it before the main thread's "
        "next collective (`future.result()` of `dcp.async_save` before `dist.barrier()`)."
    )
    return explanation


def every_rank_in_one_call(s: Standoff) -> Explanation | None:
    only, frozen = s.one_call, s.frozen
    if only is None:
        return None
    evidence = list(s.evidence)
    if frozen:
        evidence.append(f"{who(frozen)} frozen: process state stopped, stack unreadable")
    unseen = s.unseen
    waiting = f"{who(sorted(only.ranks))} {_verb(only.ranks)} in {only.blocking}{_at(only)}"
    # the ranks these stacks say nothing of, and how the message names them
    others: str | None = None
    if unseen:
        others = who(unseen)
        waiting = (
            f"{who(sorted(only.ranks))}, every rank on this host, {_verb(only.ranks)} in {only.blocking}"
            f"{_at(only)}; {others} {'runs' if len(unseen) == 1 else 'run'} on other hosts and nothing "
            "here says where"
        )
    elif s.not_dumped:
        others = f"{who(list(s.not_dumped))}, whose stacks are not here,"
        were = "was" if len(s.not_dumped) == 1 else "were"
        waiting += f"; nothing here says where {who(list(s.not_dumped))} {were}"
    elif not s.world_known:
        others = "the ranks not in these files"
        waiting += "; nothing here says how many ranks the job has, nor where the others are"
    if others is not None:
        # every rank here agrees; the ranks not seen may not have reached this call
        message = (
            f"{waiting}. No rank is set apart by these stacks: either {others} never reached this call "
            "(busy elsewhere, or a call skipped there) or every rank waits in it (the transport)"
        )
    else:
        message = (
            f"every rank is in {only.blocking}{_at(only)}"
            + (f" or frozen ({who(frozen)})" if frozen else "")
            + ": the stacks are aligned, so the transport is the suspect; run `ncclcheck probe` "
            "with the same launcher options"
        )
    found = s.d.explanation(
        Cause.STRAGGLER if others is not None else Cause.TRANSPORT_HANG,
        message,
        ranks=sorted(only.ranks + frozen),
        absent_ranks=[],
        op=only.blocking,
        site=_site(only),
        evidence=evidence,
    )
    if others is not None:
        found.severity = Severity.WARNING  # two readings fit: neither is said as found
        found.fix = (
            f"What decides: the stacks of {others} at the same moment (`ncclcheck doctor --pid "
            "PID --dump-to DIR` on every host, then `ncclcheck doctor --from DIR`)"
        )
    return found


def some_ranks_outside_any_collective(s: Standoff) -> Explanation | None:
    waiting, outside = s.waiting, s.outside
    if not (waiting and outside):
        return None
    late = sorted(r for c in outside for r in c.ranks)
    ranks = sorted(r for c in waiting for r in c.ranks)
    return s.d.explanation(
        Cause.STRAGGLER,
        f"{who(ranks)} {_verb(ranks)} in {waiting[0].blocking} while {who(late)} "
        f"{'is' if len(late) == 1 else 'are'} busy outside any "
        f"collective ({outside[0].blocking} {_where(outside[0])})",
        ranks=ranks,
        absent_ranks=late,
        op=waiting[0].blocking,
        site=_site(waiting[0]),
        evidence=s.evidence,
    )


def a_framework_call_asked_by_some_ranks(s: Standoff) -> Explanation | None:
    return _deferred_finding(s.waiting, s.d, s.evidence) if len(s.waiting) >= 2 else None


def a_loop_some_ranks_left(s: Standoff) -> Explanation | None:
    left = _left_loop(s.waiting, s.d, list(s.evidence)) if len(s.waiting) >= 2 else None
    if left is None:
        return None
    explanation, in_a_shared_loop = left
    if in_a_shared_loop:
        # an epoch loop holds both sides: the others may be past this loop on the pass
        # before (an eval loop of unequal length) or the next one after an early return
        # (a checkpoint only rank 0 finishes): a reason in the source decides first
        forked = the_source_decides(s)
        if forked is not None and forked.reason is not None:
            return forked
    return explanation


def the_source_decides(s: Standoff) -> Explanation | None:
    """Ranks wait in different collectives: read the source as preflight does, the
    smaller class being the one that took the branch."""
    if len(s.waiting) < 2:
        return None
    small, big = sorted(s.waiting, key=lambda c: (len(c.ranks), c.ranks[0]))[:2]
    if not any(os.path.isfile(f.file) for c in (small, big) for f in c.frames):
        return _parted_without_source(s, small, big)
    calls: dict[int, CollectiveCall | None] = {
        rank: CollectiveCall.seen_on_stack(rank, cls.blocking, cls.site, cls.frames, cls.libraries)
        for cls in (small, big)
        for rank in cls.ranks
    }
    explanation = explain_fork(Fork.of(s.d, sorted(calls), calls, small.ranks, big.ranks, s.evidence))
    if explanation.reason is None:
        # the smaller class need not be the one that took the branch: the larger one's call
        # may be what the smaller skipped (an early return before it, on their path)
        turned = explain_fork(Fork.of(s.d, sorted(calls), calls, big.ranks, small.ranks, s.evidence))
        if turned.reason is not None:
            return turned
    if explanation.reason is None and small.blocking == big.blocking:
        completed = _completed_alone(s, small, big)
        if completed is not None:
            return completed
        # nothing in the source sends them apart, and they wait in the same op at two
        # lines: their sequences of calls differ
        return s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH,
            f"{who(small.ranks)} and {who(big.ranks)} wait in {small.blocking} at different "
            f"sites ({_site(small)} and {_site(big)}): their collective sequences differ",
            ranks=small.ranks,
            absent_ranks=big.ranks,
            op=small.blocking,
            site=_site(small),
            evidence=s.evidence,
        )
    return explanation


def _completed_alone(s: Standoff, one: StackClass, two: StackClass) -> Explanation | None:
    """Two classes in one call of one function, at two calls of the same op in straight-line
    code (no loop of that function around them, no test or exit between, which the fork's
    rules found none of): the class at the later line went past the earlier call the other
    still waits in. It made that call, as nothing skips it, and it returned: a collective
    completes on one member while another waits in it when their tensors differ in size
    (the member expecting less, an empty shard or a masked subset, is done first)."""
    if not one.frames or not two.frames or len(one.frames) != len(two.frames):
        return None
    if any(
        (a.file, a.function, a.line) != (b.file, b.function, b.line)
        for a, b in zip(one.frames[:-1], two.frames[:-1], strict=True)
    ):
        return None
    here, there = one.frames[-1], two.frames[-1]
    if (here.file, here.function) != (there.file, there.function) or here.line == there.line:
        return None
    behind, ahead = (one, two) if here.line < there.line else (two, one)
    first, later = behind.frames[-1], ahead.frames[-1]
    if any(reading.contains(loop, later.line) for loop in reading.enclosing_loops(first.file, first.line)):
        return None  # a loop around both: the later line may be a pass behind, not ahead
    tree = reading.parse(first.file)
    branching = (
        ast.If,
        ast.For,
        ast.While,
        ast.Try,
        ast.Return,
        ast.Raise,
        ast.Break,
        ast.Continue,
        ast.Match,
    )
    if tree is None or any(
        isinstance(node, branching) and first.line < getattr(node, "lineno", 0) < later.line
        for node in ast.walk(tree)
    ):
        return None  # a statement between could send a rank past the call without making it
    found = s.d.explanation(
        Cause.COLLECTIVE_SHAPE_MISMATCH,
        f"{who(ahead.ranks)} went past the {behind.blocking} at {_site(behind)} that {who(behind.ranks)} "
        f"still {_verb(behind.ranks)} in, to the next one at {_site(ahead)}, with nothing between that "
        f"could skip it: {who(ahead.ranks)} made that call and it returned on {its(ahead.ranks)} side "
        "alone. A collective completes on one member while another waits in it when their tensors "
        "differ in size: the member expecting less is done first. The tensors at that call differ "
        "per rank (a size that follows the rank's data: a mask, a filter, an empty shard); or the "
        "ranks' calls were paired one apart since a call one side made alone earlier, and the pair "
        "now waiting differs in size",
        ranks=behind.ranks,
        absent_ranks=ahead.ranks,
        op=behind.blocking,
        site=s.d.site(first),
        evidence=[
            *s.evidence,
            f"{_site(behind)} and {_site(ahead)}: two calls of {behind.blocking} in one call of "
            f"{first.function}(), with no loop of it around both and no test or exit between",
        ],
    )
    found.fix = (
        "Give the collective tensors of one size on every rank: pad to a size the ranks agree on "
        "first (all_reduce the local length with MAX, pad, gather, then cut each rank's part by "
        "its length), or gather Python objects with all_gather_object, which sizes itself."
    )
    return found


def _parted_without_source(s: Standoff, small: StackClass, big: StackClass) -> Explanation:
    """Ranks in different collectives, from dumps whose source is not on this host (posted
    stacks, a summary): the split is proven, the reason is not readable. As many ranks on
    each side sets no side apart; a smaller side is the odd one by count only, said so."""
    tie = len(small.ranks) == len(big.ranks)
    split = (
        f"{who(small.ranks)} {_verb(small.ranks)} in {small.blocking}{_at(small)}, while {who(big.ranks)} "
        f"{_verb(big.ranks)} in {big.blocking}{_at(big)}: the ranks' collective sequences parted before "
        "these calls"
    )
    side = (
        "; as many ranks are on each side, so these stacks set neither apart"
        if tie
        else f"; {who(small.ranks)}, the fewer, {'is' if len(small.ranks) == 1 else 'are'} the likelier "
        "to have left the common path, by count only"
    )
    same_op = small.blocking == big.blocking
    found = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH if same_op else Cause.RANK_CONDITIONAL_COLLECTIVE,
        split + side,
        ranks=sorted(small.ranks + big.ranks) if tie else small.ranks,
        absent_ranks=[] if tie else big.ranks,
        op=small.blocking,
        site=None,
        evidence=[*s.evidence, "the source of these frames is not on this host: no branch could be read"],
    )
    found.severity = Severity.WARNING  # the reason is unread, and with a tie, the side too
    found.fix = (
        "What decides: the source at those lines (run doctor where the code is, or `ncclcheck lint` "
        "on it), what each rank read before it parted (py-spy dump --locals), or the ranks' "
        "collective sequences (TORCH_FR_BUFFER_SIZE=2000 and the Flight Recorder dumps given to "
        "doctor --from)."
    )
    return found


def held_by_their_data_pipeline(
    d: Context, classes: list[StackClass], labels: list[str]
) -> Explanation | None:
    """Stack dumps of no known rank, each either waiting for its next batch outside any
    collective or waiting in a collective: whatever rank each is, the first are held by
    their own data pipeline, and the others wait in a collective for a peer, of which the
    first are the only ones seen elsewhere. Nothing is said of ranks: none is known. A dump
    outside any collective and outside its data pipeline (a sleep, the script's end) leaves
    it unsaid: another reading fits too."""
    if not classes:
        return None
    held = [c for c in classes if not c.in_collective and _data_frame(c) is not None]
    elsewhere = [c for c in classes if not c.in_collective and _data_frame(c) is None]
    waiting = [c for c in classes if c.in_collective]
    if not held or elsewhere:
        return None
    frame = _data_frame(held[0])
    assert frame is not None

    def names(group: list[StackClass]) -> list[str]:
        return [labels[i] for c in group for i in c.ranks]

    if not waiting:
        message = (
            f"{'the dumped process waits' if len(labels) == 1 else 'every dumped process waits'} for its "
            f"next batch from its data pipeline (at {_frame_text(frame)}), outside any collective: held by "
            "its loader workers or the thread that feeds it, not by a peer. Which rank it is, the dump does "
            "not say; ranks in a collective would wait for it"
        )
    else:
        held_names = names(held)
        verb = "waits" if len(held_names) == 1 else "wait"
        calls = ", ".join(sorted({c.blocking for c in waiting}))
        message = (
            f"{', '.join(held_names)} {verb} for the next batch from its data pipeline (at "
            f"{_frame_text(frame)}), outside any collective, while the other dumps wait in collectives "
            f"({calls}): the collectives wait for a peer, and the process held by its loader is the one "
            "these dumps show elsewhere. Which rank each dump is, the dumps do not say; what would "
            "confirm it: every rank's dump with its rank, or the NCCL watchdog lines naming the rank "
            "that never joined"
        )
    found = d.explanation(
        Cause.STRAGGLER,
        message,
        ranks=[],
        absent_ranks=[],
        op=None,
        site=None,
        evidence=[
            *(f"{label}: waits in its data pipeline" for label in names(held)),
            *(f"{labels[i]}: {c.blocking}" for c in waiting for i in c.ranks),
        ],
    )
    found.fix = _MEND_THE_PIPELINE
    return found


_IN_BACKWARD = "in backward"  # Blocking's word for DDP's gradient all-reduce (evidence/stacks.py)


def some_dumps_still_train(d: Context, classes: list[StackClass], labels: list[str]) -> Explanation | None:
    """Stack dumps of no known rank, some in backward (DDP's gradient all-reduce, issued by
    autograd with no Python frame) while the others wait in a collective of their own: the
    first are one training step further into the loop than the others, which left it. The
    likely reading: the ranks' training loaders yield different numbers of batches (a
    sampler without drop_last, a per-rank filter). Nothing is said of ranks: none is known."""
    if len(classes) < 2 or not all(c.in_collective for c in classes):
        return None
    training = [c for c in classes if _IN_BACKWARD in c.blocking]
    others = [c for c in classes if _IN_BACKWARD not in c.blocking]
    if not training or not others:
        return None

    def dumps(group: list[StackClass]) -> str:
        names = [labels[i] for c in group for i in c.ranks]
        return ", ".join(names)

    elsewhere = others[0]
    where = f" at {_frame_text(elsewhere.site)}" if elsewhere.site is not None else ""
    found = d.explanation(
        Cause.UNEVEN_EVAL_BATCHES,
        f"the dumped processes wait in different collectives: {dumps(training)} in a training step's "
        f"backward (DDP's gradient all-reduce), {dumps(others)} in {elsewhere.blocking}{where}, after "
        "the training loop. The first are one step further into the loop than the others, which left it: "
        "the likely reading is that the ranks' training loaders yield different numbers of batches (a "
        "DistributedSampler without drop_last on a set that does not split evenly, a per-rank filter). "
        "Which ranks each dump is, the dumps do not say. What would confirm it: each rank's batch count "
        "(len(loader) on every rank), or the ranks' Flight Recorder dumps",
        ranks=[],
        absent_ranks=[],
        op=None,
        site=None,
        evidence=[f"{labels[i]}: {c.blocking}" for c in classes for i in c.ranks],
    )
    return found


# what a main process does alone, by the names people give it: a path through one of these
# to a collective that no other process took is most often a phase run under a rank test
_ONE_PROCESS_PHASE = re.compile(
    r"save|checkpoint|ckpt|eval|valid|log(?:ger|ging|_|$)|metric|upload|export|sample|generat|preview"
    r"|visuali|plot|report|summar|callback|on_\w+_end",
    re.IGNORECASE,
)


def a_phase_one_side_ran(lone: list[Frame], rest: list[Frame]) -> tuple[Frame, Frame, Frame] | None:
    """Two paths of user frames (outermost first) that part in one function at two lines,
    the first through a phase a main process runs alone (``_ONE_PROCESS_PHASE``) and the
    second through none: (the first's frame there, the second's, the phase's frame)."""
    parted = next(
        (
            i
            for i, (a, b) in enumerate(zip(lone, rest, strict=False))
            if (a.file, a.function) != (b.file, b.function) or a.line != b.line
        ),
        None,
    )
    if parted is None or parted >= len(rest) or parted >= len(lone):
        return None
    shared, theirs = lone[parted], rest[parted]
    if (shared.file, shared.function) != (theirs.file, theirs.function):
        return None
    # the frame of the parting itself counts: a phase may be the function the others skipped
    phase = next((f for f in lone[parted + 1 :] if _ONE_PROCESS_PHASE.search(f.function)), None)
    if phase is None or any(_ONE_PROCESS_PHASE.search(f.function) for f in rest[parted + 1 :]):
        return None
    return shared, theirs, phase


def one_dump_alone_in_a_phase(d: Context, classes: list[StackClass], labels: list[str]) -> Explanation | None:
    """Stack dumps of no known rank, every one in a collective: one process alone in a
    collective reached through a phase a main process runs alone (a save, an evaluation, a
    log), the others together in another collective reached from the same function at
    another line. They went past that phase with no collective in it: the likely reading is
    a collective under a rank test. Which rank the lone one is, the dumps do not say."""
    if len(classes) != 2 or not all(c.in_collective for c in classes):
        return None
    lone, rest = sorted(classes, key=lambda c: len(c.ranks))
    if len(lone.ranks) != 1 or len(rest.ranks) < 2:
        return None
    found_phase = a_phase_one_side_ran(lone.frames, rest.frames)
    if found_phase is None:
        return None
    shared, theirs, phase = found_phase
    one = labels[lone.ranks[0]]
    found = d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"one dumped process ({one}) waits in {lone.blocking} at {_frame_text(lone.site or shared)}, "
        f"reached from {_frame_text(shared)} through {phase.function}(); the {len(rest.ranks)} others "
        f"wait in {rest.blocking} at {_frame_text(rest.site or theirs)}, reached from the same "
        f"{shared.function}() at line {theirs.line}: they went past {phase.function}() with no "
        "collective in it. The likely reading: the collective in it runs under a rank test (a "
        f"{phase.function}() on the main process only) that the others skipped. Which rank each "
        "dump is, the dumps do not say (most often the lone one is rank 0). What would confirm it: "
        f"the test around the call of {phase.function}() in {relative(shared.file, os.getcwd())}, or "
        "the dumps with their ranks",
        ranks=[],
        absent_ranks=[],
        op=lone.blocking,
        site=f"{relative(shared.file, os.getcwd())}:{shared.line}",
        evidence=[f"{labels[i]}: {c.blocking}" for c in classes for i in c.ranks],
    )
    return found


_MEND_THE_PIPELINE = (
    "Mend the data pipeline of the process that waits: dump its loader workers while it waits "
    "(py-spy dump --pid on each worker process) to see what they block on (a worker "
    "deadlocked in a fork-unsafe library or a lock, a read from a stalled file system, "
    "a worker that died); a rerun with num_workers=0 tells a worker deadlock from a slow "
    "read. Give the DataLoader a timeout= so that a stalled worker raises instead of "
    "holding the job until NCCL's watchdog."
)


def no_rank_waits(s: Standoff) -> Explanation:
    """No stack in a collective: no rule can set a rank apart, since nothing here waits on
    a peer. Said as a warning, with what would decide rather than a cause's fix."""
    if s.missing or not s.world_known:
        decides = (
            f"What decides: the other ranks' stacks at the same moment. Ranks waiting in a "
            f"collective while {who(s.found)} {_verb(s.found)} here would set {who(s.found)} apart "
            "as not arriving (a straggler); every rank outside any collective means the job "
            "waits on something outside torch.distributed, where no collective timeout fires."
        )
    else:
        decides = (
            "What decides: what these stacks wait on, outside torch.distributed (every rank's "
            "stack is here and none is in a collective, so no collective timeout fires)."
        )
    in_data = sorted(r for c in s.outside if _in_data_pipeline(c) for r in c.ranks)
    if in_data:
        # what these ranks wait on is their own: the next batch from their loader workers
        # or a producer thread. Whatever the ranks not seen here do, this is where the job
        # is held (a rank in a collective waits for them; a rank elsewhere in its data
        # pipeline is held by the same kind of stall), and the fix is the pipeline's
        frame = next(f for c in s.outside if (f := _data_frame(c)) is not None)
        at = _frame_text(frame)
        others = (
            f"; the ranks not seen here ({who(s.missing)}) would wait for {who(in_data)} in their next "
            "collective"
            if s.missing
            else f"; the ranks not seen here would wait for {who(in_data)} in their next collective"
            if not s.world_known
            else ""
        )
        return Explanation(
            Cause.STRAGGLER,
            f"{who(in_data)} {_verb(in_data)} for the next batch from {its(in_data)} data pipeline "
            f"(at {at}), outside any collective: held by {its(in_data)} loader workers or the thread "
            f"that feeds {'it' if len(in_data) == 1 else 'them'}, not by a peer{others}",
            ranks=in_data,
            evidence=s.evidence,
            fix=_MEND_THE_PIPELINE,
        )
    return Explanation(
        Cause.STRAGGLER,
        "no rank is inside a collective: the job is slow or stuck outside communication",
        ranks=s.found,
        evidence=s.evidence,
        severity=Severity.WARNING,
        fix=decides,
    )


def _in_data_pipeline(cls: StackClass) -> bool:
    return _data_frame(cls) is not None


def _data_frame(cls: StackClass) -> Frame | None:
    """Where a class waits for its next batch: the innermost frame in torch's DataLoader,
    or in the ``__next__`` of an iterator that a data package (``.../data/...``) defines,
    as fairseq's and most trainers' buffered iterators are. torch's own frames are not
    among the user's: a class blocked in the DataLoader gives the user's line that asked."""
    if cls.blocking == "DataLoader":
        return cls.site
    for frame in reversed(cls.frames):  # outermost first: the innermost is last
        path = frame.file.replace("\\", "/")
        if "torch/utils/data/" in path or (
            frame.function.rsplit(".", 1)[-1] == "__next__" and "/data/" in path
        ):
            return frame
    return None


def every_seen_rank_waits_on_the_store(s: Standoff) -> Explanation | None:
    """Every rank seen waits in a get on the c10d store (gdb's native frames), none in a
    collective: each waits for a key another rank sets, at rendezvous, a store-based barrier
    or a communicator's set-up. Those keys are rank 0's to publish (its host runs the store,
    NCCL's unique id is its): where rank 0 is not among the waiting, the likely reading is
    that it failed, exited or never got there, said as such, with what decides."""
    if not s.waiting or s.outside or not all(c.blocking.startswith(STORE_GET) for c in s.waiting):
        return None
    seen = sorted(r for c in s.waiting for r in c.ranks)
    stuck = (
        f"{who(seen)} {'waits' if len(seen) == 1 else 'wait'} in a get on the c10d store, in no "
        "collective: for a key another rank sets (at rendezvous, init_process_group's store "
        "barrier, or a communicator's set-up at a group's first collective)"
    )
    decides = (
        "rank 0's own output (a traceback, `Address already in use` for the store's port, an exit "
        "code), and whether MASTER_ADDR:MASTER_PORT is reachable from this host"
    )
    if 0 in seen:
        found = s.d.explanation(
            Cause.STRAGGLER,
            f"{stuck}; rank 0 waits too, so the key is one every rank adds (a store barrier): the "
            "ranks not seen here never arrived",
            ranks=seen,
            absent_ranks=[],
            op=None,
            site=None,
            evidence=s.evidence,
        )
        found.severity = Severity.WARNING
        found.fix = "What decides: the output of the ranks not seen here, for an error at start-up"
        return found
    found = s.d.explanation(
        Cause.RANK_CRASHED,
        f"{stuck}. Rank 0's host runs the store and NCCL's id is rank 0's to publish, and rank 0 "
        "is not among the ranks waiting here: the likely reading is that rank 0 failed, exited or "
        "never got there, or that its store cannot be reached (in init's store barrier, any rank "
        f"not arrived); not a collective of other calls. What decides: {decides}",
        ranks=seen,
        absent_ranks=[0],
        op=None,
        site=None,
        evidence=s.evidence,
    )
    found.fix = (
        "Look at rank 0 first: its traceback or exit at start-up (a port already in use: pick a "
        "free MASTER_PORT, or use `--rdzv-backend c10d --rdzv-endpoint host:0`), then the network "
        "between the hosts and MASTER_ADDR"
    )
    return found


# The order is the precedence: a rank absent from the host explains everything after
# it; one call everywhere (with names or loop values that differ, or alike: the
# transport) before ranks outside any call; then, for ranks in different calls, a
# framework's deferred call, a loop some ranks left, the source's branches.
STACK_RULES = (
    ranks_missing_from_the_host,
    every_seen_rank_waits_on_the_store,
    group_names_differ,
    a_loop_ran_unequal_passes,
    same_line_different_points,
    threads_issue_collectives_at_once,
    every_rank_in_one_call,
    some_ranks_outside_any_collective,
    a_framework_call_asked_by_some_ranks,
    a_loop_some_ranks_left,
    the_source_decides,
    no_rank_waits,
)


def _deferred_finding(
    waiting: list[StackClass], diagnoser: Context, evidence: list[str]
) -> Explanation | None:
    """Ranks waiting in a collective a framework runs later (Lightning's epoch-end sync):
    the stack cannot say which of the user's calls asked for it, so read the user's
    source, as lint does, for such a call under a rank test."""
    inside = next((c for c in waiting if c.deferred is not None and c.frames), None)
    if inside is None or inside.deferred is None:
        return None
    from ncclcheck.lint import located, run_lint  # reads source: only for this case

    known = inside.deferred
    entry = Path(inside.frames[0].file)  # the script: lint follows its imports
    try:
        findings, _ = run_lint([entry]) if entry.is_file() else ([], None)
    except Exception:  # unreadable source must not hide the stacks' own diagnosis
        return None
    asked = [
        f
        for f in findings
        if f.cause == Cause.RANK_CONDITIONAL_COLLECTIVE and known.marker in located(f).label
    ]
    if not asked:
        return None
    others = sorted(r for c in waiting if c is not inside for r in c.ranks)
    first = asked[0]
    asked_at = Frame(str(located(first).path), located(first).line, "")
    site = diagnoser.site(asked_at)
    return diagnoser.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} inside {known.what}, while "
        f"{who(others)} {_verb(others)} elsewhere: the source makes that call only on some ranks ({site})",
        ranks=inside.ranks,
        absent_ranks=others,
        op=inside.blocking,
        site=site,
        evidence=[
            *evidence,
            f"{who(inside.ranks)}: {inside.blocking} inside {known.what}, called {_where(inside)}",
            *(f"source: {f.site}: {f.message}" for f in asked),
        ],
        libraries=[known.library],
        reason=Reason(ReasonKind.RANK_TEST, asked_at, first.message),
    )


def _verb(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def _left_loop(
    waiting: list[StackClass], diagnoser: Context, evidence: list[str]
) -> tuple[Explanation, bool] | None:
    """Some ranks still in a loop's collective, the others past the loop in the same function.

    A try whose handler swallows errors around the call: rank-exception. A loop
    with no conditional exit: it ran a different number of times per rank, which
    for a loader loop means loaders of different lengths (uneven-eval-batches).
    """
    for inside in waiting:
        for outside in waiting:
            if inside is outside or inside.site is None or not outside.frames:
                continue
            shared = list(
                itertools.takewhile(
                    lambda pair: (pair[0].file, pair[0].function) == (pair[1].file, pair[1].function),
                    zip(inside.frames, outside.frames, strict=False),
                )
            )
            if not shared:
                continue
            here, there = inside.frames[len(shared) - 1], outside.frames[len(shared) - 1]
            if _rank_branch_apart(here, there.line) or _under_a_test_apart(there, here.line):
                # `if rank == 0: evaluate(...)`: the others never entered the loop below; or
                # the other side is in a call under a test of that function that the loop is
                # not under (`if logger.improved(...): save(...)`): a branch it took, not a
                # loop it left early. The source-reading diagnosis names the branch
                return None
            # the shared function's loops that the other side is outside of, then the
            # loops of the functions below it, which the other side has left entirely: only
            # where it got past the call into them (after it, or a pass ahead in a loop of
            # the shared function around both); a side still before the call never entered
            # them (a train loop it is still in, the other side gone on to evaluate)
            before_the_call = there.line < here.line and not any(
                reading.contains(loop, there.line) for loop in reading.enclosing_loops(here.file, here.line)
            )
            below = [] if before_the_call else [(f, None) for f in inside.frames[len(shared) :]]
            candidates: list[tuple[Frame, int | None]] = [(here, there.line), *below]
            # a loop of the shared function around both sides (an epoch loop around a train
            # loop one side is in and a save the other waits in): the other side may be a
            # pass ahead, not past the inner loop
            held_above = False
            for frame, other_line in candidates:
                # the loops the other side is not in (the inner ones: an epoch loop may hold
                # both sides while only one is still in its eval loop)
                around = reading.enclosing_loops(frame.file, frame.line)
                loops = [lp for lp in around if other_line is None or not reading.contains(lp, other_line)]
                if not loops:
                    held_above = held_above or bool(around)
                    continue  # both sides inside one loop: they drifted apart, they did not leave it
                both_in_a_loop = len(loops) < len(around) or held_above  # on a later pass, above is after
                if other_line is not None and other_line < loops[-1].lineno and not both_in_a_loop:
                    # the other side waits above the loop, no loop of this function around
                    # both: it never reached the loop (a branch before it sent it elsewhere)
                    return None
                if any(
                    g.statement in ("break", "return")
                    for loop in loops
                    for g in reading.conditional_exits(frame.file, loop)
                ):
                    return None  # a break or return decided: the source-reading diagnosis says which
                return _loop_finding(inside, outside, frame, loops[0], diagnoser, evidence), both_in_a_loop
    return None


def _an_exit_before_the_call(frames: list[Frame]) -> tuple[Frame, reading.Guard] | None:
    """The first of ``frames`` (outermost first) whose function returns under a test before
    the frame's line, with that test: a way a pass skips the call the frame waits in."""
    for below in frames:
        function = reading.enclosing_function(below.file, below.line)
        if function is None:
            continue
        exits = [
            g for g in reading.conditional_exits(below.file, function, below.line) if g.statement == "return"
        ]
        if exits:
            return below, exits[-1]
    return None


def _under_a_test_apart(frame: Frame, other_line: int) -> bool:
    """Whether an ``if`` of ``frame``'s function holds its line in its body but not
    ``other_line`` (the other side's line in the same function)."""
    for node in reading.enclosing_chain(frame.file, frame.line):
        if (
            isinstance(node, ast.If)
            and any(reading.contains(b, frame.line) for b in node.body)
            and not reading.contains(node, other_line)
        ):
            return True
    return False


def _rank_branch_apart(frame: Frame, other_line: int) -> bool:
    """Whether a rank test encloses ``frame``'s line but not ``other_line`` (same function)."""
    for node in reading.enclosing_chain(frame.file, frame.line):
        if (
            isinstance(node, ast.If)
            and not reading.contains(node, other_line)
            and reading.condition_kind(frame.file, node.test) == reading.RANK
        ):
            return True
    return False


def _loop_finding(
    inside: StackClass,
    outside: StackClass,
    frame: Frame,
    loop: ast.stmt,
    diagnoser: Context,
    evidence: list[str],
) -> Explanation:
    assert inside.site is not None
    # a try whose handler swallows the error, around the call at any depth from the loop's
    # function in: `try: eval_step(batch)` in the loop, the all_reduce inside eval_step
    depth = inside.frames.index(frame) if frame in inside.frames else len(inside.frames) - 1
    swallowing, swallowing_file = None, inside.site.file
    for below in reversed(inside.frames[depth:]):
        swallowing = reading.swallowing_try(below.file, below.line)
        if swallowing is not None:
            swallowing_file = below.file
            break
    loop_frame = Frame(frame.file, loop.lineno, "")
    loop_site = diagnoser.site(loop_frame)
    # a `continue` of this loop before the call: one rank skipped a pass (a NaN loss, an
    # empty batch), and from there the ranks were a call apart, to the loop's end
    skipped, skipped_file = None, frame.file
    if swallowing is None:
        # in this loop, else in a loop of a function it calls on the way to the collective
        # (`train_epoch(...)` in the epoch loop, its `continue` on a NaN loss inside)
        skipped = skips_a_pass(frame, loop)
        for below in inside.frames[depth + 1 :]:
            if skipped is not None:
                break
            for inner in reading.enclosing_loops(below.file, below.line):
                skipped = skips_a_pass(below, inner)
                if skipped is not None:
                    skipped_file = below.file
                    break
    continuing = None
    if skipped is None and swallowing is None:
        continuing = reading.try_that_continues(loop, frame.line)
    # a function a pass calls that returns before the call under a test (`if not
    # torch.isfinite(loss): return None` before `loss.backward()`): a rank that took it
    # skipped that pass's collectives, and the ranks were a call apart from there on
    returned = None
    if skipped is None and swallowing is None and continuing is None:
        returned = _an_exit_before_the_call(inside.frames[depth + 1 :])
    caught = continuing[1] if continuing is not None else None
    if returned is not None:
        below, guard = returned
        deciding = Frame(below.file, guard.line, "")
        where = diagnoser.site(deciding)
        cause = cause_of_exit(guard.kind)
        reason = Reason(ReasonKind.EARLY_EXIT, deciding, f"return under if {guard.text}")
        message = (
            f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} in the loop at {loop_site}, "
            f"{who(outside.ranks)} already left it: the `return` under `if {guard.text}` at {where} "
            f"leaves {below.function}() before that call, skipping a pass's collectives on the ranks "
            f"where it holds ({kind_said(guard.kind)}), and the ranks were a call apart from there to "
            "the loop's end"
        )
    elif caught is not None:
        # `try: batch = next(it) / except OSError: continue`: a rank whose pass raised
        # skipped the rest of it, its collectives included
        handler_frame = Frame(frame.file, caught.lineno, "")
        caught_type = f" {ast.unparse(caught.type)}" if caught.type is not None else ""
        cause, reason = Cause.RANK_EXCEPTION, Reason(ReasonKind.SWALLOWED_ERROR, handler_frame, "except")
        message = (
            f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} in the loop at {loop_site}, "
            f"{who(outside.ranks)} already left it: the handler at {diagnoser.site(handler_frame)} (`except"
            f"{caught_type}: ... continue`) swallows an error and skips the rest of a pass, its "
            "collectives included, on the rank that raised, and the ranks were a call apart from there "
            "to the loop's end"
        )
    elif skipped is not None:
        skip = SkippedPass.of(diagnoser, skipped_file, skipped)
        cause, reason, evidence = skip.cause, skip.reason, [*evidence, skip.evidence]
        message = (
            f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} in the loop at {loop_site}, "
            f"{who(outside.ranks)} already left it: {skip.said} skipped the rest of a pass, its "
            "collectives included, on some rank, and the ranks were a call apart from there to the "
            "loop's end"
        )
    elif swallowing is not None:
        cause = Cause.RANK_EXCEPTION
        try_frame = Frame(swallowing_file, swallowing.lineno, "")
        reason = Reason(ReasonKind.SWALLOWED_ERROR, try_frame, "try")
        handler = next(
            (h for h in swallowing.handlers if not any(isinstance(n, ast.Raise) for n in ast.walk(h))), None
        )
        at = (
            f" at {diagnoser.site(Frame(swallowing_file, handler.lineno, ''))}" if handler is not None else ""
        )
        message = (
            f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} inside a try whose handler"
            f"{at} swallows errors, while {who(outside.ranks)} {'is' if len(outside.ranks) == 1 else 'are'} "
            f"past the loop at {loop_site}: a pass that raised there skipped its collectives, and the ranks "
            "were a call apart from then to the loop's end"
        )
    else:
        reason = Reason(ReasonKind.LOADER_LENGTH, loop_frame, ast.unparse(loop).splitlines()[0])
        message = (
            f"{who(inside.ranks)} {'is' if len(inside.ranks) == 1 else 'are'} still in the loop at "
            f"{relative(frame.file, os.getcwd())}:{loop.lineno} (in "
            f"{inside.blocking}), {who(outside.ranks)} already left it: the loop ran fewer "
            f"times on them"
        )
        training = loaders.trains(loop) or "in backward" in inside.blocking
        cause, detail = _loader_cause(inside.frames[: depth + 1], loop, training, evidence)
        message += detail
    return diagnoser.explanation(
        cause,
        message,
        ranks=inside.ranks,
        absent_ranks=outside.ranks,
        op=inside.blocking,
        site=_site(inside),
        evidence=evidence,
        reason=reason,
    )


def _loader_cause(
    frames: list[Frame], loop: ast.stmt, training: bool, evidence: list[str]
) -> tuple[Cause, str]:
    """A loop that ran a different number of times per rank: its loader, built without a
    sampler on a set not sharded by rank (missing-distributed-sampler), or on a training
    set each rank cut for itself (the same: a DistributedSampler gives every rank as many
    steps), or loaders of unequal lengths (uneven-eval-batches). ``frames`` end in the
    loop's function; what the loader's construction shows goes to ``evidence``."""
    origin = loaders.loader_origin([(f.file, f.line) for f in frames], loop)
    if origin is None:
        return Cause.UNEVEN_EVAL_BATCHES, ""
    built = f"{origin.name} = DataLoader(...) at {relative(origin.file, os.getcwd())}:{origin.line}"
    if origin.sampler is None and not origin.rank_sharded:
        return Cause.MISSING_DISTRIBUTED_SAMPLER, (
            f"; the loader ({built}) has no sampler and its dataset is not sharded by "
            f"rank, so each rank iterates a set of its own length"
        )
    if origin.sampler is None and training:
        return Cause.MISSING_DISTRIBUTED_SAMPLER, (
            f"; this loop trains, and its loader ({built}) has no sampler over a dataset each rank "
            "cut for itself, so each rank takes as many steps as its own share has batches"
        )
    evidence.append(f"{built}, sampler: {origin.sampler or 'none, dataset sharded by rank by hand'}")
    return Cause.UNEVEN_EVAL_BATCHES, ""


def _frame_site(frame: Frame) -> str:
    return f"{relative(frame.file, os.getcwd())}:{frame.line}"


def _site(cls: StackClass) -> str | None:
    return f"{relative(cls.site.file, os.getcwd())}:{cls.site.line}" if cls.site else None


def _at(cls: StackClass) -> str:
    """ " at train.py:12", or what a summary that names no line makes of it."""
    site = _site(cls)
    return f" at {site}" if site else " (no line of the user's code in the evidence)"


def _where(cls: StackClass) -> str:
    if not cls.frames:
        return "(no line of the user's code in the evidence)"
    return "at " + " -> ".join(f"{f.function}() {relative(f.file, os.getcwd())}:{f.line}" for f in cls.frames)


def _frame_text(frame: Frame) -> str:
    return f"{relative(frame.file, os.getcwd())}:{frame.line} in {frame.function}"
