"""Aligning per-rank collective histories and finding where they part.

Collectives pair by position in each process group's sequence: the n-th call
of a group on one rank meets the n-th call of that group on every other member.
So histories are compared per group, position by position, by call site as well
as by op and shape (a skipped call often pairs silently with a later call of the
same op), and by the loader batch each call belongs to. The first position
where the members disagree is the divergence; pairing stops there, as in
PyTorch's Flight Recorder analyzer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from ncclcheck.model import CollectiveCall

P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# Collectives a rank may well call from its own branch, the root from one line and the
# others from another: barriers carry nothing, and a root sends (or receives) what the
# others receive (or send). Symmetric ones (all_reduce) from two lines mix two values.
BRANCH_PAIRED = frozenset(
    {
        "barrier",
        "monitored_barrier",
        "broadcast",
        "broadcast_object_list",
        "scatter",
        "scatter_object_list",
        "gather",
        "gather_object",
        "reduce",
    }
)
_LOOK_AHEAD = 64  # calls read past a pairing across lines for the histories to agree again
_AGREE = 3  # calls in a row that must agree after it


class Mismatch(str, Enum):
    MISSING = "missing"  # some members never made their n-th call on the group
    OP = "op"  # different operations at the same position
    SITE = "site"  # same op, different call sites
    STEP = "step"  # same op and site, but for different loader batches
    SHAPE = "shape"  # same op and site, different shapes or dtypes
    # same op and site, for different values a framework reduces later (Lightning's
    # self.log_dict with other keys on some rank): they pair silently, wrongly
    REQUEST = "request"


@dataclass
class Divergence:
    group: str
    seq: int
    kind: Mismatch
    members: list[int]
    calls: dict[int, CollectiveCall | None]  # each member's seq-th call on the group

    @property
    def present(self) -> list[int]:
        return sorted(r for r, c in self.calls.items() if c is not None)

    @property
    def absent(self) -> list[int]:
        return sorted(r for r, c in self.calls.items() if c is None)

    @property
    def earliest(self) -> float:
        return min((c.time for c in self.calls.values() if c is not None), default=0.0)

    def majority(self) -> tuple[list[int], list[int]]:
        """(ranks that made the most common call, the other ranks) at this position.

        For a missing call the first list holds the ranks that made it. Ties go to
        the group that holds the lowest rank, so reports are stable.
        """
        if self.kind is Mismatch.MISSING:
            return self.present, self.absent
        buckets: dict[tuple[object, ...], list[int]] = {}
        for rank, call in sorted(self.calls.items()):
            buckets.setdefault(_key(call, self.kind), []).append(rank)
        ordered = sorted(buckets.values(), key=lambda ranks: (-len(ranks), ranks[0]))
        first = ordered[0]
        others = sorted(r for ranks in ordered[1:] for r in ranks)
        return first, others


def _key(call: CollectiveCall | None, kind: Mismatch) -> tuple[object, ...]:
    if call is None:
        return ("none",)
    if kind is Mismatch.OP:
        return (call.op,)
    if kind is Mismatch.SITE:
        return (call.op, call.site_text)
    if kind is Mismatch.STEP:
        return (call.op, call.site_text, _step(call))
    if kind is Mismatch.REQUEST:
        return (call.op, call.site_text, _request(call))
    return (call.op, call.site_text, call.signature)


def _request(call: CollectiveCall) -> str | None:
    return call.later.request if call.later is not None else None


def _step(call: CollectiveCall) -> tuple[object, ...] | None:
    if not call.position:
        return None
    return (call.position.get("loader"), call.position.get("batch"))


def compare(calls: dict[int, CollectiveCall | None]) -> Mismatch | None:
    """How the members' calls at one position disagree, or None when they agree."""
    made = [c for c in calls.values() if c is not None]
    if len(made) < len(calls):
        return Mismatch.MISSING
    if len({c.op for c in made}) > 1:
        return Mismatch.OP
    # A rank that ran out of batches inside DDP's Join makes stand-ins for DDP's own
    # collectives (and Join's notification) from its ``with`` line: those pair by op
    # and shape. Join has no stand-in for a collective the user's code calls.
    sited = [c for c in made if not c.shadow]
    if len(sited) < len(made) and any(c.issuer is None for c in sited):
        return Mismatch.SITE
    if len({c.site_text for c in sited}) > 1:
        return Mismatch.SITE
    if len({_request(c) for c in made}) > 1:
        return Mismatch.REQUEST
    steps = {_step(c) for c in made}
    if len(steps) > 1 and None not in steps:
        return Mismatch.STEP
    if len({c.signature[1:] for c in made}) > 1:
        return Mismatch.SHAPE
    return None


def _pair_across_lines(calls: dict[int, CollectiveCall | None]) -> bool:
    """Calls that differ by line alone, of an op a rank may call from its own branch, or
    DDP's own gradient all-reduce from backward() on another line (the documented way to
    keep a rank that skips its batch in step: a backward of a zeroed loss in the handler)."""
    made = [c for c in calls.values() if c is not None]
    if len(made) < len(calls):
        return False
    if made[0].op not in BRANCH_PAIRED and not all(c.source == "ddp" for c in made):
        return False
    steps = {_step(c) for c in made}
    return len({(c.op, c.signature[1:], _request(c)) for c in made}) == 1 and (
        len(steps) == 1 or None in steps
    )


def divergences(histories: Mapping[int, Sequence[CollectiveCall]]) -> list[Divergence]:
    """The first divergence of every process group, earliest first: StreamAligner fed
    every call at once, so whole histories and streamed ones are aligned alike."""
    aligner = StreamAligner()
    for rank, calls in histories.items():
        for call in calls:
            aligner.add(rank, call)
        aligner.rank_done(rank)
    return aligner.finish(set(histories))


class StreamAligner:
    """The first divergence of every process group, for histories that arrive a call at
    a time (load_traces reads the ranks' files in turns): a group's n-th calls are
    compared as soon as every member has made one, and a call is held only until then.
    Members outside ``known`` (a node whose traces are missing) are not held against
    the others."""

    def __init__(self) -> None:
        self._pending: dict[str, dict[int, deque[CollectiveCall]]] = {}
        self._members: dict[str, list[int]] = {}
        self._seq: dict[str, int] = {}
        self._found: dict[str, Divergence] = {}
        self._done: set[int] = set()  # ranks whose history has ended
        self.on_divergence: Callable[[Divergence], None] | None = None

    def rank_done(self, rank: int) -> None:
        """``rank`` makes no more calls: where it has none left, it is missing them now,
        not at the end of the reading (while the others' calls there are still at hand)."""
        self._done.add(rank)

    def add(self, rank: int, call: CollectiveCall) -> None:
        if call.op in P2P_OPS or call.group in self._found:
            return
        members = self._members.setdefault(call.group, [])
        if not members and call.group_ranks:
            members.extend(call.group_ranks)
        self._pending.setdefault(call.group, {}).setdefault(rank, deque()).append(call)

    def advance(self, known: set[int]) -> None:
        """Compare what every member of a group has made; ``known``: the ranks with traces."""
        for group in list(self._pending):
            self._compare(group, known, final=False)

    def found(self) -> list[Divergence]:
        """The divergences found so far, earliest first: ranks that are only behind are
        not among them (their calls are compared once they make them)."""
        return sorted(self._found.values(), key=lambda d: d.earliest)

    def finish(self, known: set[int]) -> list[Divergence]:
        """After the last call of every rank: a member with no call left is missing it."""
        for group in list(self._pending):
            self._compare(group, known, final=True)
        return self.found()

    def _branches_meet(
        self, members: list[int], queues: list[deque[CollectiveCall]], final: bool
    ) -> bool | None:
        """Whether calls of one rooted op (or barriers) from different lines meet by design:
        rank 0 broadcasts its config from the ``if`` branch, the others receive it from the
        ``else``; rank 0 prepares the data while the others wait in one barrier, then
        releases them from another (torch_distributed_zero_first). They pair whatever the
        line; it is by design when the histories agree again after them (a skipped call
        leaves the ranks one call apart for good): _AGREE calls in a row with the same
        line and the same issuer (library barriers at one line of the user's, as in a
        Lightning fit, agree by line alone). None while the calls that tell are still
        to come."""
        agreed = 0
        for ahead in range(_LOOK_AHEAD):
            upcoming: dict[int, CollectiveCall | None] = {}
            for rank, queue in zip(members, queues, strict=True):
                if ahead < len(queue):
                    upcoming[rank] = queue[ahead]
                elif final or rank in self._done:
                    upcoming[rank] = None
                else:
                    return None
            if all(c is None for c in upcoming.values()):
                return True  # every history ends here
            kind = compare(upcoming)
            if kind is None and len({c.issuer for c in upcoming.values() if c is not None}) == 1:
                agreed += 1
                if agreed == _AGREE:
                    return True
            elif kind not in (None, Mismatch.SITE) or not _pair_across_lines(upcoming):
                return False
        return False

    def _compare(self, group: str, known: set[int], final: bool) -> None:
        pending = self._pending[group]
        members = [r for r in (self._members[group] or sorted(pending)) if r in known]
        queues = [pending.setdefault(r, deque()) for r in members]
        while any(queues) and (
            final or all(q or r in self._done for r, q in zip(members, queues, strict=True))
        ):
            calls = {
                r: (queue.popleft() if queue else None) for r, queue in zip(members, queues, strict=True)
            }
            seq = self._seq.get(group, 0)
            kind = compare(calls)
            if kind is Mismatch.SITE and _pair_across_lines(calls):
                meet = self._branches_meet(members, queues, final)
                if meet is None:  # the calls that tell are still to come: put these back
                    for rank, queue in zip(members, queues, strict=True):
                        queue.appendleft(calls[rank])  # type: ignore[arg-type]
                    return
                if meet:
                    kind = None
            if kind is not None:
                found = self._found[group] = Divergence(group, seq, kind, members, calls)
                del self._pending[group]
                if self.on_divergence is not None:
                    self.on_divergence(found)
                return
            self._seq[group] = seq + 1
