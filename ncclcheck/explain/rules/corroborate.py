"""What doctor sees of a live job besides the stacks, and the rules by which it overrules
the stacks' reading: ranks whose stacks wait alike (a transport hang, a straggler) are a
collective apart when their Flight Recorders, or their GPUs, say so. The first rule of
CORROBORATION_RULES that explains wins; none: the stacks' reading stands."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ncclcheck.causes import Cause
from ncclcheck.evidence import flight_recorder
from ncclcheck.evidence.classes import StackClass
from ncclcheck.evidence.gpus import GpuReading
from ncclcheck.evidence.movement import Movement
from ncclcheck.evidence.stacks import blocking
from ncclcheck.evidence.waits import standoff, waits_on, where_outside
from ncclcheck.explain.context import Context
from ncclcheck.explain.engine import Explanation, first_explanation
from ncclcheck.explain.rules.quiet import KEPT_WAITING_FIX
from ncclcheck.explain.rules.stacks import explain_classes
from ncclcheck.model import Severity
from ncclcheck.wording import who

# what the stacks say when they cannot tell the ranks apart: what else is seen may
_ALIKE = (Cause.TRANSPORT_HANG, Cause.STRAGGLER)


@dataclass
class Corroboration:
    """The stacks' reading, and what else doctor saw of the job."""

    d: Context
    from_stacks: Explanation
    flight_recorders: dict[int, dict[str, Any]] = field(default_factory=dict)  # by rank
    devices: GpuReading | None = None


def flight_recorders_disagree(c: Corroboration) -> Explanation | None:
    """The stacks look alike, the Flight Recorders show different collectives at one position."""
    parted = flight_recorder.disagreement(c.flight_recorders)
    if parted is None or c.from_stacks.cause not in _ALIKE:
        return None
    group, by_op = parted
    sides = sorted(by_op.values(), key=lambda ranks: (len(ranks), ranks[0]))
    return c.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"the ranks wait alike, but their Flight Recorders show different collectives at the "
        f"same position on group {group}: "
        + "; ".join(f"{who(r)} issued {op}" for op, r in sorted(by_op.items())),
        ranks=sides[0],
        absent_ranks=sorted(r for side in sides[1:] for r in side),
        op=None,
        site=c.from_stacks.site,
        evidence=c.from_stacks.evidence,
    )


def gpus_disagree(c: Corroboration) -> Explanation | None:
    """The stacks look alike (every rank at the same .item(), say); the GPUs do not."""
    idle = c.devices.odd_ones() if c.devices is not None else None
    if idle is None or c.devices is None or c.from_stacks.cause not in _ALIKE:
        return None
    quiet, spinning = idle
    return c.d.explanation(
        Cause.COLLECTIVE_ORDER_MISMATCH,
        f"the ranks' stacks wait alike, but their GPUs do not: {c.devices.verdict()}. "
        "The ranks are a collective apart: one was skipped or added on some ranks before this point",
        ranks=spinning,
        absent_ranks=quiet,
        op=None,
        site=c.from_stacks.site,
        evidence=[*c.from_stacks.evidence, "decided by the GPUs' utilisation (NVML), not by the stacks"],
    )


CORROBORATION_RULES = (flight_recorders_disagree, gpus_disagree)


def waiting_on_ranks_that_work(
    d: Context, classes: list[StackClass], moved: Movement | None
) -> Explanation | None:
    """Some ranks wait in a collective and did not move between the looks; the others
    moved (their stacks, a local value or their CPU): the waiting ranks wait on ranks that
    work. That is a job in progress, a long checkpoint save on rank 0 or an evaluation one
    rank runs longer, not a hang; it hangs only if the working ranks never reach the
    collective (an endless loop, work longer than the process group's timeout). Two looks
    cannot tell which: say who waits for whom, doing what, and what would decide."""
    if moved is None or not moved.working or not moved.still:
        return None
    waiting = {r: c for c in classes if c.in_collective for r in c.ranks}
    if any(rank not in waiting for rank in moved.still):
        return None  # a rank that neither moved nor waits for the others: stuck itself
    working = moved.working
    outside = [r for r in working if r not in waiting]
    where = waiting[moved.still[0]]
    site = where.frames[-1] if where.frames else None
    doing = "; ".join(f"rank {r}{d.busy_where(r) or ' outside any collective'}" for r in outside)
    waits = "waits" if len(moved.still) == 1 else "wait"
    return Explanation(
        Cause.STRAGGLER,
        f"{who(moved.still)} {waits} in {where.blocking}"
        + (f" at {d.site(site)}" if site else "")
        + f" for {who(working)}, seen working between the looks"
        + (f": {doing}" if doing else "")
        + ". The job is progressing. It hangs only if the waited-for ranks never reach that "
        "collective: run doctor again in a few minutes; the same ranks at the same places then "
        "are a straggler past its time (work longer than the process group's timeout fails the job)",
        ranks=list(moved.still),
        absent_ranks=outside,
        op=where.blocking,
        site=d.site(site) if site else None,
        evidence=[moved.decided(), *moved.lines()],
        severity=Severity.WARNING,
    )


def waiting_on_the_outside_world(d: Context, moved: Movement | None) -> Explanation | None:
    """Some ranks wait in a collective; every other rank is outside every collective in its
    script, blocked on something that is not a rank (a download, a network or disk read, a
    subprocess, a sleep) or computing. The ranks outside are the ones everyone waits for,
    and the job is held by what they wait on, not hung in its collectives: it fails only if
    that wait outlasts the process group's timeout, which doctor's looks cannot time."""
    found = standoff(d.ev.stacks, set())
    if found is None or not found.waiting:
        return None
    if moved is not None and any(rank not in moved.still for rank in found.waiting):
        return None  # a waiting rank moved: not the picture of one wait
    if moved is not None and any(rank in moved.gone for rank in found.outside):
        return None  # a rank outside that vanished between the looks waits on nothing
    late = found.outside[0]
    late_stack = d.ev.stacks[late]
    late_frame = where_outside(late_stack)
    waiter_stack = d.ev.stacks[found.waiting[0]]
    waiter_frame = where_outside(waiter_stack)
    waits = "waits" if len(found.waiting) == 1 else "wait"
    return Explanation(
        Cause.STRAGGLER,
        f"{who(found.waiting)} {waits} in {blocking(waiter_stack).what}"
        + (f" at {d.site(waiter_frame)}" if waiter_frame else "")
        + f" for {who(found.outside)}, outside every collective in {waits_on(late_stack)}"
        + (f" at {d.site(late_frame)} in {late_frame.function}()" if late_frame else "")
        + f". Not a hang of the collectives: {who(found.outside)} "
        + ("waits" if len(found.outside) == 1 else "wait")
        + " on something that is not a rank, and the others wait for it; the job fails only if "
        "that wait outlasts the process group's timeout (NCCL's default is 10 minutes), and "
        "two looks cannot tell how long it has lasted",
        ranks=found.waiting,
        absent_ranks=found.outside,
        op=blocking(waiter_stack).what,
        site=d.site(waiter_frame) if waiter_frame else None,
        evidence=[*(moved.lines() if moved is not None else [])],
        severity=Severity.WARNING,
        fix=(
            f"What decides: whether {who(found.outside)}'s wait ends before the collective timeout. "
            "Run doctor again in a few minutes, or supervise the job with `ncclcheck watch`, which "
            "times the wait: the same stacks near the timeout are a wait that will not end in time "
            "(a dead mount, a hung download, a deadlocked DataLoader worker). " + KEPT_WAITING_FIX
        ),
    )


def explain_live_job(
    d: Context,
    classes: list[StackClass],
    ranks: list[int],
    moved: Movement | None,
    flight_recorders: dict[int, dict[str, Any]],
    devices: GpuReading | None,
) -> Explanation:
    """doctor --pid's explanation: the stacks' classes (STACK_RULES), what the two looks,
    the Flight Recorders and the GPUs add to them, and the first of CORROBORATION_RULES
    that overrules them."""
    from_stacks = explain_classes(d, classes, d.ev.world_size, ranks)
    evidence = list(from_stacks.evidence)
    if moved is not None:
        evidence.append(moved.decided())
    recorded = flight_recorder.evidence(flight_recorders)
    evidence += recorded
    if devices is not None:
        evidence += devices.lines()
    from_stacks.evidence = evidence
    seen = Corroboration(d, from_stacks, flight_recorders, devices)
    explanation = first_explanation(CORROBORATION_RULES, seen) or from_stacks
    if explanation.cause is Cause.TRANSPORT_HANG and not recorded:
        # What a stack cannot show: on which pass of this line each rank is. An extra or
        # missing collective earlier (an uneven eval loop) may have paired silently with
        # one of the same size, leaving the ranks a call apart here.
        explanation.evidence.append(
            "the stacks agree but do not show on which pass of this line each rank is: if an eval "
            "loop or a skipped step came before, preflight the script, or run the job with "
            "TORCH_FR_BUFFER_SIZE=2000 so that doctor can compare the ranks' sequence numbers"
        )
    return explanation
