"""doctor: diagnose a job that is stuck right now, from the stacks of all its ranks.

Works on any job: no environment variable, no change to its code. From one pid
(a torchrun agent, a rank, or a launcher such as a shell, srun or mpirun) it
finds the rank processes on this host by their environment (RANK, WORLD_SIZE,
LOCAL_RANK, GROUP_RANK, TORCHELASTIC_RUN_ID), dumps their stacks with py-spy in
parallel, merges them into classes of identical stacks (as LLNL's STAT does for
MPI jobs) and matches the classes to the catalogue. It only reads: the job is
neither written to nor signalled.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict
from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.errors import InputError
from ncclcheck.evidence import gpus, movement
from ncclcheck.evidence.aftermath import Aftermath, FactKind, evidence_lines, lived_through, rank_facts
from ncclcheck.evidence.classes import (
    libraries_waited_in,
    merge_stacks,
    unplaced_classes,
    user_frames,
    waiting_at,
)
from ncclcheck.evidence.gpus import GpuReading
from ncclcheck.evidence.logs import read_leftovers
from ncclcheck.evidence.movement import Movement
from ncclcheck.evidence.processes import RankProcess, discover, not_distributed, on_other_hosts, spawned_ranks
from ncclcheck.evidence.stacks import ProcessStack, blocking, dump_stacks
from ncclcheck.explain.context import Context, Evidence
from ncclcheck.explain.rules.aftermath import explain_leftovers
from ncclcheck.explain.rules.corroborate import (
    explain_live_job,
    waiting_on_ranks_that_work,
    waiting_on_the_outside_world,
)
from ncclcheck.explain.rules.stacks import (
    held_by_their_data_pipeline,
    one_dump_alone_in_a_phase,
    some_dumps_still_train,
)
from ncclcheck.launch.stop import STOP
from ncclcheck.model import Frame, RankState, RankStatus, Report, Verdict, format_ranks
from ncclcheck.wording import relative, who


def collect(
    pids: list[int], native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> tuple[list[RankProcess], dict[int, ProcessStack]]:
    """The rank processes reachable from ``pids`` on this host and their stacks, by rank."""
    ranks, pythons = discover(pids)
    by_pid: dict[int, ProcessStack] = {}
    if not ranks:
        if not pythons:
            raise InputError(
                f"pid {', '.join(map(str, pids))}: no Python process there",
                hint="Give the pid of a rank, of torchrun, or of the launcher that started it.",
            )
        ranks, by_pid = spawned_ranks(pythons, native, nonblocking, timeout)
        if not ranks:
            not_distributed(pythons, native, nonblocking, timeout)
    if not by_pid:
        by_pid = dump_stacks(
            [r.pid for r in ranks], timeout=timeout, native=native, nonblocking=nonblocking, with_locals=True
        )
    stacks = {r.rank: by_pid[r.pid] for r in ranks}
    failed = [r.rank for r in ranks if stacks[r.rank].error and not stacks[r.rank].threads]
    if failed and len(failed) == len(ranks):
        raise InputError(f"py-spy could not read any rank: {stacks[ranks[0].rank].error}")
    return ranks, stacks


def run_doctor(
    pids: list[int],
    native: bool = False,
    nonblocking: bool = False,
    timeout: float = 10.0,
    interval: float = 1.0,
) -> Report:
    """Collect, look again ``interval`` seconds later (0: one look), diagnose."""
    ranks, stacks = collect(pids, native, nonblocking, timeout)
    devices = gpus.read({r.rank: r.pid for r in ranks})
    moved = second_look(ranks, stacks, interval, native, nonblocking, timeout)
    return diagnose_ranks(ranks, stacks, moved, devices)


def second_look(
    ranks: list[RankProcess],
    stacks: dict[int, ProcessStack],
    interval: float,
    native: bool = False,
    nonblocking: bool = False,
    timeout: float = 10.0,
) -> Movement | None:
    """The ranks' stacks and counters (CPU, bytes moved, the main thread's run time)
    again after ``interval``: what moved."""
    if interval <= 0:
        return None
    pids = {r.rank: r.pid for r in ranks}
    before = movement.usage(pids)
    time.sleep(interval)
    after = movement.usage(pids)
    by_pid = dump_stacks(
        list(pids.values()), timeout=timeout, native=native, nonblocking=nonblocking, with_locals=True
    )
    again = {rank: by_pid[pid] for rank, pid in pids.items()}
    without_gpu = frozenset(rank for rank, pid in pids.items() if not gpus.maps_cuda(pid))
    return movement.compare(stacks, again, interval, before, after, os.getcwd(), without_gpu)


# -- several hosts: each dumps its ranks, one reads them all ----------------------------

DUMP_FORMAT = "ncclcheck-doctor-dump/1"


def dump_to(
    directory: Path, pids: list[int], native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> tuple[Path, list[RankProcess]]:
    """Write this host's ranks and stacks to ``directory/<host>-node<N>.json``."""
    ranks, stacks = collect(pids, native, nonblocking, timeout)
    try:
        # private: stacks carry local variables' values
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {directory}: {exc.strerror}") from None
    node = min(r.group_rank for r in ranks)
    path = directory / f"{socket.gethostname()}-node{node}.json"
    document = {
        "format": DUMP_FORMAT,
        "host": socket.gethostname(),
        "time": time.time(),
        "ranks": [{**asdict(r), "stack": stacks[r.rank].to_dict()} for r in ranks],
    }
    partial = path.with_suffix(".json.partial")  # readers never see half a file
    try:
        with STOP.held():  # a stop signal leaves the whole file, never the partial one
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(document))
            partial.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    return path, ranks


def run_doctor_from(paths: list[Path], trust_pickle: bool = False, all_ranks: bool = False) -> Report:
    """One diagnosis from what a job left behind: doctor's own dumps of several hosts
    (``doctor --dump-to`` on each), job logs, stack dumps, Flight Recorder dumps, mixed."""
    job = read_leftovers(paths, trust_pickle)
    if not job.usable:
        said = "; ".join(job.skipped[:6]) + (
            f"; and {len(job.skipped) - 6} more" if len(job.skipped) > 6 else ""
        )
        raise InputError(
            f"{', '.join(map(str, paths))}: nothing doctor can read in it (no doctor dump, job log with "
            "NCCL watchdog lines or tracebacks, torchelastic summary, py-spy or faulthandler dump, or "
            "Flight Recorder JSON)",
            hint=(f"Skipped: {said}. " if said else "")
            + "On each host of a stuck job: ncclcheck doctor --pid PID --dump-to DIR",
        )
    if job.doctor_ranks and all(
        not (r.timeouts or r.progress or r.ending or r.issued) for r in job.ranks.values()
    ):
        # doctor's own dumps alone: the live diagnosis, as on the hosts themselves
        ranks = [RankProcess(**entry) for _, entry in sorted(job.doctor_ranks.items())]
        stacks = {r: rec.stack for r, rec in job.ranks.items() if rec.stack is not None}
        return diagnose_ranks(ranks, stacks)
    return diagnose_leftovers(job, all_ranks)


def diagnose_leftovers(job: Aftermath, all_ranks: bool = False) -> Report:
    """The aftermath's rules; what none explains is said as such, with the evidence."""
    world = job.world_size  # 0: the files name no rank (stack dumps of no known rank)
    context = Context(Evidence(world_size=max(world, 1)))
    explanation = explain_leftovers(context, job)
    crashed = explanation is not None and explanation.cause is Cause.RANK_CRASHED
    # a transport that found mismatched calls ends the job with an error (gloo aborts, NCCL's
    # transport fails the call): a crash, unless some rank waited out a timeout first
    crashed = crashed or (bool(job.size_mismatches) and not any(r.timeouts for r in job.ranks.values()))
    report = Report(command="doctor", verdict=Verdict.CRASH if crashed else Verdict.HANG, world_size=world)
    if job.unplaced:
        report.summary["stacks_of_no_known_rank"] = unplaced_classes(
            [(u.label, u.stack) for u in job.unplaced]
        )
    only_unplaced = bool(job.unplaced) and not any(
        r.timeouts or r.progress or r.stack for r in job.ranks.values()
    )
    if explanation is None and only_unplaced:
        by_index = {index: u.stack for index, u in enumerate(job.unplaced)}
        classes, labels = merge_stacks(by_index), [u.label for u in job.unplaced]
        explanation = (
            held_by_their_data_pipeline(context, classes, labels)
            or some_dumps_still_train(context, classes, labels)
            or one_dump_alone_in_a_phase(context, classes, labels)
        )
    if explanation is not None:
        report.findings = [explanation.finding(context.catalogue)]
    elif only_unplaced:
        report.summary["unexplained"] = (
            "these stack dumps name no rank (stacks_of_no_known_rank): they show where each process "
            "waits, not which ranks are set apart, so no rule can name a cause from them. What decides: "
            "the dumps of every rank with their ranks (`ncclcheck doctor --pid` on each host, or "
            "--dump-to), the NCCL watchdog lines of the job's log, or Flight Recorder dumps"
            + "".join(
                f". They wait inside {what}, which asks this of every rank: {advice}"
                for what, advice in libraries_waited_in([u.stack for u in job.unplaced])
            )
        )
    elif not job.ranks and not job.unplaced and job.progress_bars:
        bars = "; ".join(
            f"'{bar.what}' at {bar.done} ({bar.source})" for bar in list(job.progress_bars.values())[:3]
        )
        report.summary["unexplained"] = (
            f"these files hold the job's own output only: its progress stopped part-way ({bars}), with "
            "no watchdog line, stack, traceback or failure summary of any rank. Nothing here says where "
            "the ranks wait, nor whether they wait in a collective at all. What decides: a stack of "
            "every rank while it hangs (`ncclcheck doctor --pid PID` on each host), and NCCL's watchdog "
            "lines (a process-group timeout shorter than the wait)"
        )
    else:
        report.summary["unexplained"] = (
            "no rule explains what these files show (no ranks behind the others, no disagreement at "
            "one position, no failed rank, no stacks): the evidence, per rank: "
            + " | ".join(evidence_lines(job)[:20])
        )
    if all_ranks or world <= _RANK_TABLE_LIMIT:
        report.ranks = [_left_behind(job, rank) for rank in range(world)]
    report.summary["read"] = job.read
    if job.spliced:
        report.summary["spliced"] = [
            f"{where}: two ranks' output in one line, each rank's part read as its own line"
            for where in job.spliced
        ]
    if job.skipped:
        report.summary["skipped"] = job.skipped
    return report


_RANK_TABLE_LIMIT = 64  # above it, ranks are shown as ranges in the findings (--all-ranks for all)


def _left_behind(job: Aftermath, rank: int) -> RankState:
    record = job.ranks.get(rank)
    if record is None:
        # no evidence of it is no evidence that it ended: say nothing of where it was
        return RankState(rank=rank, state=RankStatus.UNSEEN, where="nothing of this rank in these files")
    facts = [fact.text for fact in rank_facts(record) if fact.kind is not FactKind.STACK]  # said below
    if record.stack is not None:
        user = user_frames(record.stack)
        waited = blocking(record.stack).what
        facts.insert(0, f"{_frame_text(user[0])} ({waited})" if user else f"in {waited}")
    where = "; ".join(facts)
    ending = record.ending
    return RankState(
        rank=rank,
        host=record.host or (ending.host if ending and ending.host else ""),
        pid=record.pid or (ending.pid if ending else None),
        exit_code=ending.exit_code if ending else None,
        # a stack dumped of a rank that printed an exception: its process lived on
        state=RankStatus.EXITED if ending and not lived_through(record) else RankStatus.STUCK,
        where=where,
    )


def diagnose_ranks(
    ranks: list[RankProcess],
    stacks: dict[int, ProcessStack],
    moved: Movement | None = None,
    devices: GpuReading | None = None,
) -> Report:
    """Merge the stacks into classes and name the cause; with a second look (``moved``),
    a job whose every rank moved is progressing, not hung; with the ranks' GPUs
    (``devices``), ranks whose stacks look alike are told apart by who idles."""
    waits = {rank: waiting_at(stack) for rank, stack in stacks.items()}
    classes = merge_stacks({r: s for r, s in stacks.items() if s.threads or s.status == "stopped"}, waits)
    world = max(r.world_size for r in ranks)
    report = Report(command="doctor", verdict=Verdict.HANG, world_size=world)
    if moved is not None:
        report.summary["movement"] = moved.lines()
        report.summary["decided_by"] = moved.decided()
    if devices is not None:
        report.summary["gpus"] = devices.lines()
    for proc in ranks:
        stack = stacks[proc.rank]
        waiting = waits[proc.rank]
        user = user_frames(stack)
        what = (
            waiting.blocking.what
            if waiting.sync is None
            else f"{waiting.blocking.what}, after {waiting.what}"
        )
        report.ranks.append(
            RankState(
                rank=proc.rank,
                host=proc.host,
                pid=proc.pid,
                phase=None,
                state=RankStatus.IN_COLLECTIVE if waiting.blocking.waits_for_peers else RankStatus.STUCK,
                where=f"{_frame_text(user[0])} ({what})" if user else what,
            )
        )
    report.summary["classes"] = [
        {
            "ranks": format_ranks(c.ranks),
            "blocking": c.blocking
            + (f" (inside {c.deferred.what})" if c.deferred else "")
            + (f" (enqueued; waits at the device sync point {c.sync})" if c.sync else ""),
            "frames": [f"{relative(f.file, os.getcwd())}:{f.line} in {f.function}" for f in c.frames],
        }
        for c in classes
    ]
    if moved is not None and moved.everyone_moved:
        report.verdict = Verdict.PROGRESSING
        for state in report.ranks:
            state.state = RankStatus.RUNNING
        return report
    elsewhere = on_other_hosts(ranks)
    context = Context(Evidence(world_size=world, stacks=stacks, on_other_hosts=elsewhere))
    if elsewhere:
        report.summary["not_on_this_host"] = (
            f"{who(elsewhere)} {'runs' if len(elsewhere) == 1 else 'run'} on other hosts: run doctor "
            "there too (`ncclcheck doctor --pid PID --dump-to DIR` on each host, then `--from DIR`), or "
            "`ncclcheck watch --shared DIR` on every node"
        )
    in_progress = waiting_on_ranks_that_work(context, classes, moved)
    if in_progress is not None and moved is not None:
        report.verdict = Verdict.PROGRESSING
        for state in report.ranks:
            if state.rank in moved.working:
                state.state = RankStatus.RUNNING
        report.findings = [in_progress.finding(context.catalogue)]
        return report
    held = waiting_on_the_outside_world(context, moved)
    if held is not None:
        report.verdict = Verdict.WAITING  # held by a wait outside torch.distributed, not hung
        for state in report.ranks:
            if state.rank in held.absent_ranks:
                state.state = RankStatus.RUNNING  # in its script, waiting on the outside world
        report.findings = [held.finding(context.catalogue)]
        return report
    dumps = {r.rank: r.flight_recorder for r in ranks if r.flight_recorder}
    explanation = explain_live_job(context, classes, [r.rank for r in ranks], moved, dumps, devices)
    report.findings = [explanation.finding(context.catalogue)]
    return report


def _frame_text(frame: Frame) -> str:
    return f"{relative(frame.file, os.getcwd())}:{frame.line} in {frame.function}"
