"""What is said when the histories agree: a stall with every rank in the same call
(straggler or transport), and the warnings about what would hang on another day
(loaders without a DistributedSampler, uneven loaders, reads of a reduce's input)."""

from __future__ import annotations

from ncclcheck.causes import Cause
from ncclcheck.evidence.stacks import blocking
from ncclcheck.evidence.traces import RootedRead
from ncclcheck.evidence.waits import OutsideWait, timeout_limit, user_frames, waits_on, where_outside
from ncclcheck.explain.context import Context
from ncclcheck.explain.engine import Explanation
from ncclcheck.model import Frame, Severity
from ncclcheck.record.tracefile import End
from ncclcheck.source import reading
from ncclcheck.wording import (
    who,
)


def explain_stall_without_divergence(d: Context) -> Explanation:
    """Every rank agrees on its history so far and nothing moves."""
    lasts = {r: t.calls[-1] for r, t in d.ev.traces.items() if t.calls}
    stacks = d.ev.stacks
    # a rank that returned, raised or destroyed its process group waits on no peer
    ended = sorted(r for r, t in d.ev.traces.items() if t.destroyed or d.exit_of(r)[0] is not End.RUNNING)
    waiting = sorted(r for r, s in stacks.items() if s.in_collective and r not in ended)
    late = sorted(r for r, s in stacks.items() if s.threads and not s.in_collective and r not in ended)
    if late and waiting:
        call = lasts.get(waiting[0])
        return Explanation(
            cause=Cause.STRAGGLER,
            severity=Severity.ERROR,
            message=(
                f"{who(waiting)} waited in a collective for {who(late)}, busy outside any collective"
                f"{d.busy_where(late[0])} ({d.stall_against_timeout()})"
            ),
            ranks=waiting,
            absent_ranks=late,
            op=call.op if call else None,
            site=d.site(call.site if call else None),
            evidence=[f"rank {r}: {d.frames_text(r)}" for r in late],
            fix=d.fix(Cause.STRAGGLER),
        )
    if waiting and ended:
        # a stack in a collective the records do not hold (one the recorder does not see),
        # while other ranks have ended: they will never join it
        call = lasts.get(waiting[0])
        return Explanation(
            cause=Cause.RANK_EARLY_EXIT,
            severity=Severity.ERROR,
            message=f"{who(waiting)} wait in a collective (their stacks) that {who(ended)} will not join: "
            "they ended",
            ranks=waiting,
            absent_ranks=ended,
            op=call.op if call else None,
            site=d.site(call.site if call else None),
            evidence=[
                *(f"rank {r}: {d.frames_text(r)}" for r in waiting),
                *(f"rank {r} ended: {d.exit_text(r)}" for r in ended),
            ],
            fix=d.fix(Cause.RANK_EARLY_EXIT),
        )
    if late or ended:
        return _no_rank_waits(d, late, ended)
    call = next(iter(lasts.values()), None)
    frozen = [r for r, s in stacks.items() if s.status in ("stopped", "tracing-stop", "disk-sleep")]
    evidence = [f"every rank's last call: {d.describe_call(call)}"]
    if frozen:
        evidence.append(f"{who(frozen)} are frozen (process state stopped)")
    return Explanation(
        cause=Cause.TRANSPORT_HANG,
        severity=Severity.ERROR,
        message=(
            f"every rank is in the same {call.op if call else 'collective'} at "
            f"{d.site(call.site if call else None)} and nothing has moved for "
            f"{d.ev.stall_seconds:.0f} s: the code is aligned, the transport is not"
        ),
        ranks=sorted(lasts),
        absent_ranks=[],
        op=call.op if call else None,
        site=d.site(call.site if call else None),
        evidence=evidence,
        fix=d.fix(Cause.TRANSPORT_HANG),
    )


def warnings(d: Context, errors: list[Explanation]) -> list[Explanation]:
    causes = {f.cause for f in errors}
    found: list[Explanation] = []
    if d.ev.world_size > 1 and Cause.MISSING_DISTRIBUTED_SAMPLER not in causes:
        loaders: dict[str, set[str]] = {}
        for trace in d.ev.traces.values():
            for loader_pass in trace.eval_passes:
                # an IterableDataset shards itself: no sampler to name
                if not loader_pass.distributed_sampler and not loader_pass.iterable:
                    loaders.setdefault(loader_pass.loader, set()).add(str(loader_pass.sampler))
        overlap = d.eval_samples_overlap()
        for loader, samplers in sorted(loaders.items()):
            effect = (
                "the ranks evaluate the same samples, so metrics count them more than once"
                if overlap
                else "its per-rank shards are made by hand and nothing keeps their lengths equal"
            )
            found.append(
                Explanation(
                    cause=Cause.MISSING_DISTRIBUTED_SAMPLER,
                    severity=Severity.WARNING,
                    message=(
                        f"eval loader {loader} has no DistributedSampler "
                        f"({', '.join(sorted(samplers))}): {effect}"
                    ),
                    fix=d.fix(Cause.MISSING_DISTRIBUTED_SAMPLER),
                )
            )
    found += rooted_reads(d)
    if Cause.STRAGGLER not in causes:  # a wait that became the hang is said by its error
        found += [said for wait in d.ev.outside_waits if (said := kept_waiting(d, wait)) is not None]
    uneven_train = uneven_train_loader(d)
    if uneven_train is not None and uneven_train.cause not in causes:
        found.append(uneven_train)  # unless the run's divergence already said it
    counts = _first_uneven_eval_pass(d)
    if counts is not None and not causes & {Cause.UNEVEN_EVAL_BATCHES, Cause.MISSING_DISTRIBUTED_SAMPLER}:
        found.append(
            Explanation(
                cause=Cause.UNEVEN_EVAL_BATCHES,
                severity=Severity.WARNING,
                message=(
                    "eval loaders yield different numbers of batches per rank: "
                    + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))
                    + "; a per-batch collective in the eval loop would hang"
                ),
                ranks=sorted(counts),
                fix=d.fix(Cause.UNEVEN_EVAL_BATCHES),
            )
        )
    return found


def _first_uneven_eval_pass(d: Context) -> dict[int, int] | None:
    """Each rank's batches in the first eval pass whose length differs between the ranks,
    comparing the n-th complete pass of each rank with the others' n-th (a rank that died
    mid-pass has a partial count). Not their totals: a rank that evaluated once more, after
    the ranks had parted elsewhere, has more batches in all without any loader of another
    length."""
    lengths = {
        r: [p.batches for p in t.eval_passes if p.exhausted]
        for r, t in d.ev.traces.items()
        if any(p.exhausted for p in t.eval_passes)
    }
    if len(lengths) < 2:
        return None
    for n in range(min(len(passes) for passes in lengths.values())):
        counts = {r: passes[n] for r, passes in lengths.items()}
        if len(set(counts.values())) > 1:
            return counts
    return None


# What a wait on the outside world is, and how to keep it from failing the job.
KEPT_WAITING_FIX = (
    "Keep a rank's wait outside the collectives short of the job's collective timeout: download "
    "or prepare the data before init_process_group (or in a step before the job), let every rank "
    "read what one rank prepares only after it is complete on disk, or give the collective that "
    "waits a timeout sized for the wait (init_process_group(timeout=...), or a barrier on "
    "dist.new_group(timeout=...))."
)


def kept_waiting(d: Context, wait: OutsideWait) -> Explanation | None:
    """Ranks outside every collective (a download, a slow read, a subprocess, compute) kept
    the others waiting in one, and the dry run waited with them (launch/torchrun.py): not
    a hang, since the real job survives it while the wait stays under its timeout; said
    with how long it lasted, where each side was, and how close it came."""
    if not wait.waiting:
        return None  # no rank waited on another: nothing the collectives would time out
    late = wait.outside[0]
    late_stack = wait.stacks.get(late)
    late_frame = where_outside(late_stack)
    waiter = wait.waiting[0]
    waiter_stack = wait.stacks.get(waiter)
    waiter_frame = where_outside(waiter_stack)
    waits_in = blocking(waiter_stack).what if waiter_stack is not None else "a collective"
    at = f" at {d.site(waiter_frame)}" if waiter_frame else ""
    late_at = f" at {d.site(late_frame)} in {late_frame.function}()" if late_frame else ""
    timeout = d.job_timeout_s
    if timeout is not None and wait.seconds >= timeout:
        return None  # the wait reached the timeout: the job failed there, as its ranks' ends say
    lasted = f"{wait.seconds:.0f} s" + ("" if wait.over else ", not over when the dry run stopped")
    if timeout is None:
        margin = "the job's collective timeout is not known (no init record)"
    else:
        margin = (
            f"the job's collectives wait {timeout:.0f} s for a peer, so it survives this wait "
            "while it stays under that"
        )
        if wait.seconds >= timeout_limit(timeout) / 2:
            margin += f" (this one took {wait.seconds / timeout:.0%} of it)"
    return Explanation(
        cause=Cause.STRAGGLER,
        severity=Severity.WARNING,
        message=(
            f"{who(wait.outside)} kept {who(wait.waiting)} waiting {lasted}: {who(wait.waiting)} waited in "
            f"{waits_in}{at} while {who(wait.outside)} was outside every collective, in "
            f"{waits_on(late_stack)}{late_at}. No hang: {margin}"
        ),
        ranks=wait.waiting,
        absent_ranks=wait.outside,
        site=d.site(waiter_frame) if waiter_frame else None,
        evidence=[
            f"rank {rank}: " + " <- ".join(f"{f.function} ({d.site(f)})" for f in user_frames(stack))
            for rank, stack in sorted(wait.stacks.items())
            if rank in wait.outside or rank in wait.waiting
        ],
        fix=KEPT_WAITING_FIX,
    )


def rooted_reads(d: Context) -> list[Explanation]:
    """A rank read the tensor it gave dist.reduce, which only the dst rank receives
    the result in (record/rooted.py): what it computes from it is its own partial
    value, and a branch on it may part the ranks on another day's data."""
    readers: dict[tuple[Frame, Frame], list[int]] = {}
    example: dict[tuple[Frame, Frame], RootedRead] = {}
    for rank, trace in sorted(d.ev.traces.items()):
        for read in trace.rooted_reads:
            key = (read.site, read.reduce_site)
            readers.setdefault(key, []).append(rank)
            example.setdefault(key, read)
    found: list[Explanation] = []
    for key, ranks in readers.items():
        read = example[key]
        name = f"`{read.var}`" if read.var else "the tensor"
        decides = reading.decision_at(read.site.file, read.site.line)
        effect = (
            f", and `{decides}` decides on it: ranks that decide differently part ways" if decides else ""
        )
        members = sorted(d.ev.traces)
        found.append(
            Explanation(
                cause=Cause.UNSYNCHRONIZED_DECISION,
                severity=Severity.WARNING,
                message=(
                    f"{who(ranks)} read {name} with {read.how} at {d.site(read.site)} in "
                    f"{read.site.function}(), but dist.reduce at {d.site(read.reduce_site)} "
                    f"sent the result to rank {read.dst} only: what a rank reads there is its "
                    f"own partial value{effect}"
                ),
                ranks=ranks,
                absent_ranks=[r for r in members if r not in ranks],
                op="reduce",
                site=d.site(read.site),
                evidence=[
                    f"dist.reduce(..., dst={read.dst}) at {d.site(read.reduce_site)} in "
                    f"{read.reduce_site.function}() ({read.phase})",
                    "call chain of the read: "
                    + " -> ".join(f"{f.function}() at {d.site(f)}" for f in read.stack),
                ],
                fix=(
                    "Where every rank needs the value, use dist.all_reduce instead of dist.reduce "
                    "(divide by the world size for a mean); where only the dst rank should use "
                    f"it, read it under `if rank == {read.dst}` and broadcast any decision taken "
                    "on it."
                ),
            )
        )
    return found


def uneven_train_loader(d: Context) -> Explanation | None:
    """A train loader whose len() differs per rank, in a loop with a collective in
    every step (DDP's gradient all_reduce): the ranks with fewer batches leave the
    epoch while the others wait in their next step. The dry run's budget ends each
    epoch early, so the run itself stays aligned; the lengths the loaders told as the
    pass began decide it all the same: an error, never an aligned run with a warning."""
    lengths: dict[str, dict[int, int]] = {}
    by_hand: dict[str, bool] = {}  # every rank's first pass over it sampled by hand
    # the first passes (those compared) cut before their end: their lengths decide, not the run
    cut = any(
        p.budget_cut for t in d.ev.traces.values() for p in t.passes if p.role == "train" and p.index == 0
    )
    for rank, trace in d.ev.traces.items():
        drawn = sum(p.drawn for p in trace.passes if p.role == "train")
        # at least one collective per train batch drawn: a collective in every step
        if not drawn or trace.calls_per_phase().get("train", 0) < drawn:
            continue
        for loader_pass in trace.passes:
            length = loader_pass.true_length
            if loader_pass.role == "train" and loader_pass.index == 0 and length is not None:
                lengths.setdefault(loader_pass.loader, {})[rank] = length
                by_hand[loader_pass.loader] = by_hand.get(loader_pass.loader, True) and (
                    loader_pass.sampled_by_hand
                )
    for loader, per_rank in sorted(lengths.items()):
        if len(per_rank) < 2 or len(set(per_rank.values())) < 2:
            continue
        most = max(per_rank.values())
        if all(d.ev.traces[r].join_stand_ins for r, n in per_rank.items() if n < most):
            continue  # the ranks with fewer batches joined: DDP's Join stood in for them
        return Explanation(
            cause=Cause.MISSING_DISTRIBUTED_SAMPLER if by_hand.get(loader) else Cause.UNEVEN_EVAL_BATCHES,
            severity=Severity.ERROR,
            message=(
                f"train loader {loader} yields different numbers of batches per rank ("
                + ", ".join(f"rank {r}: {n}" for r, n in sorted(per_rank.items()))
                + "), and every step makes a collective: at the end of each epoch the ranks "
                "with fewer batches move on while the others wait in their next step"
                + (
                    "; its sampler is no DistributedSampler, over a dataset each rank cut for itself"
                    if by_hand.get(loader)
                    else ""
                )
                + (
                    " (the dry run stopped each pass before its end; the lengths the loaders "
                    "told as the pass began decide)"
                    if cut
                    else ""
                )
                + ". Shard with DistributedSampler, drop the remainder, or wrap the loop in "
                "DDP's join()"
            ),
            ranks=sorted(per_rank),
            fix=d.fix(Cause.UNEVEN_EVAL_BATCHES),
        )
    return None


def _no_rank_waits(d: Context, late: list[int], ended: list[int]) -> Explanation:
    """Quiet, and no rank inside a collective: nothing waits on a peer, so this is no
    collective hang (NCCL would time nothing out). The ranks still running may call a
    collective later that the ended ones will never join, or may end too: the dry run
    stopped them before that was seen, and says so rather than naming a cause."""
    running = [r for r in sorted(d.ev.traces) if r not in ended]
    evidence = [f"rank {r}: {d.frames_text(r)}" for r in late]
    evidence += [f"rank {r} ended: {d.exit_text(r)}" for r in ended]
    where = f"{who(late)} outside any collective{d.busy_where(late[0])}" if late else who(running)
    after = f" after {who(ended)} ended" if ended and running else ""
    message = (
        f"no rank was inside a collective when the dry run stopped them: {where}{after}, "
        f"{d.ev.stall_seconds:.0f} s without progress; nothing waited on a peer"
    )
    if ended and running:
        decides = (
            f"What decides: whether a collective follows this point on {who(running)}: "
            f"{who(ended)} will not join it (rank-early-exit); a slow write or sleep before "
            "the script's own end is no hang. Let the step finish (a shorter wait in the "
            "script) and rerun, or supervise the real job with ncclcheck watch."
        )
    else:
        decides = (
            "What decides: what the stacks wait on outside torch.distributed (a DataLoader "
            "worker, a lock, a file, a subprocess); no collective is pending, so no "
            "collective timeout would fire."
        )
    return Explanation(
        cause=Cause.RANK_EARLY_EXIT if ended and running else Cause.STRAGGLER,
        severity=Severity.WARNING,
        message=message,  # names the ranks: none of them did anything to the others
        evidence=evidence,
        fix=decides,
    )
