"""What a dead or unreachable job left behind, per rank, each piece with the file and
line it came from: the last collectives NCCL's watchdog named (sequence number, op,
sizes), how far each rank enqueued and completed, how it ended (torchelastic's
summary, a traceback), and where it waited (stack dumps, the Flight Recorder).

The readers (evidence/logs.py, evidence/dumps.py) fill one ``Aftermath``; the rules
in explain/rules/aftermath.py explain it. Everything is kept per rank in a few small
records, so that a 4,096-rank job's log is read in one streamed pass.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from ncclcheck.evidence.dumps import is_user_path
from ncclcheck.evidence.stacks import ProcessStack, blocking
from ncclcheck.model import Frame
from ncclcheck.wording import signal_name, who


@dataclass(frozen=True)
class Source:
    """Where a piece of evidence was read: a file, and the line in it when it has lines."""

    path: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else self.path


@dataclass(frozen=True)
class TimedOutWork:
    """``WorkNCCL(SeqNum=..., OpType=..., NumelIn=..., NumelOut=...)`` in a watchdog line."""

    group: str  # the process group's id as NCCL names it ("0" for the default group)
    # None in the lines of torch 1.10 and older, which number no work: "WorkNCCL(OpType=
    # BROADCAST, Timeout(ms)=1800000)". Such a timeout is where that rank waits, and no more:
    # two ranks' lines cannot be matched to one position
    seq: int | None
    op: str  # "" where the line was cut before the op's name ended
    numel_in: int | None
    numel_out: int | None
    source: Source
    timeout_ms: int | None = None  # the group's timeout: one per process group

    def describe(self) -> str:
        unit = "element" if self.numel_in == 1 else "elements"
        sizes = f", {self.numel_in} {unit} in" if self.numel_in is not None else ""
        if self.seq is None:
            return f"{self.op} (the line numbers no work){sizes}"
        return f"#{self.seq} {self.op or '(op cut off in the line)'}{sizes} on group {self.group}"


@dataclass(frozen=True)
class Progress:
    """``last enqueued NCCL work: Y, last completed NCCL work: Z``, after ``Timeout at NCCL
    work: X`` or ``detected by watchdog at work: X`` where the line gives it."""

    group: str
    timed_out: int | None
    last_enqueued: int
    last_completed: int
    source: Source


# the sequences a rank's issued collectives are numbered in, as the files print them
NCCL_COLL = "NCCL's COLL trace"  # NCCL_DEBUG_SUBSYS=COLL: opCount per communicator (evidence/nccl_coll.py)
DETAIL_RUNNING = "DETAIL's fingerprints"  # TORCH_DISTRIBUTED_DEBUG=DETAIL's "Running collective" lines
# fr_trace -j's table: each rank's Flight Recorder entries side by side (evidence/fr_trace.py),
# numbered by the entries' collective_seq_id where printed (-v), else by the table's rows
FR_ENTRIES = "the Flight Recorder entries fr_trace -j printed"
FR_ROWS = "the Flight Recorder entries fr_trace -j printed, row by row"
NCCL_RAS = "NCCL's RAS report"  # ncclras: launch counts per communicator (evidence/ncclras.py)


@dataclass(frozen=True)
class Issued:
    """One collective a rank issued, at its position in a numbering the ranks share
    (NCCL's opCount on the communicator of every rank; DETAIL's sequence number)."""

    position: int
    op: str  # as the sequence names it: AllReduce (NCCL), ALLREDUCE (torch)
    shape: str  # "4096 elements", "[77, 1] Float"
    source: Source

    def describe(self) -> str:
        return f"#{self.position} {self.op}" + (f" of {self.shape}" if self.shape else "")


@dataclass(frozen=True)
class CollectiveCall:
    """Where a rank called the collective its watchdog timed out: "Stack trace of the failed
    collective:" and the Flight Recorder's frames after it (torch 2.5 and later, with the
    recorder on), ``#0 all_reduce from .../distributed_c10d.py:2696``, innermost first."""

    seq: int | None  # the timed-out collective the trace follows, where the rank named one
    group: str
    frames: tuple[Frame, ...]  # innermost first, as printed
    source: Source

    @property
    def site(self) -> Frame | None:
        """The innermost frame outside torch and the standard library: the caller's line."""
        return next((f for f in self.frames if is_user_path(f.file)), None)

    @property
    def caller(self) -> Frame | None:
        """The user's line, else the innermost frame of the library that called torch (a
        serving engine's worker, a trainer): where the collective was asked for."""
        return self.site or next((f for f in self.frames if not _in_torch_or_python(f.file)), None)

    @property
    def op(self) -> str:
        """The collective, from the innermost frame (``#0 broadcast from distributed_c10d.py``)."""
        first = self.frames[0] if self.frames else None
        return first.function if first is not None and "torch/distributed" in first.file else ""


def _in_torch_or_python(path: str) -> bool:
    return (
        "/torch/" in path
        or path.startswith("torch/")
        or bool(re.search(r"/lib/python\d+\.\d+/[^/]+\.py$", path))
    )


@dataclass
class Ending:
    """How a rank ended, from torchelastic's failure summary or the rank's own traceback."""

    exit_code: int | None = None
    pid: int | None = None
    host: str | None = None
    root_cause: bool = False  # torchelastic's "Root Cause (first observed failure)"
    error: str | None = None  # the exception's last line
    error_site: Frame | None = None  # the innermost frame of the traceback (the user's, where one is)
    source: Source | None = None
    frames: tuple[Frame, ...] = ()  # the traceback's frames as printed, outermost first

    @property
    def signal(self) -> int | None:
        return -self.exit_code if self.exit_code is not None and self.exit_code < 0 else None


def lived_through(record: RankAftermath) -> bool:
    """A rank whose exception was printed but whose process was alive after it: its stack
    was dumped (py-spy, pystack: only a live process has one), and nothing says it exited
    (no exit code, no signal). The exception was caught: a worker's loop, a retry, an
    ``except`` that logs and goes on."""
    ending = record.ending
    return (
        ending is not None
        and bool(ending.error)
        and ending.exit_code is None
        and record.stack is not None
        and record.stack.status == "dumped"
    )


@dataclass
class RankAftermath:
    rank: int
    timeouts: list[TimedOutWork] = field(default_factory=list)
    progress: dict[str, Progress] = field(default_factory=dict)  # by group
    ending: Ending | None = None
    stack: ProcessStack | None = None
    stack_source: Source | None = None
    # an earlier dump of the same rank that the files hold too (two `py-spy dump`s of one
    # pid): frames that moved between them are work under way
    earlier_stack: tuple[ProcessStack, Source] | None = None
    calls: list[CollectiveCall] = field(default_factory=list)  # where its timed-out collectives were called
    # its watchdog thread made no progress for this many seconds (the heartbeat monitor's
    # "watchdog got stuck"): a NCCL or CUDA call blocked it, so it could not time out a
    # collective of its own; 0 where the line gives no duration
    watchdog_stuck: tuple[int, Source] | None = None
    # it reached gloo's monitored_barrier and got no answer from this rank, its coordinator
    # ("received errors while waiting for send/recv from rank 0"), where said
    barrier_waited_on: tuple[int, Source] | None = None
    # it set up a NCCL communicator and never got the ncclUniqueId the group's first rank
    # publishes in the store: (that rank, the store's error, where said)
    unique_id_from: tuple[int, str, Source] | None = None
    # the last collectives it issued, by sequence (NCCL_COLL, DETAIL_RUNNING)
    issued: dict[str, list[Issued]] = field(default_factory=dict)
    flight_recorder: dict[str, Any] = field(default_factory=dict)  # flight_recorder.read_dump's summary
    host: str | None = None
    pid: int | None = None
    # the first line of its own that the files hold (its [rankN]: prefix): its output is
    # here, so a watchdog line it would have printed would be here too
    heard: Source | None = None

    @property
    def numbered(self) -> list[TimedOutWork]:
        """Its timeouts whose lines give the work's sequence number: the ones that can be
        matched across ranks."""
        return [w for w in self.timeouts if w.seq is not None]

    def issued_at_least(self, group: str) -> int | None:
        """The highest sequence number this rank is known to have issued on ``group``: a
        collective that timed out was issued, and so was all a progress line counts."""
        known = [w.seq for w in self.numbered if w.group == group and w.seq is not None]
        if group in self.progress:
            known.append(self.progress[group].last_enqueued)
        return max(known) if known else None

    def waits_in(self, group: str) -> int | None:
        """The first collective of ``group`` this rank issued and never saw complete: the one
        its watchdog timed out, or the one after its last completed where it had enqueued
        more. A rank's collectives on one group complete in order (one stream)."""
        pending = [w.seq for w in self.numbered if w.group == group and w.seq is not None]
        progress = self.progress.get(group)
        if progress is not None and progress.last_enqueued > progress.last_completed:
            pending.append(progress.last_completed + 1)
        return min(pending) if pending else None

    def last_completed(self, group: str) -> int | None:
        progress = self.progress.get(group)
        return progress.last_completed if progress is not None else None

    def last_enqueued(self, group: str) -> int | None:
        """The last sequence number this rank had issued on ``group`` when its watchdog
        fired, where a progress line says it. A timed-out collective alone does not: the
        rank may have issued more after it (NCCL's collectives are asynchronous)."""
        progress = self.progress.get(group)
        return progress.last_enqueued if progress is not None else None


# what a block's header says the analyser found
MISSING, MISMATCH, SIZES = "missing ranks", "mismatch", "input/output sizes"

# the rank a line's own text names, where no prefix gives one ("[val shard] rank=3
# batches=126", "[dbg] rank=11 n_img=0")
RANK_IN_TEXT = re.compile(r"\brank[ =:#\[]{0,2}(\d+)\b", re.IGNORECASE)


@dataclass
class FrTraceVerdict:
    """One collective torch's Flight Recorder analyser (fr_trace) found wrong, as far as
    the text shows it (evidence/fr_trace.py reads it)."""

    kind: str  # MISSING, MISMATCH or SIZES
    seq: int
    source: Source
    group: str | None = None
    op: str | None = None  # "all_reduce" of "nccl:all_reduce"
    missing: list[int] = field(default_factory=list)
    expected: list[int] = field(default_factory=list)
    input_sizes: str | None = None
    world_size: int | None = None  # of the group
    culprits: dict[int, str] = field(default_factory=dict)  # rank -> error type (SIZE_OR_SYNTAX_MISMATCH...)
    frames: list[Frame] = field(default_factory=list)  # the collective's stack, innermost first

    @property
    def issued_by(self) -> list[int]:
        """The ranks the analyser saw issue it: the expected ones (all of the group where
        the printed set was cut short) but the missing."""
        expected = set(self.expected)
        if self.world_size is not None and len(expected) < self.world_size:
            expected = set(range(self.world_size))
        return sorted(expected - set(self.missing))


@dataclass(frozen=True)
class ProgressBar:
    """A progress bar (tqdm's) the log holds unfinished, in its last state: work some process
    was doing, ``elapsed_s`` into it, when the log was cut or the job ended."""

    what: str  # its description: "Running tokenizer on dataset", "Map (num_proc=14)"
    done: str  # "280000/2969526"
    elapsed_s: int
    source: Source
    rank: int | None = None  # where a prefix says whose it is

    def describe(self) -> str:
        minutes, seconds = divmod(self.elapsed_s, 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
        return f"'{self.what}' at {self.done} after {clock}"


@dataclass(frozen=True)
class LoopLength:
    """How many batches a loop of one rank (or of an unnamed process) runs, as the job's own
    output says it: a progress bar's total ("eval: 99%|...| 78/79"), or a line that counts
    them ("eval shard: 1249 samples -> 79 batches"). ``what`` names the loop: the bar's
    description, or the line with its numbers blanked, so that each rank's copy matches."""

    what: str
    total: int
    rank: int | None
    source: Source
    said: str  # the line as printed (its bar's description, for a bar)


@dataclass(frozen=True)
class OwnOutput:
    """A line of the job's own output (not torch's or NCCL's), with the rank whose prefix
    it carries, if any."""

    text: str
    source: Source
    rank: int | None


@dataclass(frozen=True)
class DesyncVerdict:
    """A line of NCCL's desync report (TORCH_NCCL_DESYNC_DEBUG=1): "[7] finished collective
    #182, but didn't join collective #183", or "[0, 1, ...] joined but didn't finish
    collective #730"."""

    ranks: tuple[int, ...]
    seq: int  # the collective they did not join, or did not finish
    joined: bool  # True: they joined it and it never finished; False: they never joined it
    source: Source


@dataclass(frozen=True)
class Fingerprint:
    """What one rank was running, as TORCH_DISTRIBUTED_DEBUG=DETAIL's check prints it:
    ``CollectiveFingerPrint(SequenceNumber=N, OpType=X, TensorShape=[...], TensorDtypes=Y)``."""

    rank: int
    seq: int | None
    op: str
    shape: str | None  # "[20, 10]"; None where the line gives none
    dtype: str | None


@dataclass(frozen=True)
class FingerprintMismatch:
    """ "Detected mismatch between collectives on ranks. Rank A is running collective: ...,
    but Rank B is running collective: ...": what the check found before the collective."""

    running: Fingerprint  # the rank that printed it
    other: Fingerprint | None  # the rank it compared with (older torch names none)
    source: Source


@dataclass(frozen=True)
class SizeMismatch:
    """A transport's own report that two ranks' collectives did not match: gloo's size check
    ("op.preamble.length <= op.nbytes. 1480 vs 4"), NCCL's IB transport ("collective mismatch
    error, local size X remote size Y"), NCCL's "Mismatched collective detected ... around
    rank N". It says the calls differ at one point, not whether in size or in kind."""

    rank: int | None  # the rank that printed it, where a prefix says so
    expected: int | None  # bytes the reporting rank's own call expected
    received: int | None  # bytes its peer's call sent
    around_rank: int | None  # NCCL's "at and around rank N"
    said_by: str  # "gloo's size check", ...
    source: Source


@dataclass(frozen=True)
class UnplacedStack:
    """A stack dump whose rank nothing says (a py-spy dump of one process posted alone):
    read, described, never counted as a rank."""

    label: str  # what names it: its file, and its pid where the dump gives one
    stack: ProcessStack
    source: Source


@dataclass
class Aftermath:
    """The whole job, as far as its leftovers show it."""

    ranks: dict[int, RankAftermath] = field(default_factory=dict)
    world_size: int = 0  # the largest WORLD_SIZE or rank + 1 seen
    # the world size a line states (WORLD_SIZE=, a dump's or fr_trace's world size, the desync
    # report's list of every rank, an all-gather's NumelOut / NumelIn on the default group),
    # as against one inferred from the largest rank seen: 0 when nothing states it
    world_said: int = 0
    read: list[str] = field(default_factory=list)  # "path: kind", for the report
    skipped: list[str] = field(default_factory=list)  # "path: why", said and left out
    run_ids: set[str] = field(default_factory=set)
    # doctor's own dumps: each rank's process as its host saw it (RankProcess's fields)
    doctor_ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    unplaced: list[UnplacedStack] = field(default_factory=list)  # stacks of no known rank
    spliced: list[str] = field(default_factory=list)  # "file:line" holding two ranks' output, split
    output_before: list[OwnOutput] = field(default_factory=list)  # the job's last lines before a timeout
    # a process listing posted with the dumps (`ps aux`, `ps -eo pid,stat,...`): pid -> STAT
    process_states: dict[int, tuple[str, Source]] = field(default_factory=dict)
    # a stack dumper's failure to attach ("py-spy dump --pid N" then "Error: ..."): pid -> why
    dump_errors: dict[int, tuple[str, Source]] = field(default_factory=dict)
    # NCCL's COLL launches of processes of no known rank (no communicator init line, no
    # prefix): "host pid N (device [d])" -> its launches on a communicator of every rank
    unplaced_issued: dict[str, list[Issued]] = field(default_factory=dict)
    fr_trace: list[FrTraceVerdict] = field(default_factory=list)  # the Flight Recorder analyser's verdicts
    desync: list[DesyncVerdict] = field(default_factory=list)  # NCCL's desync report
    # TORCH_DISTRIBUTED_DEBUG=DETAIL's "Detected mismatch between collectives on ranks"
    mismatches: list[FingerprintMismatch] = field(default_factory=list)
    # gloo's monitored_barrier: rank -> (timeout in ms, where said), for ranks it says did
    # not pass; and the ranks it says reached it
    barrier_late: dict[int, tuple[int, Source]] = field(default_factory=dict)
    barrier_reached: set[int] = field(default_factory=set)
    # unfinished progress bars, by description, in their last state (logs.py)
    progress_bars: dict[str, ProgressBar] = field(default_factory=dict)
    # lines that report a failing transport or an NCCL error other than a timeout
    # ("ncclRemoteError", "NET/IB : Got completion ... with error", "Connection reset by
    # peer"), with the rank that printed each where a prefix says it
    transport_errors: list[tuple[int | None, Source]] = field(default_factory=list)
    # a transport's report that the ranks' collectives did not match (SizeMismatch)
    size_mismatches: list[SizeMismatch] = field(default_factory=list)
    # the job's own lines that say a rank skipped or dropped a batch or step ("rank 1:
    # dropping batch 15 (...)"), with the rank its prefix or its text names
    skip_lines: list[OwnOutput] = field(default_factory=list)
    # the job's own lines that say a rank stopped training or is leaving ("EarlyStopping: no
    # improvement for 3 epochs, stopping", "shard exhausted", "done, exiting"), likewise
    stop_lines: list[OwnOutput] = field(default_factory=list)
    # how the files say the model is wrapped: "sharded" (FSDP, ZeRO, DeepSpeed, Megatron's
    # distributed optimizer) where any line names one, "replicated" where one names DDP
    wrappers_said: set[str] = field(default_factory=set)
    # the processes torchelastic's agent told to stop after a failure ("Sending process 5521
    # closing signal SIGTERM"): the survivors of the first failure it saw, on its node
    launcher_closed: dict[int, Source] = field(default_factory=dict)  # pid -> where it said so
    # the processes a launcher says it started, with their rank where its lines give it
    # (DeepSpeed's "process 118822 spawned with command: [... '--local_rank=5' ...]" on the
    # node its "node_rank=2, num_local_procs=8" names): pid -> rank
    launched: dict[int, int] = field(default_factory=dict)
    # the processes the kernel's OOM killer took ("Out of memory: Killed process 118822"):
    # pid -> where said; a rank's ending where a pid is tied to a rank
    oom_killed: dict[int, Source] = field(default_factory=dict)
    # the job's own lines that carry a rank's prefix, by their text with the numbers blanked
    # (each rank's copy of one log call matches), the last few of each (logs.py)
    rank_lines: dict[str, list[OwnOutput]] = field(default_factory=dict)
    # the lengths of the ranks' loops, where the job's output says them (LoopLength)
    loop_lengths: list[LoopLength] = field(default_factory=list)
    # tracebacks that end in an exception, printed with no rank's prefix in a file of no
    # one rank: some rank's error, which one the files do not say
    unplaced_endings: list[Ending] = field(default_factory=list)
    # the job's own lines that print a list of names, with the rank their prefix or text
    # names ("rank 2: ema sync order ['embed_1', 'size_0', ...]"): the order each rank meets
    # them in, where a debugging print shows it
    listed: list[OwnOutput] = field(default_factory=list)

    def rank(self, rank: int) -> RankAftermath:
        found = self.ranks.get(rank)
        if found is None:
            found = self.ranks[rank] = RankAftermath(rank)
            self.world_size = max(self.world_size, rank + 1)
        return found

    @property
    def usable(self) -> bool:
        return bool(
            self.unplaced
            or self.unplaced_issued
            or self.dump_errors
            or self.fr_trace
            or self.desync
            or self.barrier_late
            or self.mismatches
            or self.size_mismatches
            or self.progress_bars  # a job's bar that stopped part-way: its own output, read
        ) or any(
            r.timeouts
            or r.progress
            or r.ending
            or r.stack
            or r.flight_recorder
            or r.watchdog_stuck
            or r.barrier_waited_on
            or r.unique_id_from
            or r.issued
            or r.calls
            for r in self.ranks.values()
        )


class FactKind(Enum):
    """What a fact a rank left is about."""

    TIMEOUT = "timeout"  # a watchdog line: the collective it timed out in
    PROGRESS = "progress"  # the last enqueued and completed sequence numbers per group
    FLIGHT_RECORDER = "flight-recorder"  # the recorder's last entry per group
    STACK = "stack"  # where its dumped stack waits
    CALL = "call"  # where it called the collective it timed out in (the watchdog's stack trace)
    WATCHDOG_STUCK = "watchdog-stuck"  # the heartbeat monitor found its watchdog thread stuck
    ISSUED = "issued"  # the last collective a numbered sequence shows it issued
    ENDING = "ending"  # how it ended: code, signal, error
    HEARD = "heard"  # its output is in the files, with no watchdog line of its own
    BARRIER = "barrier"  # it waited on one named rank: a monitored_barrier's coordinator, a NCCL id


class Fact(NamedTuple):
    kind: FactKind
    text: str
    source: str  # the file and line it was read from


def evidence_lines(job: Aftermath, kinds: Collection[FactKind] = tuple(FactKind)) -> list[str]:
    """What each rank left (the facts of ``kinds``), ranks that left the same merged
    (STAT's classes), each line with the file and line it came from."""
    classes: dict[str, list[tuple[int, str]]] = {}
    for rank, record in sorted(job.ranks.items()):
        for fact in rank_facts(record):
            if fact.kind in kinds:
                classes.setdefault(fact.text, []).append((rank, fact.source))
    lines = []
    for text, seen in classes.items():
        ranks = [rank for rank, _ in seen]
        where = seen[0][1] + (f" and {len(seen) - 1} more" if len(seen) > 1 else "")
        lines.append(f"{who(ranks)}: {text} ({where})")
    return lines


def rank_facts(record: RankAftermath) -> list[Fact]:
    """What one rank left, each fact with its kind and the file and line it came from."""
    facts = [
        Fact(FactKind.TIMEOUT, f"the watchdog timed out {w.describe()}", str(w.source))
        for w in record.timeouts
    ]
    facts += [
        Fact(
            FactKind.PROGRESS,
            f"on group {p.group}, last enqueued #{p.last_enqueued}, last completed #{p.last_completed}",
            str(p.source),
        )
        for p in record.progress.values()
    ]
    for called in record.calls:
        site = called.caller
        if site is not None:
            which = f"#{called.seq}" if called.seq is not None else "the collective that timed out"
            # the op where no timeout line of the rank names it (a trace with no SeqNum line)
            op = f" ({called.op})" if called.op and called.seq is None else ""
            facts.append(
                Fact(
                    FactKind.CALL,
                    f"it called {which}{op} at {site.file}:{site.line} in {site.function}()",
                    str(called.source),
                )
            )
    for sequence, issued in sorted(record.issued.items()):
        latest = issued[-1]
        issued_text = (
            f"its last, in row {latest.position}, {latest.describe().split(' ', 1)[1]}"
            if sequence == FR_ROWS
            else f"it last issued {latest.describe()}"
        )
        facts.append(Fact(FactKind.ISSUED, f"{sequence}: {issued_text}", str(latest.source)))
    recorded = record.flight_recorder
    for call in recorded.get("last", {}).values():
        last = f"#{call['seq']} {call['op']} ({call['state']})"
        facts.append(
            Fact(
                FactKind.FLIGHT_RECORDER,
                f"its Flight Recorder's last on group {call['group']} is {last}",
                str(recorded.get("path")),
            )
        )
    if record.watchdog_stuck is not None:
        seconds, said = record.watchdog_stuck
        facts.append(
            Fact(
                FactKind.WATCHDOG_STUCK,
                "its watchdog thread was stuck"
                + (f" for {seconds} s" if seconds else "")
                + " (a NCCL or CUDA call blocked it): it could not time out a collective of its own",
                str(said),
            )
        )
    if record.barrier_waited_on is not None:
        waited_on, said = record.barrier_waited_on
        facts.append(
            Fact(
                FactKind.BARRIER,
                f"it reached gloo's monitored_barrier and got no answer from rank {waited_on}",
                str(said),
            )
        )
    elif record.unique_id_from is not None:
        first, error, said = record.unique_id_from
        facts.append(
            Fact(
                FactKind.BARRIER,
                f"it set up a NCCL communicator and never got rank {first}'s ncclUniqueId ({error})",
                str(said),
            )
        )
    elif (
        record.watchdog_stuck is None
        and record.heard is not None
        and not record.timeouts
        and not record.progress
        and not record.calls  # "Stack trace of the failed collective" follows a timeout
    ):
        facts.append(Fact(FactKind.HEARD, "its own lines hold no watchdog timeout", str(record.heard)))
    if record.stack is not None and record.stack_source is not None:
        waits = blocking(record.stack)
        at_sync = waits.sync and waits.sync not in waits.what
        stack_said = f"its stack waits in {waits.what}" + (
            f", at a device sync point ({waits.sync})" if at_sync else ""
        )
        facts.append(Fact(FactKind.STACK, stack_said, str(record.stack_source)))
    if record.ending is not None:
        ending = record.ending
        how = f"exit code {ending.exit_code}" if ending.exit_code is not None else "ended"
        if ending.signal:
            how = f"killed by {signal_name(ending.exit_code) or f'signal {ending.signal}'}"
        text = how + (f": {ending.error}" if ending.error else "")
        where = ending.error_site
        text += f" at {where.file}:{where.line} in {where.function}" if where else ""
        text += " (torchelastic's root cause)" if ending.root_cause else ""
        facts.append(Fact(FactKind.ENDING, text, str(ending.source)))
    return facts
