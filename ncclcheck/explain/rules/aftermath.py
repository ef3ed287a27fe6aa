"""The rules for what a dead job left behind (doctor --from): NCCL's sequence numbers
per rank and process group, how each rank ended, and its stack where one was dumped.

The n-th collective of a process group on one rank pairs with the n-th on the others,
so the watchdog's ``WorkNCCL(SeqNum=n, ...)`` lines say what stack dumps cannot: which
ranks never issued a collective the others wait in, and whether the ranks disagree
on what the n-th collective is. Stacks, where present, go through the live doctor's
rules (rules/stacks.py); what no rule explains is said as such, with the evidence.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ncclcheck.causes import Cause
from ncclcheck.communicates import GRADIENT_BUCKET_MIN_NUMEL, PARAMETER_OPS, issued_at, starts_a_pass
from ncclcheck.evidence import flight_recorder
from ncclcheck.evidence.aftermath import (
    DETAIL_RUNNING,
    FR_ENTRIES,
    FR_ROWS,
    MISSING,
    NCCL_COLL,
    NCCL_RAS,
    RANK_IN_TEXT,
    SIZES,
    Aftermath,
    CollectiveCall,
    DesyncVerdict,
    Ending,
    FactKind,
    Fingerprint,
    Issued,
    LoopLength,
    OwnOutput,
    ProgressBar,
    RankAftermath,
    Source,
    TimedOutWork,
    evidence_lines,
    lived_through,
)
from ncclcheck.evidence.classes import merge_stacks, user_frames, user_frames_and_the_call_out
from ncclcheck.evidence.stacks import SCRIPTS_END, blocking
from ncclcheck.explain.context import Context, death_cause, uncaught_fix
from ncclcheck.explain.engine import Explanation, first_explanation
from ncclcheck.explain.rules.stacks import a_phase_one_side_ran, explain_classes
from ncclcheck.model import Frame, Severity, format_ranks
from ncclcheck.source import reading
from ncclcheck.wording import its, relative, signal_name, who

# what a rank that only waited says when it gives up (NCCL's watchdog, gloo, c10d)
# an error that is a wait given up, not a failure of the rank's own: a timeout, the watchdog,
# the store's connection lost because its host (torchrun's agent, or rank 0) went away
_WAITED = re.compile(
    r"timed? ?out|timeout|watchdog|communicator was aborted|collective operation|ncclUniqueId"
    r"|Connection reset by peer|Connection closed by peer|Broken pipe",
    re.I,
)


@dataclass
class Leftovers:
    d: Context
    job: Aftermath
    evidence: list[str]

    def works(self, group: str) -> dict[int, list[TimedOutWork]]:
        found: dict[int, list[TimedOutWork]] = {}
        for rank, record in sorted(self.job.ranks.items()):
            mine = [w for w in record.numbered if w.group == group]
            if mine:
                found[rank] = mine
        return found

    def unnumbered(self) -> dict[int, TimedOutWork]:
        """Each rank's one timeout where its lines number no work (torch 1.10 and older), for
        the ranks that have exactly one: the collective that rank waits in."""
        found = {}
        for rank, record in sorted(self.job.ranks.items()):
            mine = [w for w in record.timeouts if w.seq is None]
            if len(mine) == 1 and mine[0].op:
                found[rank] = mine[0]
        return found

    @functools.cached_property
    def first_timeouts(self) -> dict[str, int]:
        """Each file's line of its first watchdog timeout: what a file says before it is
        the job before the others gave up."""
        first: dict[str, int] = {}
        for record in self.job.ranks.values():
            for work in record.timeouts:
                path, line = work.source.path, work.source.line or 0
                first[path] = min(first.get(path, line), line)
        return first

    def _without_watchdog_line(self) -> list[int]:
        nccl = {r for r, rec in self.job.ranks.items() if rec.timeouts or rec.progress}
        if not nccl:
            return []
        return sorted(r for r in range(self.job.world_size) if r not in nccl and not self._failed(r))

    @property
    def silent(self) -> list[int]:
        """Ranks that left no NCCL watchdog line while others did, and something else that
        says where they were (a stack, a Flight Recorder dump, an ending of their own):
        the evidence sets them apart. Not a rank whose own NCCL reported its transport
        failing before the timeouts: that rank was in the job's collectives, on a link that
        broke, and its silence says nothing of a call it skipped."""
        failing = self.transport_failed_on
        # a launcher that stopped processes before the timeouts (its node's first failure) may
        # have stopped these before their own watchdog could time out: their own lines without
        # a timeout then say nothing of where they were
        heard_counts = not self._stopped_before_the_timeouts()
        return [
            r
            for r in self._without_watchdog_line()
            if _says_where(self.job.ranks.get(r), heard_counts)
            and r not in failing
            and not _its_stack_waits_in_their_collective(self.job.ranks.get(r), self.timed_out_ops)
        ]

    @functools.cached_property
    def timed_out_ops(self) -> set[tuple[str, int | None]]:
        """(op, elements in) of every numbered timeout: the collectives the ranks wait in."""
        return {(_op_name(w.op), w.numel_in) for r in self.job.ranks.values() for w in r.numbered if w.op}

    def _stopped_before_the_timeouts(self) -> bool:
        """Whether a launcher's line stopping processes comes before a watchdog timeout in the
        file that holds both."""
        return any(
            (closing.line or 0) < self.first_timeouts.get(closing.path, 0)
            for closing in self.job.launcher_closed.values()
        )

    @property
    def transport_failed_on(self) -> dict[int, Source]:
        """Ranks whose own lines report a failing transport or an NCCL error before the
        first watchdog timeout of their file (after it, an error is the abort's echo), each
        with its first such line."""
        found: dict[int, Source] = {}
        for rank, source in self.job.transport_errors:
            line = source.line or 0
            if rank is not None and line < self.first_timeouts.get(source.path, line + 1):
                found.setdefault(rank, source)
        return found

    @property
    def unseen(self) -> list[int]:
        """Ranks of the job the evidence says nothing about: no line of theirs, or only that
        they were aborted (SIGABRT, as NCCL's watchdog ends a waiting rank; SIGTERM, as the
        launcher stops the rest). Where they were is unknown: never a suspect on that alone."""
        return [r for r in self._without_watchdog_line() if not _says_where(self.job.ranks.get(r))]

    def _failed(self, rank: int) -> bool:
        record = self.job.ranks.get(rank)
        return record is not None and _really_failed(record)

    @property
    def groups(self) -> list[str]:
        return sorted(
            {w.group for r in self.job.ranks.values() for w in r.timeouts}
            | {g for r in self.job.ranks.values() for g in r.progress},
            key=lambda g: (len(g), g),
        )


def explain_leftovers(d: Context, job: Aftermath) -> Explanation | None:
    """The first rule of AFTERMATH_RULES that explains the leftovers, or None: then the
    command says that no rule does, and shows the evidence."""
    explanation = first_explanation(AFTERMATH_RULES, Leftovers(d, job, evidence_lines(job)))
    if explanation is not None and explanation.site is None:
        # where the ranks that waited called that collective, as their watchdog's stack trace
        # says: one line for all of them, or none is claimed
        sites = {
            (site.file, site.line)
            for rank in explanation.ranks
            for call in (job.ranks[rank].calls if rank in job.ranks else [])
            if (explanation.op is None or _same_op(call, job.ranks[rank], explanation.op))
            and (site := call.site) is not None
        }
        if len(sites) == 1:
            file, line = sites.pop()
            explanation.site = f"{file}:{line}"
    return explanation


def _same_op(call: CollectiveCall, record: RankAftermath, op: str) -> bool:
    """Whether ``call`` is the stack trace of a timed-out collective of ``op``."""
    return any(w.seq == call.seq and w.group == call.group and w.op == op for w in record.timeouts)


def _really_failed(record: RankAftermath) -> bool:
    """A rank that failed of its own: an error that is not a wait given up, or a signal
    other than the SIGABRT NCCL's watchdog takes the job down with and the SIGTERM
    torchelastic stops the survivors of a failure with."""
    ending = record.ending
    if ending is None or record.timeouts:
        return False
    if ending.error:
        return not _WAITED.search(ending.error)
    if ending.exit_code is None or ending.exit_code in (0, -6, -15):
        return False
    # a signal to a rank that was not the first to fail is the launcher ending the job
    # (torchelastic's SIGKILL after its SIGTERM): the first failure is the one that counts
    return ending.root_cause or ending.exit_code > 0


def _says_where(record: RankAftermath | None, heard_counts: bool = True) -> bool:
    """Does the evidence say anything of where this rank was, beyond that it was aborted?
    ``heard_counts``: whether its own lines with no timeout among them say it waited in no
    collective (not where its process may have been stopped before its timeout could fire)."""
    if record is None:
        return False
    if record.stack is not None or record.flight_recorder or record.progress or record.barrier_waited_on:
        return True
    # its own lines without a timeout say it waited in no collective, unless its watchdog
    # was stuck and could not have timed one out, or SIGABRT ended it as NCCL's watchdog ends
    # a rank whose collective timed out (its timeout line may be lost)
    aborted = record.ending is not None and record.ending.exit_code == -6
    if heard_counts and record.heard is not None and record.watchdog_stuck is None and not aborted:
        return True
    ending = record.ending
    return ending is not None and (bool(ending.error) or ending.exit_code not in (None, -6, -15))


def _its_stack_waits_in_their_collective(
    record: RankAftermath | None, timed_out: set[tuple[str, int | None]]
) -> bool:
    """A rank dumped waiting in the collective the others timed out in (its function's op,
    a barrier as NCCL's all-reduce of one element): it issued it and waits with them; that its
    own watchdog line is not among theirs (not pasted, not yet fired) sets it on no side of
    its own. One in another collective stays apart: it never issued theirs."""
    if record is None or record.stack is None:
        return False
    waits = blocking(record.stack)
    if not waits.waits_for_peers:
        return False
    called = _op_name(waits.what.split(" ", 1)[0])
    return any(
        called == op or (called == "barrier" and op == "allreduce" and numel in (1, None))
        for op, numel in timed_out
    )


def _fingerprint_text(f: Fingerprint) -> str:
    seq = f" #{f.seq}" if f.seq is not None else ""
    sizes = ", ".join(x for x in (f.shape and f"shape {f.shape}", f.dtype) if x)
    return f"{f.op}{seq}" + (f" ({sizes})" if sizes else "")


# Ranks meet at every collective, so their counts of collectives stay within what one
# pass of the program issues: a thousand apart is already a long stretch of calls one side
# made alone; millions is a numbering that differs (gloo's random start before torch 2.1).
_DRIFT_BOUND = 1_000_000


def the_debug_check_says(s: Leftovers) -> Explanation | None:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL compares every rank's next collective (its number,
    op, shapes and dtypes) before running it, and raises on a rank that sees another rank
    differ: a direct statement of where the ranks parted, before any wait. Its error ends
    the rank, so it comes before the rule for a rank that failed of its own."""
    pairs = [m for m in s.job.mismatches if m.other is not None]
    if not pairs:
        return None
    seen: dict[int, Fingerprint] = {}
    for mismatch in pairs:
        for fingerprint in (mismatch.running, mismatch.other):
            assert fingerprint is not None
            seen.setdefault(fingerprint.rank, fingerprint)
    said = [
        f"TORCH_DISTRIBUTED_DEBUG=DETAIL's check ({m.source}): rank {m.running.rank} runs "
        f"{_fingerprint_text(m.running)}, rank {m.other.rank} runs {_fingerprint_text(m.other)}"
        for m in pairs
        if m.other is not None
    ]
    for rank in sorted(seen):  # the check raised in the rank's call: its traceback shows where
        ending = s.job.ranks[rank].ending if rank in s.job.ranks else None
        if ending is not None and ending.error_site is not None:
            site = ending.error_site
            said.append(f"rank {rank}'s call, as its traceback ends: {site.file}:{site.line}")
    by_call: dict[tuple[int | None, str], list[int]] = {}
    for rank, fingerprint in seen.items():
        by_call.setdefault((fingerprint.seq, fingerprint.op), []).append(rank)
    if len(by_call) == 1:  # one call everywhere: its sizes or dtypes differ
        (seq, op), _ranks = next(iter(by_call.items()))
        by_size: dict[tuple[str | None, str | None], list[int]] = {}
        for rank, fingerprint in seen.items():
            by_size.setdefault((fingerprint.shape, fingerprint.dtype), []).append(rank)
        sides = sorted(by_size.items(), key=lambda item: (len(item[1]), sorted(item[1])[0]))
        odd = sorted(sides[0][1]) if len(sides) > 1 and len(sides[0][1]) < len(sides[1][1]) else []
        found = (
            f"the ranks call {op}" + (f" #{seq}" if seq is not None else "") + " with different tensors, "
            "as TORCH_DISTRIBUTED_DEBUG=DETAIL's check found before running it: "
            + "; ".join(
                f"{who(sorted(ranks))} with {', '.join(x for x in size if x)}" for size, ranks in sides
            )
        )
        if _issued_for_parameters(s, op, [_flat_numel(shape) for (shape, _dtype), _ in sides]):
            absent = sorted(set(seen) - set(odd)) if odd else []
            return _other_modules_ran(s, found, op, odd or sorted(seen), absent, said)
        return s.d.explanation(
            Cause.COLLECTIVE_SHAPE_MISMATCH,
            found,
            ranks=odd or sorted(seen),
            absent_ranks=sorted(set(seen) - set(odd)) if odd else [],
            op=op,
            site=None,
            evidence=[*s.evidence, *said],
        )
    text = "; ".join(
        f"{who(sorted(ranks))} {'runs' if len(ranks) == 1 else 'run'} {op}"
        + (f" #{seq}" if seq is not None else "")
        for (seq, op), ranks in sorted(by_call.items(), key=str)
    )
    numbers = [f.seq for f in seen.values() if f.seq is not None]
    alike = {(f.op, f.shape, f.dtype) for f in seen.values()}
    if len(alike) == 1 and len(numbers) == len(seen) and max(numbers) - min(numbers) > _DRIFT_BOUND:
        # One call, the same tensors everywhere, numbers millions apart: ranks that wait for
        # each other at every collective cannot drift that far. The numbering differs, not
        # the program (gloo's groups began theirs at random per rank before torch 2.1).
        numbered = s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH,
            f"TORCH_DISTRIBUTED_DEBUG=DETAIL's check reported a mismatch, but every rank it names "
            f"runs the same call with the same tensors ({text}), its sequence numbers "
            f"{max(numbers) - min(numbers):,} apart: more than ranks that meet at every "
            "collective can drift. The numbering differs, not the calls; no rank is set apart",
            ranks=sorted(seen),
            absent_ranks=[],
            op=next(iter(alike))[0],
            site=None,
            evidence=[*s.evidence, *said],
        )
        numbered.severity = Severity.WARNING
        numbered.fix = (
            "What decides: whether the ranks really part there. A gloo process group of torch "
            "before 2.1 started its sequence numbers at random on each rank (a known false alarm "
            "of DETAIL's check, fixed by starting them at 0): upgrade torch, or run without "
            "TORCH_DISTRIBUTED_DEBUG=DETAIL and see whether the job hangs; if it does, dump the "
            "ranks' stacks (`ncclcheck doctor --pid`)"
        )
        return numbered
    from_stacks = _stacks_say_why(s, "; ".join(said))
    if from_stacks is not None:
        return from_stacks
    call_sides = sorted(by_call.values(), key=lambda ranks: (len(ranks), sorted(ranks)[0]))
    parted = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"the ranks are not at the same collective, as TORCH_DISTRIBUTED_DEBUG=DETAIL's check found "
        f"before running it: {text}. Each side waits for a call the others make at another point "
        "(or never: a collective under a rank test pairs with the next one of the others)",
        ranks=sorted(call_sides[0]),
        absent_ranks=sorted(r for side in call_sides[1:] for r in side),
        op=None,
        site=None,
        evidence=[*s.evidence, *said],
    )
    parted.fix = _WHERE_NOT_WHY
    return parted


def _issued_for_parameters(s: Leftovers, op: str, numels: list[int | None]) -> bool:
    """Whether a collective of ``op`` with these sizes (elements, None where not flat or not
    said) is one a library issues for the model's parameters (communicates.PARAMETER_OPS), or a
    gradient bucket's all-reduce (a flat tensor of millions of elements on every rank). Not a
    parameter all-gather where the files say the model is replicated (DDP) and name no
    sharding: DDP gathers no parameters, the call is the user's own."""
    if op.upper() in PARAMETER_OPS:
        known = [n for n in numels if n is not None]
        if (
            len(known) == len(numels) >= 2
            and max(known) < GRADIENT_BUCKET_MIN_NUMEL
            and max(known) * 4 < min(known) * 5
        ):
            # small sizes within a quarter of each other: one gather of a length each rank
            # has its own (predictions of another length), not two modules' parameters
            return False
        return s.job.wrappers_said != {"replicated"}
    known = [n for n in numels if n is not None]
    return op.upper() == "ALLREDUCE" and len(known) == len(numels) and min(known) >= GRADIENT_BUCKET_MIN_NUMEL


def _flat_numel(shape: str | None) -> int | None:
    """Elements of a 1-D shape as DETAIL prints it ("[51123456]"); None for any other."""
    inner = (shape or "").strip("[] ")
    return int(inner) if inner.isdigit() else None


def _other_modules_ran(
    s: Leftovers, found: str, op: str, ranks: list[int], absent: list[int], said: list[str]
) -> Explanation:
    """Other sizes in a collective issued for the model's parameters: the ranks ran other
    modules. Read from what these ops are, not from the files: said as the likely reading."""
    if not absent:
        # the one side some of whose ranks said, before the timeouts, that their data held
        # none of something (`n_img=0`, `tokens: 0`), the other side's ranks saying nothing
        # such: the branch on the data is theirs
        said_none = _said_it_held_none(s, ranks)
        sides = [sorted(said_none), sorted(set(ranks) - set(said_none))] if said_none else []
        if sides and all(sides):
            ranks, absent = sides[0], sides[1]
            said = [*said, *(f"rank {r} said before the timeouts: '{line}'" for r, line in said_none.items())]
    kind = "gradient reduce-scatter" if "SCATTER" in op.upper() else "parameter all-gather"
    what = (
        f"most likely the {kind} that ZeRO-3 or FSDP issues for the modules a forward or backward runs "
        "(a call of the user's own to the same op with a per-rank size would be a plain shape mismatch)"
        if op.upper() in PARAMETER_OPS
        else "a gradient bucket's all-reduce (a flat tensor of millions of elements: DDP's or ZeRO's)"
    )
    explained = s.d.explanation(
        Cause.DATA_DEPENDENT_BRANCH,
        f"{found}. {op} here is {what}: with other sizes, the ranks ran other modules at this step. "
        "The likely reading is a branch on each rank's data: a batch with no images that skips the "
        "vision tower, an expert no token was routed to, a loss term computed only for some samples. "
        "What would confirm it: the batches each rank had at that step (their modalities, or which "
        "parameters got gradients: find_unused_parameters=True names them under DDP)",
        ranks=ranks,
        absent_ranks=absent,
        op=op,
        site=None,
        evidence=[*s.evidence, *said],
    )
    explained.fix = (
        "Make every rank run the same modules at every step: feed a dummy input through the branch "
        "a batch lacks (a blank image through the vision tower, multiplied by zero into the loss), "
        "group batches by modality so every rank has the same kind at one step, or, under DDP, "
        "find_unused_parameters=True; under ZeRO-3, ZeRO-2 does not gather parameters per module."
    )
    return explained


# a line that names an error: an exception's class, or the words an OOM handler prints
# ("ran out of memory on rank 1 ... skipping batch", fairseq's), a caught error too
_EXCEPTION_NAME = re.compile(r"\b\w*(?:Error|Exception)\b|(?i:\bout of memory\b)|\bOOM\b")


# a printed list of quoted names: "... order ['ema_embed_sum_1', 'ema_cluster_size_0']"
_LISTED = re.compile(
    r"^(?P<head>.*?)\[(?P<items>\s*(?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))+)\s*\]"
)
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def the_ranks_listed_the_same_names_in_other_orders(s: Leftovers) -> Explanation | None:
    """The ranks parted at a collective (the DETAIL check, or ops or sizes that differ at one
    number), and their own lines print one list of names, the same names on every rank in
    another order on each ("rank 2: ema sync order ['embed_1', 'size_0', ...]"): a loop over
    those names issues its collectives in each rank's own order (a set of strings iterates in
    the order of their hashes, which Python randomises per process). No rank is set apart."""
    if not (s.job.mismatches or _a_position_differs(s)):
        return None
    by_head: dict[str, dict[int, tuple[str, ...]]] = {}
    said_at: dict[str, list[str]] = {}
    for line in s.job.listed:
        listed = _LISTED.search(line.text)
        if listed is None or line.rank is None:
            continue
        head = re.sub(r"\d+", "N", listed.group("head")).strip()
        items = tuple(a or b for a, b in _QUOTED.findall(listed.group("items")))
        by_head.setdefault(head, {})[line.rank] = items
        said_at.setdefault(head, []).append(f"rank {line.rank} at {line.source}")
    for head, orders in by_head.items():
        if (
            len(orders) < 2
            or len({tuple(sorted(o)) for o in orders.values()}) != 1
            or len(set(orders.values())) < 2
        ):
            continue
        ranks = sorted(orders)
        shown = "; ".join(
            f"rank {r}: {', '.join(orders[r][:4])}{', ...' if len(orders[r]) > 4 else ''}" for r in ranks[:4]
        )
        return s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH,
            f"the ranks parted at a collective, and their own lines print the same "
            f"{len(orders[ranks[0]])} names in another order on each rank (`{head} [...]`: "
            f"{shown}): a loop over them issues its collectives in each rank's own order, so the "
            "n-th calls pair other items (a set of strings iterates in the order of their hashes, "
            "which Python randomises per process). No rank is set apart: each makes the same calls",
            ranks=ranks,
            absent_ranks=[],
            op=None,
            site=None,
            evidence=[*s.evidence, *said_at[head][:4]],
        )
    return None


def _a_position_differs(s: Leftovers) -> bool:
    """Whether two ranks' watchdog lines at one number of one group give other ops or sizes."""
    for group in s.groups:
        at: dict[int, set[tuple[str, int | None]]] = {}
        for works in s.works(group).values():
            for work in works:
                if work.seq is not None:
                    at.setdefault(work.seq, set()).add((work.op, work.numel_in))
        if any(len(kinds) > 1 for kinds in at.values()):
            return True
    return False


def a_transport_found_the_calls_differ(s: Leftovers) -> Explanation | None:
    """gloo's size check, NCCL's network transport or NCCL's own check reported that the
    calls two ranks made do not match: no failing network, whatever error ends the ranks
    (gloo aborts the receiving rank). The report says the calls differ, not how: the same
    call with tensors of other sizes, or another call (a rank that skipped or added one).
    A rank whose own output says it skipped a step before it is the likely odd one."""
    if not s.job.size_mismatches:
        return None
    first = s.job.size_mismatches[0]
    reporter = first.rank
    aborted = sorted(
        r for r, record in s.job.ranks.items() if record.ending is not None and record.ending.signal == 6
    )
    if reporter is None and first.said_by == "gloo's size check" and len(aborted) == 1:
        reporter = aborted[0]  # gloo's failed check aborts the process that made it
    said = []
    for report in s.job.size_mismatches:
        whose = f"rank {report.rank}" if report.rank is not None else "a rank"
        if report.expected is not None:
            said.append(
                f"{report.said_by} ({report.source}): {whose}'s call expected {report.expected:,} "
                f"bytes, its peer's sent {report.received:,}"
            )
        else:
            said.append(
                f"{report.said_by} ({report.source}): the calls differ around rank {report.around_rank}"
            )
    if reporter is not None and first.rank is None and first.expected is not None:
        said.append(f"rank {reporter} is the rank gloo aborted (SIGABRT): its receive is the one that failed")
    for rank, record in sorted(s.job.ranks.items()):
        ending = record.ending
        if ending is not None and ending.error_site is not None:
            at = ending.error_site
            said.append(f"rank {rank}'s call, as its traceback ends: {at.file}:{at.line} in {at.function}")
    before = [
        line
        for line in s.job.skip_lines
        if line.rank is not None
        and (line.source.path != first.source.path or (line.source.line or 0) < (first.source.line or 0))
    ]
    skipping = sorted({line.rank for line in before if line.rank is not None})
    involved = sorted(
        {r for r in (reporter, first.around_rank) if r is not None}
        | {r for r, record in s.job.ranks.items() if record.ending is not None and record.ending.error_site}
    )
    what = (
        f"rank {reporter}'s call expected {first.expected:,} bytes and its peer's sent {first.received:,}"
        if reporter is not None and first.expected is not None
        else f"a call expected {first.expected:,} bytes and its peer's sent {first.received:,}"
        if first.expected is not None
        else f"at and around rank {first.around_rank}"
    )
    if len(skipping) == 1 and len(s.job.ranks) > 1:
        odd = skipping[0]
        line = next(x for x in before if x.rank == odd)
        others = sorted(r for r in s.job.ranks if r != odd)
        return _said_it_skipped(
            s, odd, line, others, f"before the ranks' calls stopped matching ({first.said_by}: {what})", said
        )
    skipped = _a_call_the_source_lets_ranks_skip(s, reporter, what, first.said_by, said)
    if skipped is not None:
        return skipped
    found = s.d.explanation(
        Cause.COLLECTIVE_SHAPE_MISMATCH,
        f"{first.said_by} found that the ranks' calls do not match ({what}): the same collective with "
        "tensors of other sizes on some ranks, or another collective (a rank that skipped or added "
        "one, a call under a rank test). These files do not say which, nor which rank parted",
        ranks=involved,
        absent_ranks=[],
        op=None,
        site=None,
        evidence=[*s.evidence, *said],
    )
    found.fix = (
        "What decides: the call each rank makes at that point. Run with "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL (it names both calls, op and shapes, before running them), "
        "or dump the ranks' stacks while they wait (`ncclcheck doctor --pid`). Same call, other "
        "sizes: pad to a common size first (gather the sizes, then the padded tensors); another "
        "call: let every rank make the same collectives in the same order"
    )
    return found


def _said_it_skipped(
    s: Leftovers, odd: int, line: OwnOutput, others: list[int], when: str, said: list[str]
) -> Explanation:
    """Rank ``odd`` said it left out a step or a batch (``line``) before the ranks' calls
    stopped matching: it skipped that step's collectives. A data test's skip, or, where the
    line names an error or an ``except`` on this machine prints it, a swallowed exception."""
    cause = Cause.RANK_EXCEPTION if _EXCEPTION_NAME.search(line.text) else Cause.DATA_DEPENDENT_BRANCH
    said = list(said)
    printed_by = _a_handler_that_prints(s, line.text)
    if printed_by is not None:
        cause = Cause.RANK_EXCEPTION  # the skip is said from an except: an error was swallowed
        said.append(printed_by)
    return s.d.explanation(
        cause,
        f"rank {odd} said it left out a step {when}: the likely reading is that rank {odd} skipped "
        f"that step's collectives (DDP's gradient all-reduce in its backward) and its next call met "
        f"another of the others'. Rank {odd}'s line: '{line.text}' ({line.source})",
        ranks=others,
        absent_ranks=[odd],
        op=None,
        site=None,
        evidence=[
            *s.evidence,
            *said,
            "what would confirm it: the code that prints that line, and "
            "whether the others skip with it (a flag all-reduced first)",
        ],
    )


def _a_handler_that_prints(s: Leftovers, text: str) -> str | None:
    """Where the source of a traceback's last call is on this machine: the ``except`` in the
    loop around that call, before it, that goes on to the next pass and prints ``text`` (a
    literal piece of its message is in the line): the rank that printed it swallowed an
    error and skipped the rest of that pass. What it says, or None."""
    for record in s.job.ranks.values():
        at = record.ending.error_site if record.ending is not None else None
        if at is None or not Path(at.file).is_file():
            continue
        loop = reading.innermost_loop(at.file, at.line)
        found = reading.try_that_continues(loop, at.line) if loop is not None else None
        if found is None:
            continue
        handler = found[1]
        pieces = [
            piece.strip()
            for node in ast.walk(handler)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for piece in re.split(r"%\w|\{[^}]*\}", node.value)
            if len(piece.strip()) >= 8
        ]
        if any(piece in text for piece in pieces):
            kinds = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
            return (
                f"the line is printed by the `except{kinds}` at {at.file}:{handler.lineno}, in the loop "
                f"around {at.file}:{at.line}, which goes on to the next pass: the error was swallowed "
                "and the rest of that pass, its collectives included, skipped"
            )
    return None


_SKIPPABLE = (
    Cause.DATA_DEPENDENT_BRANCH,
    Cause.UNSYNCHRONIZED_DECISION,
    Cause.RANK_EXCEPTION,
    Cause.RANK_EARLY_EXIT,
    Cause.RANK_CONDITIONAL_COLLECTIVE,
)


def _a_call_the_source_lets_ranks_skip(
    s: Leftovers, reporter: int | None, what: str, said_by: str, said: list[str]
) -> Explanation | None:
    """The ranks' calls did not match; where the tracebacks put some ranks at one call of
    the user's and the source (lint's reading, where the files are on this machine) has a
    branch that skips that call on the ranks that take it, the rank the transport found in
    another call (``reporter``) took it: the likely reading, with the branch's line as the
    site. Ranks the files say nothing of are not set apart."""
    from ncclcheck.lint import located, run_lint  # reads source: only for this case

    at: dict[tuple[str, int], list[int]] = {}
    for rank, record in sorted(s.job.ranks.items()):
        ending = record.ending
        if ending is not None and ending.error_site is not None and Path(ending.error_site.file).is_file():
            at.setdefault((ending.error_site.file, ending.error_site.line), []).append(rank)
    if len(at) != 1:
        return None
    ((path, line), there) = next(iter(at.items()))
    if reporter is None or reporter in there:
        return None
    others = [reporter]
    try:
        findings, _ = run_lint([Path(path)])
    except Exception:  # unreadable source must not hide what the files say
        return None
    skips = [
        f
        for f in findings
        if f.cause in _SKIPPABLE
        and located(f).line == line
        and Path(located(f).path).resolve() == Path(path).resolve()
    ]
    if not skips:
        return None
    reading = skips[0]
    where = located(reading)
    decided = where.condition_line or where.line
    site = f"{s.d.site(Frame(where.path, decided, ''))}"
    message = (
        f"{said_by} found that the ranks' calls do not match ({what}); {who(there)}'s traceback ends "
        f"in the call at {s.d.site(Frame(path, line, ''))}, which the source skips on the ranks that "
        f"take a branch: {reading.message}. The likely reading is that {who(others)} took it and "
        f"{'its' if len(others) == 1 else 'their'} next call met another of {who(there)}'s"
    )
    return s.d.explanation(
        reading.cause,
        message,
        ranks=there,
        absent_ranks=others,
        op=None,
        site=site,
        evidence=[
            *s.evidence,
            *said,
            f"lint's reading of {s.d.site(Frame(path, line, ''))}: {reading.message}",
            f"what would confirm it: where {who(others)} {'was' if len(others) == 1 else 'were'} "
            "(a traceback or a stack of "
            + ("its" if len(others) == 1 else "theirs")
            + "), or TORCH_DISTRIBUTED_DEBUG=DETAIL's check naming both calls",
        ],
    )


def a_rank_failed_first(s: Leftovers) -> Explanation | None:
    dead = sorted(r for r, record in s.job.ranks.items() if _really_failed(record))
    if not dead:
        return None
    first = next((r for r in dead if (e := s.job.ranks[r].ending) is not None and e.root_cause), dead[0])
    ending = s.job.ranks[first].ending
    assert ending is not None
    waiting = sorted(r for r in s.job.ranks if r not in dead)
    if lived_through(s.job.ranks[first]):
        return _an_exception_it_lived_through(s, first, waiting)
    if ending.exit_code is None and ending.error:
        aborted_first = _the_launcher_saw_no_exit_of(s, first)
        if aborted_first is not None:
            return _an_exception_it_did_not_exit_on(s, first, waiting, aborted_first)
    fatal = _fatal_tracebacks_of_no_rank(s)
    if len(dead) == 1 and not ending.error and (ending.exit_code or 0) > 0 and len(fatal) == 1:
        # a launcher's line gave the exit code (srun's "task 6: Exited with exit code 1"), the
        # files one traceback of no rank that killed its process: the likely reading is that
        # they are one rank's death, said as such
        return _an_unowned_death(
            s, fatal[0], waiting, dead, f"{who(dead)} exited with code {ending.exit_code}"
        )
    what = ending.error or (
        f"killed by {signal_name(ending.exit_code) or 'a signal'}"
        if ending.signal
        else f"exit code {ending.exit_code}"
    )
    return _died_of(
        s,
        ending,
        lambda how: (
            f"{who(dead)} {how} ({what})"
            + (f" while {who(waiting)} waited for {'it' if len(dead) == 1 else 'them'}" if waiting else "")
        ),
        (waiting, dead),
        what,
    )


def _died_of(
    s: Leftovers, ending: Ending, said: Callable[[str], str], sides: tuple[list[int], list[int]], what: str
) -> Explanation:
    """The finding for ranks (``sides[1]``) whose process an error ended while the others
    (``sides[0]``) waited: rank-crashed for what fails a process whatever its code (out of
    memory, CUDA, a signal), else rank-exception at the raise line with the fix for an
    uncaught error. ``said`` words it, given how the rank ended ("failed", "raised and did
    not catch")."""
    cause = death_cause(ending.error)
    how = "failed" if cause is Cause.RANK_CRASHED else "raised and did not catch"
    site = f"{ending.error_site.file}:{ending.error_site.line}" if ending.error_site else None
    finding = s.d.explanation(
        cause, said(how), ranks=sides[0], absent_ranks=sides[1], op=None, site=site, evidence=s.evidence
    )
    if cause is Cause.RANK_EXCEPTION:
        finding.fix = uncaught_fix(site, what)
    return finding


def _the_launcher_saw_no_exit_of(s: Leftovers, rank: int) -> int | None:
    """The rank torchelastic saw fail first, where that was a watchdog's abort (SIGABRT) of a
    rank that timed out, not ``rank``, and the agent held every process of the job (it
    stopped all the others): an agent ends the job within seconds of a worker's exit, so
    ``rank``, which printed an exception before the others' timeout, had not exited."""
    for other, record in s.job.ranks.items():
        ending = record.ending
        if (
            other != rank
            and ending is not None
            and ending.root_cause
            and ending.signal == 6
            and record.timeouts
            and len(s.job.launcher_closed) + 1 >= s.job.world_size > 1
        ):
            return other
    return None


def _an_exception_it_did_not_exit_on(
    s: Leftovers, rank: int, waiting: list[int], aborted: int
) -> Explanation:
    ending = s.job.ranks[rank].ending
    assert ending is not None
    site = f"{ending.error_site.file}:{ending.error_site.line}" if ending.error_site else None
    found = s.d.explanation(
        Cause.RANK_EXCEPTION,
        f"rank {rank} raised ({ending.error}) and did not exit: torchelastic, which ends a job "
        f"within seconds of a worker's exit, saw its first failure only in rank {aborted}'s "
        f"watchdog abort after the timeout, and stopped every other process then, rank {rank}'s "
        f"with them. The exception ended rank {rank}'s part in the collectives while its process "
        f"lived on (caught further up, or stuck as it exited), and {who(waiting)} waited for it",
        ranks=waiting,
        absent_ranks=[rank],
        op=None,
        site=site,
        evidence=s.evidence,
    )
    found.fix = uncaught_fix(site, ending.error or "")  # no try around a collective to move
    return found


def _an_exception_it_lived_through(s: Leftovers, rank: int, waiting: list[int]) -> Explanation:
    """A rank that printed an exception and was dumped alive after it: the exception was
    caught, and the rank went on without the collectives the others wait in."""
    record = s.job.ranks[rank]
    ending, stack = record.ending, record.stack
    assert ending is not None and stack is not None
    user = user_frames(stack)
    now = f"{user[0].function}() at {user[0].file}:{user[0].line}" if user else blocking(stack).what
    return s.d.explanation(
        Cause.RANK_EXCEPTION,
        f"{who([rank])} raised ({ending.error}) and lived on: its stack, dumped after, shows it "
        f"in {now}, outside the collective"
        + (f" {who(waiting)} wait{'s' if len(waiting) == 1 else ''} in" if waiting else " the others wait in")
        + ". The exception was caught (a worker's loop, a retry, an `except` that logs and goes on)"
        " and the rank skipped what the others did. What would confirm it: the dump taken after"
        " the error's time, and the code that catches it",
        ranks=waiting,
        absent_ranks=[rank],
        op=None,
        site=f"{ending.error_site.file}:{ending.error_site.line}" if ending.error_site else None,
        evidence=s.evidence,
    )


def _at_one_position(s: Leftovers) -> list[tuple[str, int, dict[int, TimedOutWork]]]:
    """(group, seq, {rank: work}) where two or more ranks timed out at one position."""
    found = []
    for group in s.groups:
        by_seq: dict[int, dict[int, TimedOutWork]] = {}
        for rank, works in s.works(group).items():
            for work in works:
                if work.seq is not None:
                    by_seq.setdefault(work.seq, {})[rank] = work
        found += [(group, seq, works) for seq, works in sorted(by_seq.items()) if len(works) > 1]
    return found


def _position(group: str, seq: int | None) -> str:
    if seq is None:
        return "the collective each rank's watchdog timed out in (these lines number no work)"
    return f"collective #{seq} of group {group}"


def ops_differ_at_one_position(s: Leftovers) -> Explanation | None:
    positions: list[tuple[str, int | None, dict[int, TimedOutWork]]] = list(_at_one_position(s))
    unnumbered = s.unnumbered()
    if len(unnumbered) > 1:
        # lines that number no work (torch 1.10 and older) cannot place two ranks at one
        # position; two ops can still not be one collective: ranks that time out in
        # different ops wait in different collectives
        positions.append(("0", None, unnumbered))
    for group, seq, works in positions:
        by_op: dict[str, list[int]] = {}
        for rank, work in works.items():
            if work.op:  # an op cut off in its line is no other op
                by_op.setdefault(work.op, []).append(rank)
        if len(by_op) > 1:
            return _why_the_sides_parted(s, group, seq, works, by_op, {op: op for op in by_op})
    return None


def _why_the_sides_parted(
    s: Leftovers,
    group: str,
    seq: int | None,
    works: dict[int, TimedOutWork],
    by_op: dict[str, list[int]],
    op_of: dict[str, str],
) -> Explanation:
    """Ranks that made different calls at one position, each side under its label in
    ``by_op`` (an op, or an op with its size: ``op_of`` gives each label's op): what the
    files say of why, else where they parted and how to find why."""
    found = _sides_parted(s, group, seq, works, by_op)
    if found.op in op_of:
        found.op = op_of[found.op]  # the op itself: where each rank called it is found by it
    return found


def _sides_parted(
    s: Leftovers, group: str, seq: int | None, works: dict[int, TimedOutWork], by_op: dict[str, list[int]]
) -> Explanation:
    said = f"{_position(group, seq)}: " + "; ".join(
        f"{who(ranks)} issued {op}" for op, ranks in sorted(by_op.items())
    )
    from_stacks = _stacks_say_why(s, said)
    if from_stacks is not None:
        return from_stacks
    new_pass = _a_side_began_a_new_pass(s, group, seq, by_op)
    if new_pass is not None:
        return new_pass
    in_its_own_order = _iterated_in_its_own_order(s, f"the ranks disagree on {said}", sorted(works))
    if in_its_own_order is not None:
        return in_its_own_order
    uneven = _loops_of_other_lengths(s, said, by_op)
    if uneven is not None:
        return uneven
    decided = _a_decision_only_they_took(s, f"the ranks disagree on {said}", list(by_op.values()))
    if decided is not None:
        return decided
    # one rank, alone on its side, that said before the timeouts it left out a step: its
    # next call met another of the others'
    skipped = {o.rank: o for o in _before_the_timeouts(s, s.job.skip_lines) if o.rank in works}
    lone = [ranks for ranks in by_op.values() if len(ranks) == 1 and ranks[0] in skipped]
    if len(skipped) == 1 and len(lone) == 1:
        odd = lone[0][0]
        return _said_it_skipped(
            s,
            odd,
            skipped[odd],
            sorted(r for r in works if r != odd),
            f"before {_position(group, seq)}",
            [said],
        )
    # a side that said it stopped left the loop the other side is still in (either side: the
    # stopper's last call may be the one that makes its side)
    if len(by_op) == 2:
        one, other = by_op.values()
        for left, stayed in ((one, other), (other, one)):
            stopped = _said_it_stopped(s, sorted(stayed), sorted(left), f"The ranks disagree on {said}")
            if stopped is not None:
                return stopped
    announced = _a_phase_only_they_announced(s, f"the ranks disagree on {said}", list(by_op.values()))
    if announced is not None:
        return announced
    decided_apart = _one_side_reduces_to_a_root(s, group, seq, by_op)
    if decided_apart is not None:
        return decided_apart
    sides = sorted(by_op.items(), key=lambda item: (len(item[1]), item[1][0]))
    in_a_phase = _one_side_in_a_phase_of_its_own(s, said, sides)
    if in_a_phase is not None:
        return in_a_phase
    # a side of more than half the job's ranks, all of them seen, sets the others apart on
    # the numbers' face; sides of one size, or ranks these files say nothing of, set none
    everyone = sorted(r for _, ranks in sides for r in ranks)
    apart = len(sides[-1][1]) * 2 > len(everyone) and not s.unseen
    parted = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"the ranks disagree on {_position(group, seq)}: "
        + "; ".join(f"{who(ranks)} issued {op}" for op, ranks in sides)
        + ". Each side waits for a call the others make at another point (or never: a "
        "collective under a rank test pairs with the next one of the others)",
        ranks=sides[0][1] if apart else everyone,
        absent_ranks=sorted(r for _, ranks in sides[1:] for r in ranks) if apart else [],
        op=sides[0][0],
        site=None,
        evidence=s.evidence,
    )
    # the numbers prove the ranks parted here, not how: one side's extra call (under a
    # rank test, in an extra eval batch) looks the same as two calls swapped
    parted.fix = _WHERE_NOT_WHY
    return parted


def _one_side_in_a_phase_of_its_own(
    s: Leftovers, said: str, sides: list[tuple[str, list[int]]]
) -> Explanation | None:
    """Two sides at one collective, the fewer of them in two: where a stack of each shows
    the fewer ranks inside a phase a main process runs alone (a save, an evaluation) and the
    others inside none, from one function at two lines, the likely reading is that phase run
    under a rank test with a collective in it (stacks.a_phase_one_side_ran)."""
    if len(sides) != 2 or len(sides[0][1]) >= len(sides[1][1]):
        return None
    (lone_op, lone), (_, rest) = sides
    dumped = {r: st for r in lone + rest if (st := s.job.ranks[r].stack) is not None}
    lone_rank = next((r for r in lone if r in dumped), None)
    rest_rank = next((r for r in rest if r in dumped), None)
    if lone_rank is None:
        return None
    lone_stack = dumped[lone_rank]
    rest_said = f"rank {rest_rank}'s (of {who(rest)})"
    if rest_rank is not None:
        rest_stack = dumped[rest_rank]
    else:
        # no rank of the others dumped, but a dump of no known rank waits in another collective
        # than the lone side's: one of the others, as the likely reading (the lone side's ranks
        # make the lone side's call)
        # (with one lone rank, dumped: any other process's dump is one of the others)
        lone_waits = blocking(lone_stack).what
        others = [
            u
            for u in s.job.unplaced
            if (len(lone) == 1 and u.stack.pid != lone_stack.pid)
            or (blocking(u.stack).waits_for_peers and blocking(u.stack).what != lone_waits)
        ]
        if len(others) != 1:
            return None
        rest_stack = others[0].stack
        rest_said = f"the dump of no known rank in {others[0].label} (another process: one of {who(rest)})"
    outermost_first = [list(reversed(user_frames(st))) for st in (lone_stack, rest_stack)]
    found = a_phase_one_side_ran(
        *(list(reversed(user_frames_and_the_call_out(st))) for st in (lone_stack, rest_stack))
    )
    if found is None:
        return _rank_zero_alone_at_an_earlier_line(s, said, lone_op, lone, rest, outermost_first, rest_said)
    shared, theirs, phase = found
    return s.d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"the ranks disagree on {said}. Rank {lone_rank}'s stack is in {phase.function}() at "
        f"{phase.file}:{phase.line}, called from {shared.function}() at {shared.file}:{shared.line}; "
        f"{rest_said} is at line {theirs.line} of the same "
        f"{shared.function}(), in no such phase: "
        f"the likely reading is that {phase.function}() runs under a rank test and issues {lone_op} "
        f"that only {who(lone)} make{'s' if len(lone) == 1 else ''}. What would confirm it: the "
        f"test around the call at {shared.file}:{shared.line}",
        ranks=lone,
        absent_ranks=rest,
        op=lone_op,
        site=f"{shared.file}:{shared.line}",
        evidence=s.evidence,
    )


def _rank_zero_alone_at_an_earlier_line(
    s: Leftovers,
    said: str,
    lone_op: str,
    lone: list[int],
    rest: list[int],
    paths: list[list[Frame]],
    rest_said: str,
) -> Explanation | None:
    """Rank 0 alone on one side, its stack's last frame of the user's at a line of the
    function where the others' stack waits at a later line: the others went past that
    earlier call without its collective. A branch only rank 0 took is the likely reading (a
    main process's save or evaluation under `if rank == 0`); the test around the call
    confirms it."""
    lone_path, rest_path = paths
    if lone != [0] or not lone_path or not rest_path or len(lone_path) != len(rest_path):
        return None
    *above, here = lone_path
    *rest_above, there = rest_path
    if [(f.file, f.line) for f in above] != [(f.file, f.line) for f in rest_above]:
        return None
    if (here.file, here.function) != (there.file, there.function) or here.line >= there.line:
        return None
    return s.d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"the ranks disagree on {said}. Rank 0's stack is at {here.file}:{here.line} in "
        f"{here.function}(), in {lone_op}; {rest_said} is at line {there.line} of the same "
        f"{here.function}(), past that call: the others went by line {here.line} without its "
        f"collective. The likely reading is a branch only rank 0 took (`if rank == 0:` around a "
        f"save, an evaluation) with a collective in it. What would confirm it: the test around "
        f"{here.file}:{here.line}",
        ranks=lone,
        absent_ranks=rest,
        op=lone_op,
        site=f"{here.file}:{here.line}",
        evidence=s.evidence,
    )


def _op_name(op: str) -> str:
    """A watchdog's or Flight Recorder's name of an op, plain: REDUCE, nccl:reduce -> reduce;
    ALLREDUCE, nccl:all_reduce -> allreduce."""
    return op.rsplit(":", 1)[-1].strip("_").lower().replace("_", "")


def _loops_of_other_lengths(s: Leftovers, said: str, by_op: dict[str, list[int]]) -> Explanation | None:
    """Ranks that parted at a collective, where the job's own output shows one loop with
    other lengths (its bar's totals, or each rank's count of its batches): the ranks whose
    loop runs longer make a per-batch collective the others never make. Where the lengths
    are the ranks' own, those with the most batches are set apart; else the side of the
    parting that has fewer ranks."""
    by_loop: dict[str, list[LoopLength]] = {}
    for length in _before_the_timeouts(s, s.job.loop_lengths):
        by_loop.setdefault(length.what, []).append(length)
    uneven = [lengths for lengths in by_loop.values() if len({x.total for x in lengths}) > 1]
    if not uneven:
        return None
    lengths = uneven[0]
    longest = max(x.total for x in lengths)
    owned = {x.rank: x.total for x in lengths if x.rank is not None}
    parted = set().union(*map(set, by_op.values()))
    sides = sorted(by_op.values(), key=lambda ranks: (len(ranks), ranks[0]))
    if owned and set(owned) >= parted:
        longer = sorted(r for r, n in owned.items() if n == longest)
    elif len(sides) == 2 and len(sides[0]) < len(sides[1]):
        longer = sorted(sides[0])
    else:
        return None
    shorter = sorted(parted - set(longer))
    if owned and not any(set(side) == set(longer) for side in sides):
        return None  # the lengths split the ranks otherwise than the parting did
    counts = "; ".join(
        f"{who(sorted(r for r, n in owned.items() if n == total))}: {total}"
        for total in sorted({*owned.values()}, reverse=True)
    ) or ", ".join(str(total) for total in sorted({x.total for x in lengths}, reverse=True))
    where = ", ".join(str(x.source) for x in lengths[:3])
    # a training loop of other lengths per rank: its loader has no DistributedSampler, which
    # gives every rank the same count (padding, or drop_last); an evaluation's is the
    # catalogue's uneven-eval-batches whatever its sampler
    training = _TRAINING.search(lengths[0].said) and not _EVALUATING.search(lengths[0].said)
    cause = Cause.MISSING_DISTRIBUTED_SAMPLER if training else Cause.UNEVEN_EVAL_BATCHES
    return s.d.explanation(
        cause,
        f"the ranks disagree on {said}. The job's own output shows one loop of other lengths on "
        f"the ranks ('{lengths[0].said}', batches {counts}; {where}): {who(longer)}, with the "
        f"longest, made a per-batch collective of a batch {who(shorter)} never had, and met "
        f"{its(shorter)} next collective instead"
        + (
            ". A training loader whose ranks get other numbers of batches is sharded by hand (or "
            "not at all): a DistributedSampler gives every rank the same count"
            if training
            else ""
        ),
        ranks=shorter,
        absent_ranks=longer,
        op=None,
        site=None,
        evidence=s.evidence,
    )


_TRAINING = re.compile(r"\btrain(?:ing)?\b", re.IGNORECASE)
_EVALUATING = re.compile(r"\b(?:eval\w*|val\w*|valid\w*|test\w*|predict\w*)\b", re.IGNORECASE)


def _times_said(s: Leftovers, lines: list[OwnOutput]) -> list[list[OwnOutput]]:
    """One log call's lines before the timeouts, grouped by the time it was said: a rank
    that prints it again starts the next time."""
    occurrences: list[list[OwnOutput]] = [[]]
    for line in _before_the_timeouts(s, lines):
        if any(o.rank == line.rank for o in occurrences[-1]):
            occurrences.append([])
        occurrences[-1].append(line)
    return occurrences


def _a_decision_only_they_took(s: Leftovers, said: str, sides: list[list[int]]) -> Explanation | None:
    """The ranks parted into ``sides``; a line of the job's own that every rank of them had
    printed together before was printed this last time by the ranks of one side only: a
    recurring decision (a timed save, an eval every N, a log) those ranks took and the
    others did not, each deciding on a value of its own. The likely reading, with the line."""
    parted = {r for side in sides for r in side}
    for lines in s.job.rank_lines.values():
        occurrences = _times_said(s, lines)
        if len(occurrences) < 2:
            continue
        took = sorted({o.rank for o in occurrences[-1] if o.rank is not None} & parted)
        together = next((occ for occ in reversed(occurrences[:-1]) if parted <= {o.rank for o in occ}), None)
        if together is None or not any(took == sorted(side) for side in sides) or len(took) == len(parted):
            continue
        rest = sorted(parted - set(took))
        last = occurrences[-1][0]
        return s.d.explanation(
            Cause.UNSYNCHRONIZED_DECISION,
            f"{said}. Every one of these ranks had printed '{together[0].text}' together before "
            f"({together[0].source}); the last time, only {who(took)} did ('{last.text}', "
            f"{last.source}): {who(took)} took a branch {who(rest)} did not, each rank deciding it on "
            "a value of its own (a clock, a counter, a metric not reduced), the likely reading. What "
            "would confirm it: the test in the code that prints that line, and the value it reads",
            ranks=took,
            absent_ranks=rest,
            op=None,
            site=None,
            evidence=s.evidence,
        )
    return None


# a line announcing a phase a main process often runs alone: a save, an evaluation, an export
_ANNOUNCES_A_PHASE = re.compile(
    r"\b(?:sav(?:e|es|ing)|writ(?:e|es|ing)|dump(?:s|ing)?|export(?:s|ing)?|upload(?:s|ing)?|gather(?:s|ing)?)\b"
    r".{0,40}\b(?:checkpoint|ckpt|state[ _]?dict|model|weights|predictions)\b"
    r"|\b(?:running|run|start(?:s|ing)?|begin(?:s|ning)?)\s+(?:the\s+)?(?:eval(?:uation)?|validation|test(?:ing)?)\b"
    r"|\bgenerat(?:e|es|ing)\s+(?:\w+\s+)?samples\b",
    re.IGNORECASE,
)


def _a_phase_only_they_announced(s: Leftovers, said: str, sides: list[list[int]]) -> Explanation | None:
    """The ranks parted into two sides at one collective; every rank of one side, and no rank
    of the other, printed before the timeouts a line announcing a phase a main process often
    runs alone ('writing full state dict', 'running evaluation'): the likely
    reading is that phase run under a rank test with a collective in it."""
    if len(sides) != 2:
        return None
    announced: dict[int, OwnOutput] = {}
    for lines in s.job.rank_lines.values():
        for line in _before_the_timeouts(s, lines):
            if line.rank is not None and _ANNOUNCES_A_PHASE.search(line.text):
                announced[line.rank] = line
    alone = [side for side in sides if set(side) <= set(announced) and not set(announced) - set(side)]
    if len(alone) != 1:
        return None
    fewer = alone[0]
    more = next(side for side in sides if side is not fewer)
    line = announced[fewer[0]]
    announced_by = f"{said}. {who(fewer)}, and none of {who(more)}, announced a phase before the timeouts"
    if _a_rank_test_could_pick(sorted(fewer), s.job.world_size):
        cause = Cause.RANK_CONDITIONAL_COLLECTIVE
        reading = (
            f"('{line.text}', {line.source}): the likely reading is that this phase runs under a rank "
            f"test (the main process, or local rank 0 of each node) and issues a collective that only "
            f"{who(fewer)} make{'s' if len(fewer) == 1 else ''}. What would confirm it: the test around "
            "the code that prints that line, and the collective inside it (a state_dict of a sharded "
            "model all-gathers, an evaluation reduces its metrics)"
        )
    else:
        # no rank test picks these ranks (rank 0, or local rank 0 of each node): each rank
        # decided for itself, and these took the phase (its own clock, count or data)
        cause = Cause.UNSYNCHRONIZED_DECISION
        reading = (
            f"('{line.text}', {line.source}); no rank test picks {who(fewer)} (it picks rank 0, or "
            "local rank 0 of each node): the likely reading is a decision each rank takes on a value "
            f"of its own (its clock since the last save, its own count or data), which {who(more)} "
            "did not meet this time. What would confirm it: the test before the code that prints "
            "that line, and whether what it reads is agreed across the ranks (broadcast or "
            "all-reduced) first"
        )
    return s.d.explanation(
        cause,
        f"{announced_by} {reading}",
        ranks=sorted(fewer),
        absent_ranks=sorted(more),
        op=None,
        site=None,
        evidence=s.evidence,
    )


def _a_rank_test_could_pick(ranks: list[int], world: int) -> bool:
    """Whether a rank test could pick exactly ``ranks``: rank 0 alone, or local rank 0 of
    each node (0, n, 2n, ... for n ranks a node)."""
    if ranks == [0]:
        return True
    if len(ranks) < 2 or ranks[0] != 0:
        return False
    step = ranks[1] - ranks[0]
    # nodes of one size: the job's size a whole number of them
    return step > 1 and world % step == 0 and ranks == list(range(0, max(world, ranks[-1] + 1), step))


def _one_side_reduces_to_a_root(
    s: Leftovers, group: str, seq: int | None, by_op: dict[str, list[int]]
) -> Explanation | None:
    """Two ops at one position, and one side's is a reduce to one rank. Training code rarely
    calls dist.reduce but for a metric (DDP and FSDP all-reduce, reduce-scatter and
    all-gather); its result is defined on the destination only, the other ranks keep a
    partial sum. A branch every rank takes on that value (save when the loss improved, stop
    early) splits the ranks: the side still at its next reduce did not take it, the other
    side's op is the first of the branch. Where the other side all-reduces instead, both
    sides reduce a value at the same point, each its own way (another version of the code
    on one node, a branch on the local rank): an order of calls that differs, not a branch."""
    reducing = [op for op in by_op if _op_name(op) == "reduce"]
    if len(reducing) != 1 or len(by_op) != 2:
        return None
    (other,) = [op for op in by_op if op != reducing[0]]
    if _op_name(other) == "allreduce":
        return None
    reducers, others = sorted(by_op[reducing[0]]), sorted(by_op[other])
    explanation = s.d.explanation(
        Cause.UNSYNCHRONIZED_DECISION,
        f"the ranks disagree on {_position(group, seq)}: {who(reducers)} issued "
        f"{reducing[0]}, a reduce to one rank, where {who(others)} issued {other}. A reduce leaves "
        "its result on its destination only (the other ranks keep a partial sum): a decision every "
        "rank takes from a reduced value (save when the loss improved, stop early) differs "
        f"between them, and the ranks part at the first call of the branch. The most likely "
        f"reading, not a proof: the line where each side is (their stacks) decides",
        ranks=reducers,
        absent_ranks=others,
        op=reducing[0],
        site=None,
        evidence=s.evidence,
    )
    return explanation


def _pass_start(record: RankAftermath) -> Frame | None:
    """The frame, in this rank's stack or traceback, of a collective a library issues as a
    loader's pass begins (communicates.PASS_STARTS)."""
    frames = [*(record.stack.main.frames if record.stack and record.stack.main else [])]
    frames += record.ending.frames if record.ending else ()
    return next((f for f in frames if starts_a_pass(f.file, f.function)), None)


def _a_side_began_a_new_pass(
    s: Leftovers, group: str, seq: int | None, by_op: dict[str, list[int]]
) -> Explanation | None:
    """Two ops at one position, and the frames of one side (its stack, or the traceback its
    wait ended in) show the collective a prepared loader issues as a pass begins: those
    ranks ran out of batches and began the next pass, the others are still stepping through
    the last one. Their loaders gave different numbers of batches."""
    began = {
        op: {r: frame for r in ranks if (frame := _pass_start(s.job.ranks[r])) is not None}
        for op, ranks in by_op.items()
    }
    sides = [op for op, frames in began.items() if frames]
    if len(sides) != 1:
        return None  # none, or both sides at a pass's start: the frames do not tell them apart
    op = sides[0]
    rank, frame = next(iter(began[op].items()))
    what, advice = issued_at(frame.file, frame.function) or ("a new pass of a loader", "")
    early = sorted(by_op[op])
    stepping = sorted(r for other, ranks in by_op.items() if other != op for r in ranks)
    others = "; ".join(
        f"{who(ranks)} issued {other}" for other, ranks in sorted(by_op.items()) if other != op
    )
    explanation = s.d.explanation(
        Cause.UNEVEN_EVAL_BATCHES,
        f"the ranks disagree on {_position(group, seq)}: {who(early)} issued {op} in "
        f"{what} (rank {rank}'s frames: {frame.function} at {relative(frame.file, s.d.ev.cwd)}:"
        f"{frame.line}), so {'it' if len(early) == 1 else 'they'} had begun a new pass; {others}, "
        "a collective of the pass before. The ranks' loaders gave them different numbers of batches",
        ranks=stepping,
        absent_ranks=early,
        op=op,
        site=None,
        evidence=s.evidence,
    )
    explanation.fix = advice or None
    return explanation


def _items_of(text: str) -> list[str] | None:
    """The elements of a list, tuple or set as py-spy prints a local (``["loss", "top1"]``,
    ``{'a', 'b'}``), each as printed; None for any other value, or one py-spy cut short."""
    text = text.strip()
    if len(text) < 2 or text[0] + text[-1] not in ("[]", "()", "{}") or "..." in text or ":" in text:
        return None
    items = [item.strip() for item in text[1:-1].split(",") if item.strip()]
    return items if len(items) > 1 else None


def _orders_the_locals_show(s: Leftovers, ranks: list[int]) -> tuple[Frame, str, dict[str, list[int]]] | None:
    """Ranks dumped with their locals (py-spy --locals) at one frame, where one variable
    holds the same elements in another order: each rank iterates it in its own order (a
    set, a dict built from one: string hashing is seeded per process). The frame, the
    variable and the ranks by the order each holds."""
    seen: dict[tuple[str, int, str, str], dict[str, list[int]]] = {}
    for rank in ranks:
        record = s.job.ranks.get(rank)
        main = record.stack.main if record is not None and record.stack is not None else None
        if main is None or not main.locals:
            continue
        for frame, values in zip(main.frames, main.locals, strict=False):
            for name, text in values.items():
                if _items_of(text) is not None:
                    key = (frame.file, frame.line, frame.function, name)
                    seen.setdefault(key, {}).setdefault(text, []).append(rank)
    for (file, line, function, name), by_text in seen.items():
        orders = [_items_of(text) for text in by_text]
        if len(by_text) > 1 and len({tuple(sorted(o or [])) for o in orders}) == 1:
            return Frame(file, line, function), name, by_text
    return None


def _iterated_in_its_own_order(
    s: Leftovers, said: str, ranks: list[int], apart: list[int] | None = None
) -> Explanation | None:
    """``apart``: the ranks the numbers set apart, where the locals (of fewer ranks) do not."""
    shown = _orders_the_locals_show(s, ranks)
    if shown is None:
        return None
    frame, name, by_text = shown
    sides = sorted(by_text.items(), key=lambda item: (len(item[1]), item[1][0]))
    odd = sides[0][1] if len(sides) == 2 and len(sides[0][1]) < len(sides[1][1]) else apart or []
    rest = sorted(r for r in ranks if r not in odd)
    orders = "; ".join(f"{who(sorted(side))}: {text}" for text, side in sides)
    where = f"{relative(frame.file, s.d.ev.cwd)}:{frame.line}"
    return s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"{said}. The ranks' locals at {where} in {frame.function}() hold `{name}` with the same "
        f"elements in another order ({orders}): each rank issues one collective per element in its "
        f"own order, and the ranks' calls pair one element's with another's. Such an order comes "
        f"from a set, or a dict or list built from one (string hashing is seeded per process)",
        ranks=odd or sorted(ranks),
        absent_ranks=rest if odd else [],
        op=None,
        site=f"{frame.file}:{frame.line}",
        evidence=s.evidence,
    )


def sizes_differ_at_one_position(s: Leftovers) -> Explanation | None:
    for group, seq, works in _at_one_position(s):
        by_size: dict[int | None, list[int]] = {}
        for rank, work in works.items():
            by_size.setdefault(work.numel_in, []).append(rank)
        if len(by_size) > 1 and None not in by_size and len({w.op for w in works.values()}) == 1:
            op = next(iter(works.values())).op
            sides = sorted(by_size.items(), key=lambda item: (len(item[1]), item[1][0]))
            message = f"the ranks call {op} #{seq} of group {group} with different sizes: " + "; ".join(
                f"{who(ranks)} with {size} elements" for size, ranks in sides
            )
            first, earlier = _stuck_before(s, group, seq, op)
            if first:
                # the others completed that earlier call and went on: its own size parted it
                sizes = ", ".join(f"{s.works(group)[r][0].numel_in}" for r in first)
                message += (
                    f"; {who(first)} {'is' if len(first) == 1 else 'are'} stuck earlier, in {op} #{earlier} "
                    f"with {sizes} elements, which {who(sorted(works))} completed: the first to part, "
                    "with a size of its own there"
                )
            # one size on more than half the ranks, every rank of the job seen: the ranks of the
            # other sizes are the odd ones on the numbers' face (one against one, or no size on
            # a majority, sets no rank apart)
            odd: list[int] = []
            commonest = max(sides, key=lambda side: len(side[1]))[1]
            if not first and len(commonest) * 2 > len(works) and not s.unseen:
                odd = sorted(r for r in works if r not in commonest)
            in_its_own_order = _iterated_in_its_own_order(s, message, sorted(works), odd)
            if in_its_own_order is not None:
                return in_its_own_order
            # a loop the ranks' own output gives other lengths, split as the sizes split: the
            # longer loop's per-batch collective against the shorter's next one (a barrier)
            uneven = _loops_of_other_lengths(
                s, f"{op} #{seq} of group {group}", {f"{size} elements": ranks for size, ranks in sides}
            )
            if uneven is not None:
                return uneven
            if odd:
                skips = [line for line in _before_the_timeouts(s, s.job.skip_lines) if line.rank in odd]
                if len(odd) == 1 and skips:
                    majority = sorted(commonest)
                    return _said_it_skipped(
                        s, odd[0], skips[0], majority, f"before {op} #{seq} of group {group}", [message]
                    )
            if not first and _other_calls_by_their_sizes(s, op, list(by_size), sorted(works)):
                # an all-reduce of one element against one of millions: two calls, not one
                # call with a tensor of each rank's own size
                labelled = {
                    f"{op} of {size} element{'' if size == 1 else 's'}": ranks for size, ranks in sides
                }
                return _why_the_sides_parted(
                    s, group, seq, works, labelled, {label: op for label in labelled}
                )
            if not first and len(sides) == 2:
                # the sizes part the ranks as two calls would: a stack of each side, one inside
                # a phase a main process runs alone and one past it, says whose call it is
                sized = [
                    (f"{op} of {size} element{'' if size == 1 else 's'}", ranks) for size, ranks in sides
                ]
                in_a_phase = _one_side_in_a_phase_of_its_own(
                    s,
                    f"{op} #{seq} of group {group} (" + "; ".join(f"{who(r)}: {o}" for o, r in sized) + ")",
                    sized,
                )
                if in_a_phase is not None:
                    return in_a_phase
            rest = sorted(r for r in works if r not in odd)
            if not first and _issued_for_parameters(s, op, list(by_size)):
                return _other_modules_ran(s, message, op, odd or sorted(works), rest if odd else [], [])
            return s.d.explanation(
                Cause.COLLECTIVE_SHAPE_MISMATCH,
                message,
                ranks=first or odd or sorted(works),
                absent_ranks=sorted(works) if first else rest if odd else [],
                op=op,
                site=None,
                evidence=s.evidence,
            )
    return None


# ops whose tensor a program makes the same size on every rank (a metric, a gradient
# bucket, a flag), unlike a gather of what each rank holds: sizes far apart at one number
# are two different calls
_FIXED_SIZE_OPS = frozenset({"allreduce", "broadcast", "reduce"})
_FAR_APART = 8  # times


def _other_calls_by_their_sizes(s: Leftovers, op: str, sizes: list[int | None], ranks: list[int]) -> bool:
    """Sizes far apart in an op a program gives one size on every rank, the smaller not a
    gradient bucket's (buckets of other sizes are other modules run: _other_modules_ran),
    and no two stacks of these ranks at one line (the same call, then, with other tensors)."""
    known = [n for n in sizes if n is not None]
    if not (
        _op_name(op) in _FIXED_SIZE_OPS
        and len(known) == len(sizes) >= 2
        and max(known) >= _FAR_APART * max(min(known), 1)
        and min(known) < GRADIENT_BUCKET_MIN_NUMEL
    ):
        return False
    lines = set()
    for rank in ranks:
        record = s.job.ranks.get(rank)
        user = user_frames(record.stack) if record is not None and record.stack is not None else []
        if user:
            lines.add((user[0].file, user[0].line))
    return len(lines) != 1


def _stuck_before(s: Leftovers, group: str, seq: int, op: str) -> tuple[list[int], int | None]:
    """The ranks of ``group`` whose one timed-out call is the same op at an earlier number
    than ``seq``, all at the same one: ranks the others left behind."""
    behind = {
        rank: works[0].seq
        for rank, works in s.works(group).items()
        if len(works) == 1
        and (works[0].seq or 0) < seq
        and works[0].op == op
        and works[0].numel_in is not None
    }
    if not behind or len(set(behind.values())) != 1:
        return [], None
    return sorted(behind), next(iter(behind.values()))


def flight_recorders_disagree(s: Leftovers) -> Explanation | None:
    dumps = {r: rec.flight_recorder for r, rec in s.job.ranks.items() if rec.flight_recorder}
    parted = flight_recorder.disagreement(dumps)
    if parted is None:
        return None
    group, by_op = parted
    said = f"the Flight Recorders, on group {group}: " + "; ".join(
        f"{who(r)} issued {op}" for op, r in sorted(by_op.items())
    )
    from_stacks = _stacks_say_why(s, said)
    if from_stacks is not None:
        return from_stacks
    sides = sorted(by_op.values(), key=lambda ranks: (len(ranks), ranks[0]))
    disagree = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"the ranks' Flight Recorders show different collectives at the same position on group "
        f"{group}: " + "; ".join(f"{who(r)} issued {op}" for op, r in sorted(by_op.items())),
        ranks=sides[0],
        absent_ranks=sorted(r for side in sides[1:] for r in side),
        op=None,
        site=None,
        evidence=[*s.evidence, *flight_recorder.evidence(dumps)],
    )
    disagree.fix = _WHERE_NOT_WHY
    return disagree


def _numbered(sequence: str, position: int) -> str:
    return f"row {position}" if sequence == FR_ROWS else f"collective #{position}"


def _orders_from(traced: dict[int, list[Issued]]) -> tuple[int, dict[tuple[str, ...], list[int]]] | None:
    """Where the ranks' sequences first differ, and each rank's calls from there to where
    the shortest of them ends, when every rank holds the same calls there in another order
    (two calls or more): the same collectives, issued in each rank's own order. None where
    they differ otherwise (another call, another size, a call missing)."""
    at = {r: {call.position: call for call in calls} for r, calls in traced.items()}
    common = sorted(set.intersection(*(set(calls) for calls in at.values())))
    first = next(
        (p for p in common if len({(calls[p].op, calls[p].shape) for calls in at.values()}) > 1), None
    )
    if first is None:
        return None
    window = [p for p in common if p >= first]
    if len(window) < 2 or window != list(range(first, first + len(window))):
        return None
    orders: dict[tuple[str, ...], list[int]] = {}
    for rank, calls in at.items():
        order = tuple(f"{calls[p].op} of {calls[p].shape}" if calls[p].shape else calls[p].op for p in window)
        orders.setdefault(order, []).append(rank)
    if len({tuple(sorted(order)) for order in orders}) != 1:
        return None
    return first, orders


def the_same_calls_in_another_order(s: Leftovers) -> Explanation | None:
    """Each rank's sequence of issued calls (NCCL's COLL trace, DETAIL's fingerprints, the
    Flight Recorder's entries as fr_trace -j prints them) holds, from where they first
    differ, the same calls on every rank in another order: an order each rank takes from
    its own state (a set, a dict built from one, a completion order), proven by the
    sequences; no call was skipped. The side set apart: the ranks the Flight Recorder
    analyser names at that call (it compared every rank of the group), or the fewer where
    every rank of the job is traced; else none, and what would decide is said."""
    for sequence in (NCCL_COLL, DETAIL_RUNNING, FR_ENTRIES, FR_ROWS):
        traced = {
            r: rec.issued[sequence] for r, rec in sorted(s.job.ranks.items()) if rec.issued.get(sequence)
        }
        if len(traced) < 2:
            continue
        found = _orders_from(traced)
        if found is None:
            continue
        first, orders = found
        sides = sorted(orders.items(), key=lambda item: (len(item[1]), item[1][0]))
        named = sorted({r for v in s.job.fr_trace for r in v.culprits})
        odd: list[int] = []
        if (
            named
            and any(set(named) >= set(ranks) for _, ranks in sides)
            and 2 * len(named) < s.job.world_size
        ):
            odd = named
        elif len(traced) == s.job.world_size and len(sides[0][1]) < len(sides[1][1]):
            odd = sides[0][1]
        said = "; ".join(f"{who(ranks)} issued {' then '.join(order)}" for order, ranks in sides)
        decides = (
            ""
            if odd or len(traced) == s.job.world_size
            else f". Which side is odd, {its(list(traced))} sequences do not say ({len(traced)} of "
            f"{s.job.world_size} ranks traced): the other ranks' orders decide"
        )
        return s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH,
            f"the ranks issued the same calls in another order ({sequence}, from "
            f"{_numbered(sequence, first)}): {said}. Each waits in its first for the others' call of "
            "another tensor; none was skipped. Such an order is each process's own: a set, or a dict "
            "or list built from one (string hashing is seeded per process), or the order in which "
            "work completed"
            + (
                f"; the Flight Recorder analyser names {who(odd)} at this call"
                if odd and odd == named
                else ""
            )
            + decides,
            ranks=odd,
            absent_ranks=sorted(r for r in traced if r not in odd) if odd else [],
            op=None,
            site=None,
            evidence=[*s.evidence, f"{sequence}, from {_numbered(sequence, first)}: {said}"],
        )
    return None


def issued_sequences_disagree(s: Leftovers) -> Explanation | None:
    """The collectives each rank issued, numbered the same on every rank: NCCL's COLL trace
    (opCount on the communicator of every rank) or DETAIL's fingerprint lines (sequence
    number). At one number, another op (or the same op with other tensors) is a
    disagreement the numbers prove; ranks whose last number is lower than the others'
    never issued what the others went on to, as far as their lines go (a trace cut
    short, lines never flushed, reads the same: said)."""
    for sequence in (NCCL_COLL, DETAIL_RUNNING, FR_ENTRIES, FR_ROWS, NCCL_RAS):
        traced = {
            r: rec.issued[sequence] for r, rec in sorted(s.job.ranks.items()) if rec.issued.get(sequence)
        }
        if len(traced) >= 2:
            return _sequence_disagrees(s, sequence, traced)
    return None


def _sequence_disagrees(s: Leftovers, sequence: str, traced: dict[int, list[Issued]]) -> Explanation | None:
    at = {r: {call.position: call for call in calls} for r, calls in traced.items()}
    for position in sorted(set.intersection(*(set(calls) for calls in at.values()))):
        kinds: dict[tuple[str, str], list[int]] = {}
        for rank, calls in at.items():
            kinds.setdefault((calls[position].op, calls[position].shape), []).append(rank)
        if len(kinds) < 2:
            continue
        sides = sorted(kinds.items(), key=lambda item: (len(item[1]), item[1][0]))
        other_op = len({op for op, _ in kinds}) > 1
        said = "; ".join(f"{who(ranks)} issued {op} of {shape}" for (op, shape), ranks in sides)
        found = s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH if other_op else Cause.COLLECTIVE_SHAPE_MISMATCH,
            f"{sequence}, {_numbered(sequence, position)}: {said}"
            + (
                ". Each side waits for a call the others make at another point"
                if other_op
                else ". The same collective with other tensors: the ranks passed tensors of different shapes"
            ),
            ranks=sides[0][1],
            absent_ranks=sorted(r for _, ranks in sides[1:] for r in ranks),
            op=sides[0][0][0],
            site=None,
            evidence=[*s.evidence, f"{sequence}, {_numbered(sequence, position)}: {said}"],
        )
        if other_op:
            found.fix = _WHERE_NOT_WHY
        return found
    last = {r: calls[-1].position for r, calls in traced.items()}
    furthest = max(last.values())
    behind = sorted(r for r, position in last.items() if position < furthest)
    if not behind:
        return None
    ahead = sorted(r for r, position in last.items() if position == furthest)
    stopped = max(last[r] for r in behind)
    following = next((call for call in traced[ahead[0]] if call.position == stopped + 1), None)
    named = following.describe() if following is not None else f"#{stopped + 1}"
    return _never_issued(
        s,
        f"{who(ahead)} issued {named} ({sequence})"
        + (f" and went on to #{furthest}" if furthest > stopped + 1 else "")
        + f"; {who(behind)} issued up "
        f"to #{stopped} only and never issued it, as far as {its(behind)} lines go (lines cut short "
        f"or never flushed read the same). What sent {who(behind)} elsewhere, these lines do not show",
        (ahead, behind),
        following.op if following is not None else None,
        None,
        f"{sequence}: {who(behind)} issued up to #{stopped}, {who(ahead)} up to #{furthest}",
    )


def unplaced_sequences_disagree(s: Leftovers) -> Explanation | None:
    """NCCL's COLL trace of processes whose ranks nothing gives: at one opCount of the
    communicator of every rank, another op (or other sizes) is a disagreement the numbers
    prove, between those processes. Which ranks they are is not said: none is known."""
    traced = s.job.unplaced_issued
    if len(traced) < 2:
        return None
    at = {label: {call.position: call for call in calls} for label, calls in traced.items()}
    for position in sorted(set.intersection(*(set(calls) for calls in at.values()))):
        kinds: dict[tuple[str, str], list[str]] = {}
        for label, calls in at.items():
            kinds.setdefault((calls[position].op, calls[position].shape), []).append(label)
        if len(kinds) < 2:
            continue
        other_op = len({op for op, _ in kinds}) > 1
        said = "; ".join(
            f"{', '.join(labels)} launched {op} of {shape}" for (op, shape), labels in kinds.items()
        )
        found = s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH if other_op else Cause.COLLECTIVE_SHAPE_MISMATCH,
            f"{NCCL_COLL}, opCount {position:#x} on the communicator of every rank: {said}. "
            + (
                "Each side waits for a call the others make at another point"
                if other_op
                else "The same collective with other tensors: the processes passed tensors of other shapes"
            )
            + ". Which ranks these processes are, the trace does not say (no communicator init line, "
            "`comm 0x... rank N nRanks M`; NCCL's [d] is a device, not a rank); what decides which side "
            "is odd: the other ranks' lines (NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,COLL)",
            ranks=[],
            absent_ranks=[],
            op=None,
            site=None,
            evidence=[*s.evidence, f"{NCCL_COLL}, opCount {position:#x}: {said}"],
        )
        if other_op:
            found.fix = _WHERE_NOT_WHY
        return found
    return None


def the_desync_report_says(s: Leftovers) -> Explanation | None:
    """NCCL's desync report (TORCH_NCCL_DESYNC_DEBUG=1) compared the ranks through the
    store: ranks that never joined a collective are set apart by it; every rank of the
    job joined and none finished is the transport."""
    lagging = next((v for v in s.job.desync if not v.joined), None)
    said = [f"NCCL's desync report ({v.source}): " + _desync_text(v) for v in s.job.desync]
    if lagging is not None:
        others = sorted(set(range(s.job.world_size)) - set(lagging.ranks))
        return _never_issued(
            s,
            f"{who(list(lagging.ranks))} never joined collective #{lagging.seq} (count from 1), as NCCL's "
            f"desync report found; {who(others)} went on. What kept {who(list(lagging.ranks))} from it, "
            "the report does not show: their own logs or stacks do",
            (others, list(lagging.ranks)),
            None,
            None,
            "; ".join(said),
        )
    stuck = next((v for v in s.job.desync if v.joined), None)
    if stuck is None or set(stuck.ranks) != set(range(s.job.world_size)):
        return None
    return s.d.explanation(
        Cause.TRANSPORT_HANG,
        f"every rank ({who(list(stuck.ranks))}) joined collective #{stuck.seq} and none finished, as NCCL's "
        "desync report found: no rank is behind or mismatched, the collective itself made no progress; "
        "run `ncclcheck probe` with the job's launcher options",
        ranks=list(stuck.ranks),
        absent_ranks=[],
        op=None,
        site=None,
        evidence=[*s.evidence, *said],
    )


def a_monitored_barrier_names_the_late_rank(s: Leftovers) -> Explanation | None:
    """gloo's monitored_barrier is the one wait that names who did not arrive: its rank 0
    says which ranks failed to pass in time (the others only that rank 0 went quiet)."""
    if not s.job.barrier_late:
        return _the_monitored_barrier_went_unanswered(s)
    late = sorted(s.job.barrier_late)
    timeout_ms, source = s.job.barrier_late[late[0]]
    arrived = sorted(set(range(s.job.world_size)) - set(late))
    reached = sorted(s.job.barrier_reached)
    return s.d.explanation(
        Cause.STRAGGLER,
        f"{who(late)} did not reach gloo's monitored_barrier within {timeout_ms / 1000:g} s, while "
        f"{who(arrived)} did: {who(late)} was late (still busy elsewhere) or never calls it there; what "
        f"{who(late)} was doing, its own log or stack shows",
        ranks=arrived,
        absent_ranks=late,
        op="monitored_barrier",
        site=None,
        evidence=[
            *s.evidence,
            f"gloo's monitored_barrier ({source}): {who(late)} failed to pass it in {timeout_ms} ms"
            + (f"; {who(reached)} said they reached it" if reached else ""),
        ],
    )


def a_rank_past_its_scripts_end(s: Leftovers) -> Explanation | None:
    """A rank whose dumped stack is past the script's end (its main thread in
    threading._shutdown, waiting for a thread that is not a daemon), while other ranks wait
    for their peers: it left the work the others are in, and its process lingers, so no
    launcher saw it fail. A traceback in the files that no rank owns, ending in an error
    that is no wait given up, is the likely reason (rank-exception); with none, it returned
    early (rank-early-exit)."""
    ended = sorted(
        r
        for r, rec in s.job.ranks.items()
        if rec.stack is not None and blocking(rec.stack).what == SCRIPTS_END
    )
    waiting = sorted(
        r
        for r, rec in s.job.ranks.items()
        if r not in ended
        and (rec.timeouts or (rec.stack is not None and blocking(rec.stack).waits_for_peers))
    )
    if not ended or not waiting:
        return None
    errors = [e for e in s.job.unplaced_endings if e.error and not _WAITED.search(e.error)]
    lingering = (
        f"{who(ended)}'s main thread is past the script's end (threading._shutdown: it returned or "
        "raised, and the process waits for a thread that is not a daemon, so it never exits and no "
        f"launcher sees it end) while {who(waiting)} wait{'s' if len(waiting) == 1 else ''} for "
        f"{its(waiting)} peers"
    )
    if errors:
        error = errors[-1]
        site = f"{error.error_site.file}:{error.error_site.line}" if error.error_site else None
        found = s.d.explanation(
            Cause.RANK_EXCEPTION,
            f"{lingering}. These files hold a traceback no rank's prefix owns ({error.error}"
            + (f", raised at {site}" if site else "")
            + f"): the likely reading is that it is {who(ended)}'s, raised in code only "
            f"{'it' if len(ended) == 1 else 'they'} ran. What would confirm it: the pid that printed it",
            ranks=waiting,
            absent_ranks=ended,
            op=None,
            site=site,
            evidence=s.evidence,
        )
        found.fix = uncaught_fix(site, error.error or "") + (
            " Make the program's own threads daemons (or stop them in a finally), so that a rank "
            "that fails exits and the launcher stops the job"
        )
        return found
    return s.d.explanation(
        Cause.RANK_EARLY_EXIT,
        f"{lingering}: it left the work the others are in (a return or break the others did not "
        "take). What would confirm it: its own last lines, and the test before its end",
        ranks=waiting,
        absent_ranks=ended,
        op=None,
        site=None,
        evidence=s.evidence,
    )


def _fatal_tracebacks_of_no_rank(s: Leftovers) -> list[Ending]:
    """The tracebacks no rank's prefix owns that reached the script's top (`<module>` is their
    outermost frame: a process died of each), of an error that is no wait given up."""
    return [
        e
        for e in s.job.unplaced_endings
        if e.error and not _WAITED.search(e.error) and e.frames and e.frames[0].function == "<module>"
    ]


def the_one_unseen_ranks_traceback(s: Leftovers) -> Explanation | None:
    """Every rank but one left a watchdog timeout, and the one left no line at all, while the
    files hold a traceback no rank's prefix owns that propagated to the script's top
    (`<module>` is its outermost frame: the process died of it), of an error that is no wait
    given up: the likely reading is that it is that rank's, which raised and left the
    others waiting. Said as likely, with what would confirm it."""
    unseen = s.unseen
    waiting = sorted(r for r, rec in s.job.ranks.items() if rec.timeouts)
    if len(unseen) != 1 or not waiting or s.silent:
        return None
    fatal = _fatal_tracebacks_of_no_rank(s)
    if not fatal:
        return None
    return _an_unowned_death(
        s,
        fatal[-1],
        waiting,
        unseen,
        f"{who(waiting)} timed out waiting, and {who(unseen)}, the one rank of the job with no line of "
        "its own here, left none",
    )


def _an_unowned_death(
    s: Leftovers, error: Ending, waiting: list[int], owners: list[int], circumstance: str
) -> Explanation:
    """A traceback no rank's prefix owns that killed its process, read as ``owners``'s death
    for what ``circumstance`` says of them: said as the likely reading, with what would
    confirm it."""
    site = f"{error.error_site.file}:{error.error_site.line}" if error.error_site else None
    return _died_of(
        s,
        error,
        lambda how: (
            f"{circumstance}; these files hold a traceback no rank's prefix owns that reached the "
            f"script's top, so its process died of it ({error.error}"
            + (f", raised at {site}" if site else "")
            + (f", {error.source}" if error.source else "")
            + f"): the likely reading is that it is {who(owners)}'s, which {how} while {who(waiting)} "
            f"waited for it. What would confirm it: the pid or the prefix of the lines that printed it, "
            f"or {who(owners)}'s own log"
        ),
        (waiting, owners),
        error.error or "",
    )


_FIELD = re.compile(r"\b([A-Za-z_][\w.]*)\s*[=:]\s*(-?\d+(?:\.\d+)?|nan|inf|-inf)\b", re.IGNORECASE)


# fields a log line counts by that say nothing of the data when zero
_COUNTERS = re.compile(
    r"^(?:step|global_step|epoch|iter\w*|rank|local_rank|batch(?:_idx)?|idx|lr|loss|seed)$", re.I
)


def _said_it_held_none(s: Leftovers, ranks: list[int]) -> dict[int, str]:
    """The ranks among ``ranks`` whose own lines before the timeouts give a field of the data
    as zero or not finite (`n_img=0`), where no other rank's lines give that field so:
    each with its line."""
    found: dict[int, str] = {}
    heard = [*(line for lines in s.job.rank_lines.values() for line in lines), *s.job.output_before]
    for line in _before_the_timeouts(s, heard):
        rank = line.rank
        if rank is None and (named := RANK_IN_TEXT.search(line.text)):
            rank = int(named.group(1))  # "[dbg] rank=11 n_img=0": the rank its text names
        if rank is None or rank not in ranks:
            continue
        fields = [(name, value) for name, value in _FIELD.findall(line.text) if not _COUNTERS.match(name)]
        if any(_empty(value) for _name, value in fields):
            found.setdefault(rank, line.text)
    return found if len(found) < len(ranks) else {}


def _empty(value: str) -> bool:
    """A value that makes a test of the data take another branch: zero, or not finite."""
    return value.lower() in ("nan", "inf", "-inf") or float(value) == 0


def a_rank_ahead_by_its_own_lines(s: Leftovers) -> Explanation | None:
    """A line every rank printed each step ('[r3] step 5121 n_box_local=0'), printed one more
    time by some ranks only, whose stacks or timeouts say the others wait: those ranks are a
    step ahead, so in the step they all printed they skipped a collective the others made.
    Where their copy of that step's line holds a value that is zero or not finite in a field
    every other rank's holds otherwise, the likely reading is a branch on that value of their
    own data (no boxes, an empty batch, a NaN loss) that skips the collective."""
    stuck = {
        r
        for r, rec in s.job.ranks.items()
        if rec.timeouts or (rec.stack is not None and blocking(rec.stack).waits_for_peers)
    }
    if not stuck:
        return None
    for lines in s.job.rank_lines.values():
        occurrences = _times_said(s, lines)
        if len(occurrences) < 2:
            continue
        printers = {o.rank for occ in occurrences for o in occ if o.rank is not None}
        together = occurrences[-2]
        ahead = sorted({o.rank for o in occurrences[-1] if o.rank is not None})
        behind = sorted(printers - set(ahead))
        if (
            len(printers) < 2
            or {o.rank for o in together} != printers
            or not behind
            or not set(behind) & stuck
        ):
            continue
        fields = {o.rank: dict(_FIELD.findall(o.text)) for o in together}
        for name in fields[ahead[0]]:
            theirs = [fields[r].get(name) for r in ahead]
            others = [fields[r].get(name) for r in behind]
            if None in theirs or None in others:
                continue
            if all(_empty(v) for v in theirs if v) and not any(_empty(v) for v in others if v):
                said = next(o for o in together if o.rank == ahead[0])
                later = occurrences[-1][0]
                return s.d.explanation(
                    Cause.DATA_DEPENDENT_BRANCH,
                    f"{who(ahead)} printed '{later.text}' ({later.source}), a step past {who(behind)}, "
                    f"which printed the step before with {'it' if len(ahead) == 1 else 'them'} and "
                    f"wait there: in that step {who(ahead)} skipped a collective the others made. "
                    f"{its(ahead).capitalize()} line of that step holds {name}={theirs[0]} where every "
                    f"other rank's is not zero ('{said.text}', {said.source}): the likely reading is a "
                    f"branch on that value of {its(ahead)} own data (nothing to reduce, an empty batch) "
                    "that skips the collective. What would confirm it: the test on that value around "
                    "the collective",
                    ranks=behind,
                    absent_ranks=ahead,
                    op=None,
                    site=None,
                    evidence=s.evidence,
                )
    return None


def a_rank_never_published_its_nccl_id(s: Leftovers) -> Explanation | None:
    """Ranks that created a NCCL communicator at their first collective on a group and never
    got the id its first rank publishes: that rank never reached its first collective there.
    A store whose connection was reset or closed means the job was being torn down, most
    often because that rank had failed; a timeout, that it was busy elsewhere or gone."""
    waiting = {r: w for r, rec in s.job.ranks.items() if (w := rec.unique_id_from) is not None}
    if not waiting:
        return None
    ranks = sorted(waiting)
    first = sorted({rank for rank, _, _ in waiting.values()})
    errors = sorted({error for _, error, _ in waiting.values()})
    gone = any(re.search(r"reset|closed|broken pipe|refused", e, re.I) for e in errors)
    found = s.d.explanation(
        Cause.RANK_CRASHED if gone else Cause.STRAGGLER,
        f"{who(ranks)} created a NCCL communicator at {its(ranks)} first collective on a group and never "
        f"got the id {who(first)} publishes there: {who(first)} never reached that collective. "
        + (
            f"The store's connection was lost ({errors[0]}): the job was being torn down, most often "
            f"because {who(first)} had failed before it; {its(first)} own traceback says why"
            if gone
            else f"The wait gave up ({errors[0]}): {who(first)} was busy elsewhere for the whole "
            "timeout, or gone"
        ),
        ranks=ranks,
        absent_ranks=first,
        op=None,
        site=None,
        evidence=s.evidence,
    )
    found.fix = (
        f"What decides: {who(first)}'s own output before this (a traceback: rank-exception or "
        "rank-crashed, fix what it raised; a long step of its own, such as loading or preprocessing "
        "data while the others wait: do it before init_process_group or on every rank)."
    )
    return found


_LONG_WORK_S = 300  # where no timeout is known: a bar this long into its work held the others


def _output_outside(s: Leftovers, works: dict[int, list[TimedOutWork]]) -> str:
    """The job's own last lines before its first timeout, where no rank that timed out
    printed them: the phase some process outside the collective was in ("Clustering 111M
    points ..."), quoted with where they are; "" where there are none."""
    lines = [o for o in s.job.output_before if o.rank is None or o.rank not in works]
    return ", then ".join(f"'{o.text}' ({o.source})" for o in lines)


# A line that opens long one-off work, as a job announces it: "Clustering 111M points ...",
# "Tokenizing train split", "Starting checkpoint save", "Running evaluation". Only work a
# process does once, outside the step loop: a step's own log ("step 120 loss 0.3") says
# where a rank was, not that it was busy there. Optional prefixes (a timestamp, a level, a
# logger's name in brackets) come first.
_OPENS_WORK = re.compile(
    r"^\W*(?:[\d:.,/T-]+\s+|\[[^\]]*\]\s*|(?:INFO|DEBUG|WARNING|WARN)\b[:\s-]*|[\w.]+:\s+)*"
    r"(?:(?:start(?:ing|ed)?|begin(?:ning)?|now)\s+)?"
    r"(?:"
    r"(?:cluster|preprocess|pre-process|tokeni[sz]|download|extract|index|build|load|sav|writ|export"
    r"|convert|evaluat|validat|generat|comput|encod|embedd|sort|shuffl|filter|cach|pack|group|compil"
    r"|prepar|merg|consolidat|upload|copy|fetch|scann|verif|hash|decompress|unpack|resiz|dedup)"
    r"(?:ing|e|ation|ion)?\b"
    r"|k-?means\b"
    r"|running\s+(?:evaluation|validation|inference|generation|eval|k-?means)\b)",
    re.IGNORECASE,
)


# an early stop's own words: a decision on the rank's own values (its metric, its clock), not
# a loop's end ("early stopping", "patience exhausted", "exit duration reached", "time limit")
_EARLY_STOP = re.compile(
    r"early[ _-]?stop|patience|no improvement|plateau"
    r"|\b(?:exit|time|wall[ -]?clock|wall ?time)[ _-]?(?:duration|limit|budget)\b|\bdeadline\b",
    re.IGNORECASE,
)


_Said = TypeVar("_Said", OwnOutput, LoopLength)


def _before_the_timeouts(s: Leftovers, lines: list[_Said]) -> list[_Said]:
    """The lines printed before the first timeout of their file (all of a file that holds
    none: a rank's own log): what a rank said after the others gave up is not a cause."""
    first = s.first_timeouts
    return [o for o in lines if o.source.path not in first or (o.source.line or 0) < first[o.source.path]]


def _said_it_stopped(s: Leftovers, waited: list[int], candidates: list[int], said: str) -> Explanation | None:
    """One rank the others waited for said, before they timed out, that it stopped
    training or was leaving: it left the loop the others stayed in. An early stop's words
    make it a decision taken on the rank's own values; else its loop ended (its data ran
    out, its count of steps differs). Untagged, the line counts only where one rank is the
    candidate, and only in a file of the job's log (one that holds timeouts too: not the
    prose of a post, whose title may say "hangs instead of exiting")."""
    logs = s.first_timeouts
    lines = [
        o
        for o in _before_the_timeouts(s, s.job.stop_lines)
        if (o.rank in candidates) or (o.rank is None and len(candidates) == 1 and o.source.path in logs)
    ]
    ranks = {o.rank if o.rank is not None else candidates[0] for o in lines}
    if len(ranks) != 1:
        return None
    (rank,) = ranks
    line = lines[0]
    record = s.job.ranks.get(rank)
    where = ""
    if record is not None and record.stack is not None:
        user = user_frames(record.stack)
        at = f" in {user[0].function}() at {user[0].file}:{user[0].line}" if user else ""
        where = f"; its stack, dumped after, waits in {blocking(record.stack).what}{at}, past the loop"
    quoted = f"'{line.text}' ({line.source})"
    cause, reading = _what_a_stop_says(line, [rank], "trained on into a collective it never issued")
    return s.d.explanation(
        cause,
        f"{said}. Rank {rank}'s own output before the timeout says it stopped: {quoted}{where}. "
        f"The likely reading: {reading}",
        ranks=waited,
        absent_ranks=[rank],
        op=None,
        site=None,
        evidence=s.evidence,
    )


def _what_a_stop_says(line: OwnOutput, stopped: list[int], the_others_then: str) -> tuple[Cause, str]:
    """The cause a stop line of ``stopped`` points to, with the likely reading: an early
    stop's words (or several ranks, but not all, stopping at once) make it a decision each
    rank took on its own values; else the loop's length on those ranks differs."""
    they = who(stopped)
    if _EARLY_STOP.search(line.text) or len(stopped) > 1:
        return Cause.UNSYNCHRONIZED_DECISION, (
            f"a stop decided on {they}'s own values (a validation loss, a patience count, a clock "
            f"of {its(stopped)} own): the others, whose values had not met it, {the_others_then}. "
            "What would confirm it: the code that takes the decision, and whether its inputs are "
            "all-reduced (or the flag broadcast) first"
        )
    return Cause.RANK_EARLY_EXIT, (
        f"{they} left the loop the others stayed in (its data ran out first, or its count of steps "
        f"differs): a loop whose length or exit is rank-local. What would confirm it: the loop's "
        f"bound on {they} against the others' (its shard's length, its stop test)"
    )


def the_ranks_that_said_they_stopped_wait_apart(s: Leftovers) -> Explanation | None:
    """Some ranks, not all, said before the timeouts that they stopped or were leaving
    ("exit duration reached, saving checkpoint and exiting"), and those ranks timed out in
    one collective no other rank timed out in, while the others timed out elsewhere: they
    left the loop into the exit path (a final save's barrier, a last reduce) and the others
    stayed in training. Their words, with where each side waits, set them apart."""
    said: dict[int | None, OwnOutput] = {}
    for o in _before_the_timeouts(s, s.job.stop_lines):
        if o.rank is not None:
            said.setdefault(o.rank, o)  # each rank's first word of it
    stopped = sorted(r for r in said if r is not None)
    positions = {
        rank: {(w.group, w.seq, w.op) for w in record.numbered}
        for rank, record in s.job.ranks.items()
        if record.numbered
    }
    theirs = {p for rank in stopped for p in positions.get(rank, set())}
    others = sorted(set(positions) - set(said))
    if not stopped or len(theirs) != 1 or not others or not set(stopped) & set(positions):
        return None
    (apart,) = theirs
    if all(positions[r] == {apart} for r in others):
        return _one_number_two_calls(s, said, others, apart)
    if any(apart in positions[r] for r in others):
        return None
    group, seq, op = apart
    line = said[stopped[0]]
    cause, reading = _what_a_stop_says(
        line, stopped, "stayed in the training loop and never reached the collective of its exit path"
    )
    elsewhere = sorted({f"{o} #{n}" for r in others for (_, n, o) in positions[r]})
    shown = ", ".join(elsewhere[:3]) + (f" and {len(elsewhere) - 3} more" if len(elsewhere) > 3 else "")
    return s.d.explanation(
        cause,
        f"{who(stopped)} said before the timeouts that {'they' if len(stopped) > 1 else 'it'} "
        f"stopped ('{line.text}', {line.source}) and timed out in {op} #{seq} of group {group}, "
        f"which no other rank timed out in; {who(others)} timed out in other collectives ({shown}). "
        f"The likely reading: {reading}",
        ranks=stopped,
        absent_ranks=others,
        op=op,
        site=None,
        evidence=s.evidence,
    )


def _one_number_two_calls(
    s: Leftovers, said: dict[int | None, OwnOutput], others: list[int], position: tuple[str, int | None, str]
) -> Explanation | None:
    """Every rank timed out at one number in one op whose lines give no sizes (torch 1.13 and
    older), and before that some ranks said they stopped while the others, ranks that print
    lines of their own too, did not: one number, two calls (the stoppers' exit path, a final
    barrier, against the others' next training step). Sizes that agree leave it one call."""
    group, seq, op = position
    stopped = sorted(r for r in said if r is not None)
    sizes = {w.numel_in for r in [*stopped, *others] for w in s.job.ranks[r].numbered}
    if sizes != {None}:
        return None
    everyone = {*stopped, *others}
    spoken = next(
        (
            lines[-1]
            for lines in s.job.rank_lines.values()
            if everyone <= {o.rank for o in _before_the_timeouts(s, lines)}
        ),
        None,
    )
    if spoken is None:
        return None  # the others may print nothing of their own: their silence is no evidence
    line = said[stopped[0]]
    cause, reading = _what_a_stop_says(
        line,
        stopped,
        f"went on into the next step, whose {op} took the same number as the stoppers' last call",
    )
    return s.d.explanation(
        cause,
        f"every rank timed out in {op} #{seq} of group {group}, and these lines give no sizes to "
        f"tell the calls apart; before that, {who(stopped)} said {'they' if len(stopped) > 1 else 'it'} "
        f"stopped ('{line.text}', {line.source}) and {who(others)}, which "
        f"print{'s' if len(others) == 1 else ''} lines of {its(others)} own "
        f"('{spoken.text}', {spoken.source}), did not. The likely reading: {reading}",
        ranks=stopped,
        absent_ranks=others,
        op=op,
        site=None,
        evidence=s.evidence,
    )


def _opened_work_while_they_waited(
    s: Leftovers, works: Collection[int], unseen: list[int]
) -> tuple[int, list[OwnOutput]] | None:
    """The job's last output before the timeout opens long one-off work and comes from no
    rank that timed out: the one rank these files hold nothing of was doing it. Untagged
    output counts for it only where it is the one rank unseen (with several, which one
    printed it a line cannot say)."""
    if len(unseen) != 1:
        return None
    (lone,) = unseen
    record = s.job.ranks.get(lone)
    if record is not None and record.stack is not None and blocking(record.stack).waits_for_peers:
        return None  # its stack says where it was: waiting for the others, not busy
    lines = [o for o in s.job.output_before if o.rank is None or o.rank not in works]
    if not lines or any(o.rank is not None and o.rank != lone for o in lines):
        return None
    opening = [o for o in lines if _OPENS_WORK.search(o.text)]
    return (lone, lines) if opening else None


def _opened_work(
    s: Leftovers, waited: list[int], lone: int, lines: list[OwnOutput], said: str, op: str | None
) -> Explanation:
    """Ranks that waited in a collective while the job's last words opened work no waiting
    rank was doing: the one rank unseen is the likely straggler. Said as the likely reading:
    a line without a prefix does not name who printed it."""
    quoted = ", then ".join(f"'{o.text}' ({o.source})" for o in lines)
    tagged = all(o.rank == lone for o in lines)
    whose = (
        f"rank {lone}'s own," if tagged else "from no rank that timed out as far as the lines' prefixes say,"
    )
    named = s.d.explanation(
        Cause.STRAGGLER,
        f"{said}. The job's last output before the timeout, {whose} opens long work: {quoted}. The "
        f"likely reading: rank {lone} was busy with that work, outside any collective, while the "
        "others waited (a straggler); "
        + ("its output says so" if tagged else f"rank {lone}'s stack or its own log confirms it"),
        ranks=waited,
        absent_ranks=[lone],
        op=op,
        site=None,
        evidence=s.evidence,
    )
    named.fix = (
        "Do long one-off work (clustering, tokenising, a dataset map, a download, a save) before "
        "init_process_group, or on every rank, or cache its result so the run starts from it; else "
        "give the process group a timeout that covers it (init_process_group(timeout=...), the "
        f"Trainer's ddp_timeout). What would confirm it: rank {lone}'s stack while the job hangs "
        "(`ncclcheck doctor --pid`, `py-spy dump`) or its own log; a traceback there instead makes "
        "it rank-exception."
    )
    return named


def _busy_with_its_work(
    s: Leftovers, waited: list[int], suspects: list[int], bar: ProgressBar, said: str, op: str | None
) -> Explanation:
    """Ranks that waited in a collective while the log shows work a rank outside it was
    doing, unfinished (a progress bar): that rank is the straggler."""
    whose = "its own output shows" if bar.rank is not None else "the log shows"
    named = s.d.explanation(
        Cause.STRAGGLER,
        f"{said}; {whose} work still running while {who(waited)} waited: {bar.describe()} ({bar.source}), "
        f"unfinished. No rank inside the collective could be doing it: {who(suspects)}, busy with it, "
        f"{'is' if len(suspects) == 1 else 'are'} the first suspect",
        ranks=waited,
        absent_ranks=suspects,
        op=op,
        site=None,
        evidence=s.evidence,
    )
    named.fix = (
        "Do long one-off work (tokenising, a dataset map, a download) before init_process_group, "
        "or on every rank, or cache its result (a tokenized dataset path) so the run starts from "
        "it; else give the process group a timeout that covers it (the Trainer's ddp_timeout, "
        "init_process_group(timeout=...)). What decides otherwise: that rank's own output."
    )
    return named


def _busy_while_they_waited(
    s: Leftovers, works: dict[int, list[TimedOutWork]], unseen: list[int]
) -> tuple[list[int], ProgressBar] | None:
    """A progress bar the log holds unfinished, running for most of the others' wait: work a
    rank outside the collective was doing. Its prefix says whose; unprefixed, it is the one
    rank the files hold nothing of, or nobody's (several such ranks: which, a bar cannot say)."""
    limits = [w.timeout_ms for ws in works.values() for w in ws if w.timeout_ms]
    for bar in s.job.progress_bars.values():
        if limits and bar.elapsed_s * 1000 < min(limits) / 2:
            continue  # too short to have held anyone for the timeout
        if not limits and bar.elapsed_s < _LONG_WORK_S:
            continue
        if bar.rank is not None and bar.rank in unseen:
            return [bar.rank], bar
        if bar.rank is None and len(unseen) == 1:
            return unseen, bar
    return None


def _the_monitored_barrier_went_unanswered(s: Leftovers) -> Explanation | None:
    """Ranks that reached gloo's monitored_barrier and got no answer from the rank that
    coordinates it (rank 0): it never came, or it waited there on another rank that did
    not, which its own line would name ("Rank N failed to pass"). With no such line in the
    files, the coordinator is the first suspect, said as such."""
    unanswered = {r: rec.barrier_waited_on for r, rec in s.job.ranks.items() if rec.barrier_waited_on}
    if not unanswered:
        return None
    waiting = sorted(unanswered)
    waited_on = sorted({rank for rank, _ in unanswered.values()})
    sources = [str(source) for _, source in unanswered.values()]
    running = [
        bar
        for bar in s.job.progress_bars.values()
        if bar.rank in waited_on or (bar.rank is None and bar.elapsed_s >= _LONG_WORK_S)
    ]
    found = s.d.explanation(
        Cause.STRAGGLER,
        f"{who(waiting)} reached gloo's monitored_barrier and got no answer from {who(waited_on)}, "
        f"which coordinates it: either {who(waited_on)} never reached the barrier (busy elsewhere, "
        f"or gone), or it waited there on another rank that did not come, which {its(waited_on)} own "
        f'log would name ("Rank N failed to pass monitoredBarrier"). No such line is here: '
        f"{who(waited_on)} is the first suspect"
        + (
            f"; the log shows work still running as they waited: {running[0].describe()} "
            f"({running[0].source}), unfinished"
            if running
            else ""
        ),
        ranks=waiting,
        absent_ranks=waited_on,
        op="monitored_barrier",
        site=None,
        evidence=[
            *s.evidence,
            f"gloo's monitored_barrier ({sources[0]}"
            + (f" and {len(sources) - 1} more" if len(sources) > 1 else "")
            + f"): {who(waiting)} reached it, then errors waiting for {who(waited_on)}",
        ],
    )
    found.fix = (
        f"What decides: {who(waited_on)}'s own log or stack. A line \"Rank N failed to pass "
        f'monitoredBarrier" there names another rank as late; a traceback says it failed; a '
        "progress bar or a stack outside the barrier says what kept it busy. Work that keeps one "
        "rank from the barrier for long (preprocessing, a download, a map over the dataset) is done "
        "before init_process_group, on every rank, or cached; else the barrier gets a timeout sized for it."
    )
    return found


def _desync_text(verdict: DesyncVerdict) -> str:
    if verdict.joined:
        return f"{who(list(verdict.ranks))} joined but did not finish collective #{verdict.seq}"
    return f"{who(list(verdict.ranks))} did not join collective #{verdict.seq}"


# the analyser's error types, as the causes they are
_FR_TRACE_CAUSES = {
    "SIZE_OR_SYNTAX_MISMATCH": Cause.COLLECTIVE_SHAPE_MISMATCH,
    "COLLECTIVE_DTYPE_MISMATCH": Cause.COLLECTIVE_SHAPE_MISMATCH,
    "COLLECTIVE_TYPE_MISMATCH": Cause.COLLECTIVE_ORDER_MISMATCH,
}


def the_flight_recorder_analyser_says(s: Leftovers) -> Explanation | None:
    """torch's own analyser (fr_trace) compared every rank's Flight Recorder: its first
    verdict, read as it is, with what it does not say said too."""
    if not s.job.fr_trace:
        return None
    verdict = s.job.fr_trace[0]
    op = verdict.op or "a collective"
    named = f"{op} #{verdict.seq}" + (f" of group {verdict.group}" if verdict.group else "")
    user = next((f for f in verdict.frames if "/torch/" not in f.file.replace("\\", "/")), None)
    site = f"{relative(user.file, s.d.ev.cwd)}:{user.line}" if user else None
    at = f" (called from {user.function}() at {site})" if user else ""
    said = f"the Flight Recorder analyser (fr_trace, {verdict.source})"
    if verdict.kind == MISSING and verdict.missing:
        issued = verdict.issued_by
        why = f"{said}: {who(verdict.missing)} never joined {named}{at}, which {who(issued)} issued"
        return _never_issued(
            s,
            f"{who(issued)} issued {named}{at} and waited; {who(verdict.missing)} never joined it, as "
            "torch's Flight Recorder analyser found. What sent them elsewhere, it does not show: their "
            "own last entries or stacks do",
            (issued, verdict.missing),
            op,
            site,
            why,
        )
    kinds = sorted(set(verdict.culprits.values()))
    cause = next((_FR_TRACE_CAUSES[k] for k in kinds if k in _FR_TRACE_CAUSES), None)
    if verdict.kind == SIZES:
        cause = Cause.COLLECTIVE_SHAPE_MISMATCH
    if cause is not None:
        culprits = sorted(verdict.culprits)
        return s.d.explanation(
            cause,
            f"the ranks' Flight Recorders disagree at {named}{at}: "
            + (", ".join(kinds) if kinds else "input and output sizes do not add up")
            + (
                f"; the analyser names {who(culprits)} (it may name a rank that only saw another's error)"
                if culprits
                else ""
            ),
            ranks=[],
            absent_ranks=[],
            op=op,
            site=site,
            evidence=[*s.evidence, f"{said}: {named}, input sizes {verdict.input_sizes or '?'}"],
        )
    undecided = s.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"torch's Flight Recorder analyser found the ranks' records disagree at {named}{at}, but its "
        "error message is not in these files: a different op, size, dtype or state at one sequence "
        "number (two different collectives paired by their number, where one rank issued another)",
        ranks=[],
        absent_ranks=[],
        op=op,
        site=site,
        evidence=[
            *s.evidence,
            f"{said}: {named}, input sizes {verdict.input_sizes or '?'} on the first rank",
        ],
    )
    undecided.severity = Severity.WARNING
    undecided.fix = (
        "What decides: the analyser's `error msg:` line for this collective (rerun fr_trace on the "
        "dumps), or every rank's Flight Recorder dump given to doctor --from"
    )
    return undecided


def _stacks_say_why(s: Leftovers, said: str) -> Explanation | None:
    """The stacks' explanation, where they give a reason (a rank test, an exit...) for a
    parting the numbers located: the numbers become its evidence."""
    from_stacks = stacks_decide(s)
    if from_stacks is None or from_stacks.reason is None:
        return None
    from_stacks.evidence = [*from_stacks.evidence, said]
    return from_stacks


def completed_on_some_ranks_only(s: Leftovers) -> Explanation | None:
    """A rank waits in collective #n of a group while another rank completed #n. One
    collective completes on every rank in it or on none, bar a transport that fails during
    it; and a rank's collectives on a group complete in order. So a rank that completed #n
    and more past it completed them without the waiting rank's calls: the two paired
    different calls at #n or before (an extra or missing collective on one side, or the
    same ones in another order). The numbers prove where the ranks parted, not which side
    left the common path."""
    for group in s.groups:
        waits = {r: n for r, rec in sorted(s.job.ranks.items()) if (n := rec.waits_in(group)) is not None}
        done = {
            r: n for r, rec in sorted(s.job.ranks.items()) if (n := rec.last_completed(group)) is not None
        }
        # a rank's watchdog times out its oldest unfinished collective of the group first (the
        # earlier ones were enqueued, so timed, before it): one that timed out in #n and said
        # nothing of #n-1 had completed it
        inferred = {
            r: min(w.seq for w in rec.numbered if w.group == group and w.seq is not None) - 1
            for r, rec in sorted(s.job.ranks.items())
            if r not in done and any(w.group == group for w in rec.numbered)
        }
        done = {**inferred, **done}
        if not waits:
            continue
        first = min(waits.values())
        stuck = sorted(r for r, n in waits.items() if n == first)
        past = sorted(r for r, n in done.items() if n >= first)
        if not past:
            continue
        furthest = max(done[r] for r in past)
        work = next(
            (w for r in stuck for w in s.job.ranks[r].timeouts if w.group == group and w.seq == first), None
        )
        named = work.describe() if work is not None else f"#{first} on group {group}"
        later = "; ".join(
            f"rank {r} then waited in {w.describe()}"
            for r in past
            for w in s.job.ranks[r].timeouts
            if w.group == group and w.seq is not None and w.seq > first
        )
        said = (
            f"{who(past)} completed collectives of group {group} up to #{furthest}; {who(stuck)} never "
            f"completed #{first}"
        )
        if any(r in inferred for r in past):
            said += (
                f" ({who(sorted(r for r in past if r in inferred))}: from {its(past)} watchdog's timeout "
                "in the next one, which it reports only once the collectives before it completed)"
            )
        # past the one collective a failing transport may leave half done: proven. At it,
        # the transport's failure is a reading only where the files show one failing (an
        # NCCL error, a network error); a timeout on every side stands against it
        proven = furthest > first
        transport = [src for _, src in s.job.transport_errors]
        unseen = s.unseen
        after = f"#{first + 1}" if furthest == first + 1 else f"#{first + 1}-#{furthest}"
        message = (
            f"{who(stuck)} waited in {named}; {who(past)} completed {its(past)} own #{first}"
            + (f" and {after} after it" if proven else "")
            + ". A rank's collectives on one "
            "group complete in order, so "
            + (
                f"{who(past)} completed {after} with no call of {who(stuck)} after #{first}: the ranks "
                f"paired different calls at #{first} or before (an extra or a missing collective on one "
                "side, or the same ones in another order)"
                if proven
                else f"either the ranks paired different calls at #{first} or before, or the transport "
                f"failed during #{first} after {who(past)} had all {its(past)} data"
            )
            + (f"; {later}" if later else "")
            + (
                ""
                if proven
                else (
                    f" ({len(transport)} line(s) here report a failing transport or an NCCL error, "
                    f"the first at {transport[0]}: both readings fit)"
                    if transport
                    else ". No line here reports a failing transport or an NCCL error, only timeouts: "
                    "the first reading is the one the files support (a log that shows the transport's "
                    "errors would revive the second)"
                )
            )
            + ". Which side left the common path, these numbers do not say"
            + (f" (nothing here of {who(unseen)})" if unseen else "")
        )
        parted = s.d.explanation(
            Cause.COLLECTIVE_ORDER_MISMATCH,
            message,
            ranks=stuck,
            absent_ranks=past,
            op=work.op if work is not None else None,
            site=None,
            evidence=[*s.evidence, said],
        )
        parted.fix = _WHERE_NOT_WHY
        if not proven and transport:
            parted.severity = Severity.WARNING  # two readings fit
        return parted
    return None


def some_ranks_never_issued_it(s: Leftovers) -> Explanation | None:
    """Ranks whose last enqueued collective on a group is behind the others', or that left
    no watchdog line at all while the others timed out, never issued the collective the
    others wait in: name it from the ranks that did. Stacks, where dumped, may tell why
    (the live rules); else it is said that the logs do not."""
    silent = s.silent
    for group in s.groups:
        # a rank is behind only where a progress line says where it stopped issuing and
        # another rank waits in a later collective: NCCL's calls return at once, so a rank
        # that enqueued more than another may still wait in an earlier one, which the other
        # did issue (a count of enqueued calls alone sets no rank apart)
        waits = {r: n for r, rec in sorted(s.job.ranks.items()) if (n := rec.waits_in(group)) is not None}
        stopped = {
            r: n for r, rec in sorted(s.job.ranks.items()) if (n := rec.last_enqueued(group)) is not None
        }
        waiting = s.works(group)
        ahead = max(waits.values(), default=None)
        behind = sorted(r for r, n in stopped.items() if ahead is not None and n < ahead)
        if behind and ahead is not None:
            made = sorted(r for r, n in waits.items() if n == ahead)
            missed = ahead
            how = (
                f"{who(behind)} enqueued up to #{max(stopped[r] for r in behind)} on group {group}, "
                f"{who(made)} waited in #{ahead}"
            )
        elif (
            silent
            and waiting
            and len({(w.seq, w.op) for ws in waiting.values() for w in ws}) == 1
            and (numbered := next(iter(waiting.values()))[0].seq) is not None
        ):
            behind, made = silent, sorted(waiting)
            missed = numbered
            how = (
                f"{who(silent)} left no watchdog line while these files hold other evidence of "
                f"{'it' if len(silent) == 1 else 'them'}: no NCCL collective was waiting there"
            )
        else:
            continue
        work = next(
            (w for r in made for w in s.job.ranks[r].timeouts if w.group == group and w.seq == missed), None
        )
        named = work.describe() if work is not None else f"#{missed} on group {group}"
        return _never_issued(
            s,
            f"{who(made)} issued {named} and waited; {who(behind)} never issued it. What sent "
            f"{who(behind)} elsewhere, the logs do not show: dump the ranks' stacks (py-spy) "
            "with the logs, or run `ncclcheck preflight` on the script",
            (made, behind),
            work.op if work is not None else None,
            None,
            f"{how}: {who(behind)} never issued {named}",
        )
    return None


def _outside_any_collective(
    s: Leftovers, waited: list[int], behind: list[int], said: str, op: str | None
) -> Explanation | None:
    """The ranks that never issued the collective were dumped, each outside any collective
    (compute, I/O, its data pipeline): busy while the others waited. From one snapshot, the
    likely reading, said with what would confirm it."""
    where = []
    moved = []
    for rank in behind:
        record = s.job.ranks.get(rank)
        stack = record.stack if record is not None else None
        if record is None or stack is None or stack.main is None or not stack.main.frames:
            return None
        holds = blocking(stack)
        if holds.waits_for_peers or holds.sync:
            return None  # a device sync waits on the GPU, which may wait on a collective
        user = user_frames(stack)
        at = (
            f" in {user[0].function}() at {relative(user[0].file, s.d.ev.cwd)}:{user[0].line}" if user else ""
        )
        where.append(f"rank {rank}: {holds.what}{at}")
        if (moves := _frames_moved(record)) is not None:
            moved.append(
                f"rank {rank}'s dumps at {record.earlier_stack[1] if record.earlier_stack else ''} "
                f"and {record.stack_source}: {moves}"
            )
    if not where:
        return None
    confirmed = len(moved) == len(behind)
    return s.d.explanation(
        Cause.STRAGGLER,
        f"{said}. Where {who(behind)} {'were' if len(behind) > 1 else 'was'}, {its(behind)} stack says, "
        "was outside any collective "
        f"({'; '.join(where)}): busy there while {who(waited)} waited, "
        + (
            f"and {its(behind)} frames moved between two dumps ({'; '.join(moved)}): work under way, "
            "a rank slower than the collective's timeout, not a program that parted. The fix is to let "
            "the others wait for it (a longer timeout for this phase, or the work done before the "
            "process group starts, or shared across the ranks)"
            if confirmed
            else "the likely reading from one snapshot. What would confirm it: a second dump a little "
            "later (frames that move are work under way; a collective it then reaches that the others "
            "never call makes it rank-conditional-collective)"
        ),
        ranks=waited,
        absent_ranks=behind,
        op=op,
        site=None,
        evidence=s.evidence,
    )


def _waiting_on_its_own_device(
    s: Leftovers, waited: list[int], behind: list[int], said: str, op: str | None
) -> Explanation | None:
    """The ranks that never issued the collective were dumped at a device sync point (a
    `torch.cuda.synchronize()`, an `.item()`), with no NCCL collective of theirs waiting (no
    watchdog line of theirs): what they wait for is their own GPU's work, not a peer. A
    kernel that runs long or never ends keeps them from the collective the others wait in:
    the likely reading, a straggler on its own device, with what would confirm it."""
    where = []
    for rank in behind:
        record = s.job.ranks.get(rank)
        stack = record.stack if record is not None else None
        if record is None or stack is None or record.timeouts:
            return None
        holds = blocking(stack)
        if not holds.sync:
            return None
        user = user_frames(stack)
        at = (
            f" in {user[0].function}() at {relative(user[0].file, s.d.ev.cwd)}:{user[0].line}" if user else ""
        )
        where.append(f"rank {rank} at {holds.sync}{at} ({record.stack_source})")
    if not where:
        return None
    return s.d.explanation(
        Cause.STRAGGLER,
        f"{said}. {who(behind).capitalize()} {'waits' if len(behind) == 1 else 'wait'} at a device sync "
        f"point ({'; '.join(where)}) with no NCCL collective of {its(behind)} own waiting: what "
        f"{'it waits' if len(behind) == 1 else 'they wait'} for is {its(behind)} own GPU's work, not "
        f"a peer. The likely reading is a kernel on that device running long or never ending (a "
        f"custom kernel, a device fault), which keeps {who(behind)} from the collective "
        f"{who(waited)} wait in. What would confirm it: that GPU busy while the others idle in "
        "NCCL (nvidia-smi's utilization and power), `py-spy dump --native` in a CUDA wait, or the "
        "same run with CUDA_LAUNCH_BLOCKING=1 naming the kernel",
        ranks=waited,
        absent_ranks=behind,
        op=op,
        site=None,
        evidence=s.evidence,
    )


def _frames_moved(record: RankAftermath) -> str | None:
    """Where a rank's two dumps differ in its main thread's innermost frame: the frames,
    earlier then later; None with one dump, or two in the same place."""
    if record.earlier_stack is None or record.stack is None:
        return None
    earlier, later = record.earlier_stack[0].main, record.stack.main
    if earlier is None or later is None or not earlier.frames or not later.frames:
        return None
    first, then = earlier.frames[0], later.frames[0]
    if (first.file, first.line, first.function) == (then.file, then.line, then.function):
        return None
    return (
        f"{first.function}() at {first.file}:{first.line}, then {then.function}() at {then.file}:{then.line}"
    )


def _never_issued(
    s: Leftovers,
    message: str,
    sides: tuple[list[int], list[int]],
    op: str | None,
    site: str | None,
    said: str,
) -> Explanation:
    """Ranks that issued a collective and ranks that never did (``sides``), located by the
    numbers: the stacks, where dumped, say why; else it is said that nothing here does."""
    from_stacks = _stacks_say_why(s, said)
    if from_stacks is not None:
        return from_stacks
    stopped = _said_it_stopped(s, sides[0], sides[1], said[0].upper() + said[1:])
    if stopped is not None:
        return stopped
    decided = _a_decision_only_they_took(s, said[0].upper() + said[1:], [sides[0], sides[1]])
    if decided is not None:
        return decided
    outside = _outside_any_collective(s, sides[0], sides[1], said[0].upper() + said[1:], op)
    if outside is not None:
        return outside
    on_its_device = _waiting_on_its_own_device(s, sides[0], sides[1], said[0].upper() + said[1:], op)
    if on_its_device is not None:
        return on_its_device
    bar = next((b for b in s.job.progress_bars.values() if b.rank is not None and b.rank in sides[1]), None)
    if bar is not None and bar.rank is not None:
        # the rank's own output: work unfinished as the others timed out (tokenizing, a
        # dataset map): it was busy outside every collective, not on another path
        return _busy_with_its_work(s, sides[0], [bar.rank], bar, said, op)
    opened = _opened_work_while_they_waited(s, sides[0], sides[1])
    if opened is not None:
        return _opened_work(s, sides[0], *opened, said[0].upper() + said[1:], op)
    # no reason known. A side a rank test could pick (rank 0 alone, each node's local rank
    # 0) makes a call under a rank test the likely reading, as the commonest cause of all;
    # any other split is not said as a cause, only where the ranks parted
    picked = any(_a_rank_test_could_pick(side, s.job.world_size) for side in sides)
    unexplained = s.d.explanation(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        message
        + (
            ". The likely reading, from the split alone: a rank test (the main process, or each "
            "node's local rank 0) sent one side to a call, or past it"
            if picked
            else ". No rank test picks either side, and no cause is named from the numbers alone"
        ),
        ranks=sides[0],
        absent_ranks=sides[1],
        op=op,
        site=site,
        evidence=[*s.evidence, said],
    )
    if not picked:
        unexplained.severity = Severity.WARNING
    # not one playbook's fix, but how to find the reason
    unexplained.fix = _FIND_THE_REASON
    return unexplained


def a_rank_blocked_in_the_kernel(s: Leftovers) -> Explanation | None:
    """A rank with no stack whose process a `ps` listing shows in uninterruptible sleep (STAT
    D: blocked in the kernel on a disk or a network file system; a stack dumper cannot stop
    it, so its dump fails) while other processes wait in a collective: it is outside every
    collective, and the one the others wait for."""
    blocked = [
        r
        for r, rec in sorted(s.job.ranks.items())
        if rec.stack is None
        and rec.pid is not None
        and s.job.process_states.get(rec.pid, ("", None))[0].startswith("D")
    ]
    if not blocked:
        return None
    placed = sorted(
        r for r, rec in s.job.ranks.items() if rec.stack is not None and blocking(rec.stack).waits_for_peers
    )
    unplaced = [u.label for u in s.job.unplaced if blocking(u.stack).waits_for_peers]
    if not placed and not unplaced:
        return None
    facts = []
    for rank in blocked:
        pid = s.job.ranks[rank].pid
        assert pid is not None
        state, where = s.job.process_states[pid]
        facts.append(f"rank {rank} (pid {pid}): STAT {state} in the process listing ({where})")
        if pid in s.job.dump_errors:
            error, at = s.job.dump_errors[pid]
            facts.append(f"rank {rank} (pid {pid}): its stack dump failed: {error} ({at})")
    waiting = who(placed) if placed else f"the processes of {', '.join(unplaced)}"
    found = s.d.explanation(
        Cause.STRAGGLER,
        f"{who(blocked)} {'is' if len(blocked) == 1 else 'are'} in uninterruptible sleep (STAT D: blocked "
        "in the kernel, on a disk or a network file system), with no stack (a dumper cannot stop a "
        f"process in that state), while {waiting} wait in a collective: {who(blocked)} is outside every "
        "collective, the one the others wait for; the collective is only where they wait",
        ranks=placed,
        absent_ranks=blocked,
        op=None,
        site=None,
        evidence=[*s.evidence, *facts],
    )
    found.fix = (
        f"Look at the host of {who(blocked)}, not at NCCL: what its process reads or writes there (a "
        "checkpoint or log on a shared file system, a dataset on a network mount): `cat /proc/PID/stack` "
        "and `cat /proc/PID/wchan` show the kernel call it sleeps in, dmesg the file system's errors. "
        "Write checkpoints and logs to local disk and copy them off in the background; a longer "
        "process-group timeout only hides the stall"
    )
    return found


def stacks_decide(s: Leftovers) -> Explanation | None:
    stacks = {r: rec.stack for r, rec in s.job.ranks.items() if rec.stack is not None}
    if not stacks:
        return None
    dumped = sorted(stacks)
    classes = merge_stacks({r: st for r, st in stacks.items() if st.threads or st.status == "stopped"})
    # the ranks the files name without a stack: where they were, the stacks cannot say
    not_dumped = tuple(sorted(set(s.job.ranks) - set(dumped)))
    explanation = explain_classes(
        s.d,
        classes,
        len(dumped),
        dumped,
        s.job.world_said == len(dumped) and not not_dumped,
        not_dumped,
        processes_listed=False,
    )
    if explanation.cause is Cause.STRAGGLER and all(s.job.ranks[r].numbered for r in dumped):
        # "no rank in a collective" from stacks at a device sync point or in compute, of ranks
        # whose watchdogs timed out in one: they wait behind it (NCCL's calls return at
        # once); the watchdog lines place them, the rules on those decide
        return None
    # where each stack was read: the file, and the line of its dump
    explanation.evidence += evidence_lines(s.job, {FactKind.STACK})
    if explanation.cause is Cause.TRANSPORT_HANG:
        # as the live doctor says: alike stacks do not show on which pass of that line each
        # rank is; a cycle or an extra call earlier looks the same without --locals
        explanation.evidence.append(
            "the stacks agree but do not show on which pass of this line each rank is: with "
            "`py-spy dump --locals` (the loop variables), NCCL's watchdog lines or the Flight "
            "Recorder, doctor can compare the ranks' positions"
        )
    if len(dumped) < s.job.world_size:
        explanation.evidence.append(
            f"stacks of ranks {format_ranks(dumped)} only, of "
            + (f"{s.job.world_size}" if s.job.world_said else f"at least {s.job.world_size}")
            + ": the others were not dumped"
        )
    return explanation


def every_rank_at_one_position(s: Leftovers) -> Explanation | None:
    """Every rank the evidence covers timed out in one collective: no rank is set apart.
    With every rank of the job covered, the code is aligned as far as the logs show and
    the transport is the suspect; with ranks the evidence says nothing about, two readings
    fit (they never issued it, or they waited too) and what would decide is said."""
    for group in s.groups:
        works = s.works(group)
        # a line cut before its op's name ended agrees with any op at its number
        kinds = {(w.seq, w.op, w.numel_in) for ws in works.values() for w in ws if w.op}
        if not kinds:
            kinds = {(w.seq, w.op, w.numel_in) for ws in works.values() for w in ws}
        numbers = {w.seq for ws in works.values() for w in ws}
        last = {rec.last_enqueued(group) for rec in s.job.ranks.values()} - {None}
        if (
            not works
            or len(kinds) != 1
            or len(numbers) != 1
            or len(last) > 1
            or s.silent
            or (len(works) < 2 and not s.unseen)
        ):
            continue
        seq, op, _ = kinds.pop()
        if seq is None:  # works() holds numbered timeouts only
            continue
        unseen = s.unseen
        # one rank that said it left out a step before the timeouts: the same op at one
        # number is then the others' call of that step against its call of the next
        skipped = {
            line.rank: line for line in _before_the_timeouts(s, s.job.skip_lines) if line.rank in works
        }
        if len(skipped) == 1:
            ((odd, line),) = skipped.items()
            assert odd is not None
            others = sorted(r for r in works if r != odd)
            return _said_it_skipped(
                s, odd, line, others, f"before the ranks timed out in {op} #{seq} of group {group}", []
            )
        failing = s.transport_failed_on
        if not unseen and not failing and s.job.world_said < s.job.world_size:
            return _all_it_shows_at_one_position(s, sorted(works), op, seq, group)
        if not unseen or failing:
            message = (
                f"every rank that left a watchdog line timed out in the same collective, {op} #{seq} "
                f"of group {group}: the code is aligned as far as the logs show, the transport is "
                "the suspect; run `ncclcheck probe` with the job's launcher options"
            )
            if failing:
                # the transport failing on some ranks before any timeout: those ranks are the ones
                # the evidence is about (the link), whether or not the files cover the whole job
                said_at = ", ".join(f"{who([r])} at {source}" for r, source in sorted(failing.items())[:4])
                message = (
                    f"before the timeouts NCCL reported its transport failing on {who(sorted(failing))} "
                    f"({said_at}); {who(sorted(works))} then timed out in "
                    f"{'the same collective, ' if len(works) > 1 else ''}{op} #{seq} of group {group}: the "
                    "likely reading is the network (that link or node) stalling the job's collectives, not "
                    "a program that parted. "
                    + (
                        f"These files say nothing of {who(unseen)}; what would confirm it: their watchdog "
                        "lines, and "
                        if unseen
                        else "What would confirm it: "
                    )
                    + "`ncclcheck probe` over the job's nodes (the failing one drained)"
                )
            return s.d.explanation(
                Cause.TRANSPORT_HANG,
                message,
                ranks=sorted(failing) if failing else sorted(works),
                absent_ranks=[],
                op=op,
                site=None,
                evidence=[
                    *s.evidence,
                    *(f"{who([r])}: a failing transport said at {at}" for r, at in failing.items()),
                ],
            )
        first = " (the job's first collective on it)" if seq == 1 else ""
        # work the job shows running outside the collective explains the one rank's silence
        # better than a death nothing shows: those come before the crash suspicion
        waited_in = (
            f"{who(sorted(works))} timed out in {'the same collective, ' if len(works) > 1 else ''}"
            f"{op} #{seq} of group {group}{first}"
        )
        stopped = _said_it_stopped(s, sorted(works), unseen, waited_in)
        if stopped is not None:
            return stopped
        busy = _busy_while_they_waited(s, works, unseen)
        if busy is not None:
            suspects, bar = busy
            said = f"{waited_in}, and {who(suspects)} left no line of {its(suspects)} own"
            return _busy_with_its_work(s, sorted(works), suspects, bar, said, op)
        opened = _opened_work_while_they_waited(s, works, unseen)
        if opened is not None:
            busy_rank, lines = opened
            said = f"{waited_in}; of rank {busy_rank} these files hold no line, not even a timeout"
            return _opened_work(s, sorted(works), busy_rank, lines, said, op)
        lone = unseen[0] if len(unseen) == 1 and unseen[0] not in s.job.ranks else None
        # the world size stated, not inferred from the largest rank seen: an excerpt of a
        # larger job's log would otherwise show one rank "missing" between those it holds
        if lone is not None and len(works) == s.job.world_size - 1 and s.job.world_said == s.job.world_size:
            # Every rank but one timed out here, and of that one the files hold nothing. A rank
            # that took another path at a collective of this group (a call of its own, or one
            # skipped) would then issue one here too, wait, and time out with the others: its
            # silence says it was in no collective of this group at all. It had died or raised
            # and not yet exited, or it was busy outside collectives for the whole timeout.
            suspect = s.d.explanation(
                Cause.RANK_CRASHED,
                f"every rank but rank {lone} timed out in {op} #{seq} of group {group}{first}, and these "
                f"files hold no line of rank {lone}, not even a timeout of its own: it never issued "
                "that collective and was waiting in no other, as a rank that took another path at a "
                "collective would be. Most likely it raised or died and had not exited (a traceback "
                "or an exit code of its own decides); else it was busy outside any collective for "
                "the whole timeout (a rank-0-only evaluation or save: straggler)",
                ranks=sorted(works),
                absent_ranks=[lone],
                op=op,
                site=None,
                evidence=s.evidence,
            )
            suspect.fix = (
                f"Read rank {lone}'s own output for the moment the others last progressed: a traceback "
                "(rank-exception: an error in code only it runs, a save or a log, often at an epoch's "
                "end), an exit code or signal (rank-crashed: the OOM killer, a segfault), or, if it "
                "was alive and busy, its stack (`py-spy dump` while it hangs; straggler). Run "
                "`ncclcheck preflight` on the script to find which."
            )
            return suspect
        blocked = [r for r in unseen if r in s.job.ranks and s.job.ranks[r].watchdog_stuck is not None]
        aborted = [r for r in unseen if r in s.job.ranks and r not in blocked]
        said_of_aborted = (
            f"; {who(aborted)} {'was' if len(aborted) == 1 else 'were'} only seen aborted, as NCCL's "
            "watchdog or the launcher ends a rank that waits"
            if aborted
            else ""
        ) + (
            f"; {who(blocked)} had {its(blocked)} watchdog stuck in a NCCL or CUDA call, so no timeout of "
            f"{its(blocked)} own could be said"
            if blocked
            else ""
        )
        phase = _output_outside(s, works)
        undecided = s.d.explanation(
            Cause.STRAGGLER if seq > 1 or phase else Cause.TRANSPORT_HANG,
            f"{who(sorted(works))} timed out in {'the same collective, ' if len(works) > 1 else ''}"
            f"{op} #{seq} of group {group}{first}; "
            f"these files say nothing of where {who(unseen)} {'was' if len(unseen) == 1 else 'were'}"
            f"{said_of_aborted}. No rank is set apart by this evidence: either {who(unseen)} never "
            "reached the collective (still loading, busy elsewhere, or a call skipped there) or every "
            "rank waited in it (the transport)"
            + (
                f". The job's last output before the timeout, from no rank that timed out as far as its "
                f"lines say: {phase}: a process busy in that phase, outside the collective, is the likely "
                "reading (a straggler); which rank printed it decides"
                if phase
                else ""
            ),
            ranks=sorted(works),
            absent_ranks=[],
            op=op,
            site=None,
            evidence=s.evidence,
        )
        undecided.severity = Severity.WARNING  # two readings fit: neither is said as found
        undecided.fix = (
            f"What decides: the watchdog lines or stacks of {who(unseen)} (their own log files, "
            "`py-spy dump` while a job hangs), or Flight Recorder dumps (TORCH_FR_BUFFER_SIZE=2000)"
            + (
                "; and as it is the first collective, `ncclcheck probe` with the job's launcher options"
                if seq == 1
                else ""
            )
        )
        return undecided
    return None


def _all_it_shows_at_one_position(
    s: Leftovers, ranks: list[int], op: str, seq: int, group: str
) -> Explanation:
    """Every rank the files show timed out in one collective, and nothing states the job's
    size (its world is only the highest rank seen): these may be all of it, the transport
    then the suspect, or one node of a larger job whose other ranks the files never show
    (a job of 2 nodes of 8, node 0's log only). Neither is said as found."""
    undecided = s.d.explanation(
        Cause.TRANSPORT_HANG,
        f"{who(ranks)}, every rank these files show, timed out in the same collective, {op} #{seq} of "
        f"group {group}, and nothing here states the job's size. If these are all its ranks, the "
        "code is aligned as far as the logs show and the transport is the suspect; if the job is "
        "larger (another node's ranks), those ranks never arrived, and where they were decides",
        ranks=ranks,
        absent_ranks=[],
        op=op,
        site=None,
        evidence=s.evidence,
    )
    undecided.severity = Severity.WARNING  # two readings fit: neither is said as found
    undecided.fix = (
        "What decides: the job's size (its launch line, WORLD_SIZE), and the other ranks' watchdog "
        "lines or stacks if it has more; with every rank covered, `ncclcheck probe` with the job's "
        "launcher options"
    )
    return undecided


_WHERE_NOT_WHY = (
    "Find the line of each side's call: dump the ranks' stacks while it hangs (`ncclcheck doctor "
    "--pid`) or run `ncclcheck preflight` on the script. A collective under a rank test is "
    "rank-conditional-collective; the same calls in another order (a set or dict iterated per "
    "rank) is collective-order-mismatch."
)
_FIND_THE_REASON = (
    "The logs say which collective the other ranks never issued, not why. Dump every rank's stack "
    "while the job hangs (`ncclcheck doctor --pid PID`, or `py-spy dump` into the same folder as the "
    "logs) or run `ncclcheck preflight` on the script: the causes of a collective some ranks skip are "
    "rank-conditional-collective, rank-early-exit, uneven-eval-batches, data-dependent-branch and "
    "unsynchronized-decision (`ncclcheck playbooks`)."
)


# The order is the precedence: a rank that failed of its own explains the others'
# waits; ranks that disagree on one position (op, then size) are proven wrong by the
# numbers alone; then ranks behind the others; then the stacks; then alike everywhere.
AFTERMATH_RULES = (
    the_ranks_listed_the_same_names_in_other_orders,
    the_debug_check_says,
    a_transport_found_the_calls_differ,
    a_rank_failed_first,
    a_rank_past_its_scripts_end,
    the_one_unseen_ranks_traceback,
    a_rank_never_published_its_nccl_id,
    the_desync_report_says,
    a_monitored_barrier_names_the_late_rank,
    the_same_calls_in_another_order,
    ops_differ_at_one_position,
    sizes_differ_at_one_position,
    the_flight_recorder_analyser_says,
    flight_recorders_disagree,
    issued_sequences_disagree,
    unplaced_sequences_disagree,
    completed_on_some_ranks_only,
    some_ranks_never_issued_it,
    a_rank_blocked_in_the_kernel,
    a_rank_ahead_by_its_own_lines,
    the_ranks_that_said_they_stopped_wait_apart,
    stacks_decide,
    every_rank_at_one_position,
)
