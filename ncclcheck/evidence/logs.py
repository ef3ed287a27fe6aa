"""Reading what a job left behind, whatever it is, by its content: job logs (torchrun's
``[rankN]:`` prefixes, NCCL's watchdog lines, torchelastic's failure summary, Python
tracebacks, faulthandler dumps printed into the log), stack dump files (py-spy's text
and JSON, faulthandler's), doctor's own dumps, and Flight Recorder dumps (JSON;
pickles only with ``trust_pickle``, through torch's own loader).

Files are streamed line by line: a log of every rank of a large job is never held
whole, and each rank keeps a few small records (evidence/aftermath.py).
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ncclcheck.errors import InputError
from ncclcheck.evidence import flight_recorder
from ncclcheck.evidence.aftermath import (
    DETAIL_RUNNING,
    NCCL_COLL,
    NCCL_RAS,
    RANK_IN_TEXT,
    Aftermath,
    CollectiveCall,
    DesyncVerdict,
    Ending,
    Fingerprint,
    FingerprintMismatch,
    Issued,
    LoopLength,
    OwnOutput,
    Progress,
    ProgressBar,
    RankAftermath,
    SizeMismatch,
    Source,
    TimedOutWork,
    UnplacedStack,
)
from ncclcheck.evidence.dumps import (
    HEADER,
    PROCESS,
    StackReader,
    excerpt_frame,
    is_stack_line,
    is_user_path,
    looks_like_py_spy_json,
)
from ncclcheck.evidence.fr_trace import looks_like_fr_trace, read_entry_table, read_fr_trace
from ncclcheck.evidence.nccl_coll import CollTrace
from ncclcheck.evidence.ncclras import RasReport
from ncclcheck.evidence.stacks import ProcessStack, threads_from_py_spy_json
from ncclcheck.evidence.summary import SummaryReader, is_summary_line
from ncclcheck.model import Frame

# a rank's prefix (torchrun's --tee / --role: [rankN]: or [defaultN]:), where a line
# starts, or after a tag a log collector put in front of it ("host [stderr] [rank3]:",
# Ray's "(RayTrainWorker pid=4120, ip=10.0.0.3) [rank3]:")
_PREFIX = re.compile(
    r"^[ \t]*(?:\([^()]{0,120}\bpid=\d+[^()]{0,60}\) |[^\s\[]\S{0,80} (?:\[std(?:out|err)\] )?)?"
    r"\[(?:rank|default)(\d+)\[?\]:\s?"  # "[rank3[]:": a forum's markup artefact
)
# other launchers' and frameworks' prefixes, where a line starts: "[rank=3] || ", "[Rank 3] ", "[r3] ",
# "[RANK 3]: ", and a worker's "(Worker_TP1 pid=1390) " or "(VllmWorker rank=1 pid=1390) "
# (a serving engine's tensor-parallel workers: one index, the rank, and the process's pid),
# and Open MPI's "[1,3]<stdout>:"
_OTHER_PREFIX = re.compile(
    r"^[ \t]*(?:\[(?:rank|Rank|RANK|r)[= ]?(\d+)\][ \t]*(?:\|\|?|:)?[ \t]?"
    r"|\((?:\w+?_)?(?:TP|rank=)(\d+)\b[^()]{0,20}?\bpid=(\d+)[^()]{0,60}\)[ \t]"
    r"|\[\d+,(\d+)\]<std(?:out|err)>:)"  # Open MPI's mpirun --tag-output: "[1,3]<stdout>:"
)
# each field read only where its delimiter follows: a posted line cut mid-field ("OpType=ALLR",
# "NumelOut=12") must not read as another op or size
_WORK = re.compile(
    r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?=[,)])(?:, NumelIn=(\d+), NumelOut=(\d+)(?=[,)]))?"
)
_WORK_CUT = re.compile(r"WorkNCCL\(SeqNum=(\d+)(?=[,)])")  # the op cut off: number only
# torch 1.10 and older number no work: "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000)",
# some with the tensor's shape ("OpType=ALLREDUCE, TensorShape=[1024], ...")
_WORK_UNNUMBERED = re.compile(r"WorkNCCL\(OpType=(\w+)(?=[,)])")
_TENSOR_SHAPE = re.compile(r"\bTensorShape=\[([\d, ]*)\]")
_WORK_TIMEOUT = re.compile(r"WorkNCCL\([^)]*Timeout\(ms\)=(\d+)")
_GROUP = re.compile(r"\[PG(?: ID)? (\d+)")
_NO_GROUP = ""  # a line that names no process group (placed once the rank's lines are read)
# a line that names no group but gives the rank's rank in it, another than its own: the
# work's group is one of the rank's own, compared with no other rank's
_UNNAMED_SUBGROUP = "(unnamed, rank"
_RANK_SAID = re.compile(r"\bRank (\d+)\]")
# srun --label: the task's number, right-aligned, then ": " ("13: Traceback ...", " 4: [E ...")
# after a timestamp a pipe put in front of it (`srun -l ... | ts`: "14:22:58 6: Traceback")
_SRUN_LABEL = re.compile(r"^(?:[\d:.,/T-]+\s+){0,2}? {0,4}(\d{1,5}): ")
_LABEL_STARTS = frozenset(" 0123456789")
# how far a rank got on a group when its watchdog fired, in each torch's words: 2.2-2.3
# "Timeout at NCCL work: X, last enqueued NCCL work: Y, last completed NCCL work: Z"; 2.4+
# "failure detected by watchdog at work sequence id: X PG status: last enqueued work: Y,
# last completed work: Z", later with ", last started work: S (OP)," between them
_PROGRESS = re.compile(
    r"(?:\bwork(?: sequence id)?: (\d+),? (?:PG status: )?)?"
    r"last enqueued (?:NCCL )?work: (-?\d+),"
    r"(?: last started (?:NCCL )?work: -?\d+(?: \(\w+\))?,)?"
    r" last completed (?:NCCL )?work: (-?\d+)",
    re.I,
)
_RUN_ID = re.compile(r"\brun_id\s*[=:]\s*['\"]?([\w.\-]+)")
_WORLD = re.compile(r"\bWORLD_SIZE\s*[=:]\s*(\d+)|\bworld_size\s*[=:]\s*(\d+)")
_ELASTIC_FIELD = re.compile(r"^\s+(rank|exitcode|host|traceback|error_file)\s*:\s*(.*)$")
_TRACEBACK_FRAME = re.compile(r'^\s*File "(.+)", line (\d+), in (.+)$')
# the line that ends a traceback: the exception ("RuntimeError: ...", "torch.distributed.
# DistBackendError: ...", "KeyboardInterrupt"); after a traceback whose header was cut, any
# other line (the poster's words) ends a stack excerpt, not a crash
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit|Failure|Timeout|Iteration|Warning)\b"
)
# the watchdog's "Stack trace of the failed collective:" frames (the Flight Recorder's)
_CALL_HEADER = "Stack trace of the failed collective:"
_CALL_FRAME = re.compile(r"^\s*#(\d+) (\S.*?) from (.+?):(\d+)\s*$")
# what a line must start with to matter when no stack, traceback or summary is being read
_MARKER_STARTS = (
    "Traceback (",
    "Thread ",
    "Current thread ",
    "Process ",
    "Root Cause",
    "Failures:",
    "-- Thread ID",
    "--- Thread ID",
    "#0 ",
    "Traceback for thread ",  # pystack's
)


def _ends_mid_sentence(line: str) -> bool:
    """A line cut where a terminal or a forum wrapped it: it ends on a word, a colon or a
    comma. One look at its last character: this runs on every prefixed line of a log."""
    last = line.rstrip()[-1:]
    return last.islower() or last in (":", ",")


def _continues(line: str) -> bool:
    """The rest of a wrapped line: it starts mid-sentence and names no rank of its own."""
    return bool(line) and (line[0].islower() or line.startswith("WorkNCCL(")) and not _RANK_SAID.search(line)


# NCCL's desync report: who lagged, and who joined a collective that never finished
_NOT_JOINED = re.compile(r"\[([\d, ]+)\] finished collective #(\d+), but didn't join collective #(\d+)")
_NOT_FINISHED = re.compile(r"\[([\d, ]+)\] joined but didn't finish collective #(\d+)")
# gloo's monitored_barrier, as rank 0 and the others say it
_BARRIER_LATE = re.compile(r"Rank (\d+) failed to pass monitoredBarrier in (\d+) ms")
_BARRIER_REACHED = re.compile(r"Rank (\d+) successfully reached monitoredBarrier")
_BARRIER_UNANSWERED = re.compile(
    r"Rank (\d+) successfully reached monitoredBarrier, but received errors while waiting for "
    r"send/recv from rank (\d+)"
)
_SNAPSHOT = re.compile(r"^\s*\[([\d, ]+)\] (?:started|finished) \w+")  # its ranks' latest states


def _monitored_barrier(text: _TextFile, line: str, number: int) -> None:
    found = text.found
    for late in _BARRIER_LATE.finditer(line):
        rank = int(late.group(1))
        found.barrier_late.setdefault(rank, (int(late.group(2)), Source(str(text.path), number)))
        found.world_size = max(found.world_size, rank + 1)
    for reached in _BARRIER_REACHED.finditer(line):
        found.barrier_reached.add(int(reached.group(1)))
        found.world_size = max(found.world_size, int(reached.group(1)) + 1)
    for unanswered in _BARRIER_UNANSWERED.finditer(line):
        waiting, waited_on = int(unanswered.group(1)), int(unanswered.group(2))
        record = found.rank(waiting)
        record.barrier_waited_on = record.barrier_waited_on or (waited_on, Source(str(text.path), number))
        found.world_size = max(found.world_size, waiting + 1, waited_on + 1)
    if found.barrier_late or found.barrier_reached:
        text.kinds.add("gloo's monitored_barrier")


def _desync_snapshot(text: _TextFile, line: str) -> bool:
    """A line of the desync report's snapshot of the ranks' states: which ranks the job has."""
    snapshot = _SNAPSHOT.match(line)
    if snapshot is None:
        return False
    ranks = [int(r) for r in re.findall(r"\d+", snapshot.group(1))]
    text.found.world_size = max(text.found.world_size, max(ranks) + 1)
    text.found.world_said = max(text.found.world_said, max(ranks) + 1)
    return True


# TORCH_DISTRIBUTED_DEBUG=DETAIL's check, before each collective: "Rank 1 is running
# collective: CollectiveFingerPrint(SequenceNumber=485, OpType=ALLREDUCE, TensorShape=[25],
# TensorDtypes=Float, ...), but Rank 0 is running collective: CollectiveFingerPrint(...)";
# older torch: "Rank 0 is running inconsistent collective: CollectiveFingerPrint(OpType=...)"
_RUNNING = re.compile(r"Rank (\d+) is running (?:inconsistent )?collective: CollectiveFingerPrint\(")
_FINGERPRINT_FIELD = re.compile(
    r"(SequenceNumber|OpType|TensorShape|TensorDtypes)=(\[[^\]]*\]|[A-Za-z0-9_]+?)(?=[,)]|OpType|$)"
)


def _fingerprint(rank: str, body: str) -> Fingerprint:
    fields = dict(_FINGERPRINT_FIELD.findall(body))
    seq = fields.get("SequenceNumber")
    return Fingerprint(
        int(rank),
        int(seq) if seq and seq.isdigit() else None,
        fields.get("OpType", "?"),
        fields.get("TensorShape"),
        fields.get("TensorDtypes"),
    )


_RUNNING_ONE = re.compile(r"\[Rank (\d+)\] Running collective: CollectiveFingerPrint\((.*)")
_KEPT_FINGERPRINTS = 16  # per rank: the last ones are what matter


def _running_collective(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    """DETAIL's INFO line before each collective (TORCH_CPP_LOG_LEVEL=INFO): "[Rank 2]
    Running collective: CollectiveFingerPrint(SequenceNumber=38, OpType=ALLREDUCE, ...)"."""
    running = _RUNNING_ONE.search(line)
    if running is None:
        return
    said = _fingerprint(running.group(1), running.group(2))
    if said.seq is None:
        return
    shape = " ".join(x for x in (said.shape, said.dtype) if x) or "unknown tensors"
    kept = text.found.rank(said.rank if rank is None else rank).issued.setdefault(DETAIL_RUNNING, [])
    kept.append(Issued(said.seq, said.op, shape, Source(str(text.path), number)))
    del kept[:-_KEPT_FINGERPRINTS]
    text.kinds.add("DETAIL's fingerprints of each collective")


def _fingerprint_mismatch(text: _TextFile, line: str, number: int) -> None:
    starts = list(_RUNNING.finditer(line))
    # each rank's fingerprint: from its "CollectiveFingerPrint(" to the next rank's
    bodies = [
        line[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(line)]
        for i, m in enumerate(starts)
    ]
    found = [_fingerprint(m.group(1), body) for m, body in zip(starts, bodies, strict=True)]
    if not found:
        return
    mismatch = FingerprintMismatch(
        found[0], found[1] if len(found) > 1 else None, Source(str(text.path), number)
    )
    text.found.mismatches.append(mismatch)
    for seen in found:
        text.found.rank(seen.rank)
    text.kinds.add("TORCH_DISTRIBUTED_DEBUG=DETAIL's collective mismatch check")


def _may_matter(line: str) -> bool:
    """A cheap test for the lines of a log that are not the training's own: plain
    substring tests are many times faster than one regular expression of alternatives."""
    return (
        "NCCL" in line
        or "enqueued work" in line
        or "Heartbeat monitor" in line
        or "watchdog got stuck" in line
        or "monitoredBarrier" in line
        or "collective #" in line
        or "Detected mismatch between collectives" in line
        or "op.nbytes" in line
        or "ollective mismatch" in line
        or "Mismatched collective" in line
        or "ncclRemoteError" in line
        or "ncclSystemError" in line
        or "network error" in line
        or "Connection reset by peer" in line
        or "Connection closed by" in line
        or "Running collective: CollectiveFingerPrint(" in line
        or "] started " in line
        or "] finished " in line
        or "%|" in line  # a progress bar (tqdm's)
        or "run_id" in line
        or "orld_size" in line
        or "WORLD_SIZE" in line
        or line.startswith(_MARKER_STARTS)
        # a traceback's frame with its header cut off, as excerpts are posted
        or line.lstrip().startswith('File "')
        # a py-spy frame with its dump's header cut off: `fn (file.py:12)`
        or (".py:" in line and excerpt_frame(line) is not None)
    )


_SNIFF_BYTES = 64 * 1024
_JSON_START = re.compile(rb"\s*(\{|\[\s*[\[{\]])")
_DOCTOR_DUMP = "ncclcheck-doctor-dump/1"


def read_leftovers(paths: list[Path], trust_pickle: bool = False) -> Aftermath:
    """One Aftermath from files and folders of any known kind, mixed."""
    found = Aftermath()
    files = list(_files(paths))
    for path in files:
        _read_file(path, found, trust_pickle)
    _place_by_pid(found)
    _place_oom_kills(found)
    if len(found.run_ids) > 1:
        raise InputError(
            f"these files hold two or more jobs: run ids {', '.join(sorted(found.run_ids))}",
            hint="Give doctor --from the files of one job only.",
        )
    named = {w.group for r in found.ranks.values() for w in r.timeouts} | {
        g for r in found.ranks.values() for g in r.progress
    }
    named = {g for g in named if g != _NO_GROUP and not g.startswith(_UNNAMED_SUBGROUP)}
    # the one group the job's lines name, if they name one: older watchdog lines name none
    only = next(iter(named)) if len(named) == 1 else "0"
    # Older lines name no group, but each group has one timeout: works that name none and
    # differ in it are on different groups (an all-gather group of 30 min, the default of 10)
    limits = {w.timeout_ms for r in found.ranks.values() for w in r.timeouts if w.group == _NO_GROUP}
    by_limit = len(limits) > 1 and None not in limits
    found.world_said = max(found.world_said, _world_of_gathers(found))
    found.world_size = max(found.world_size, found.world_said)  # the highest ranks may say nothing
    apart = _groups_their_numbers_tell_apart(found)
    for record in found.ranks.values():
        if by_limit:
            record.timeouts = [
                replace(w, group=f"(timeout {(w.timeout_ms or 0) / 1000:g} s)") if w.group == _NO_GROUP else w
                for w in record.timeouts
            ]
        record.timeouts = [
            replace(w, group=apart[(record.rank, w.seq)]) if (record.rank, w.seq) in apart else w
            for w in record.timeouts
        ]
        _place_in_groups(record, only)
    return found


# point-to-point ops: a send or receive involves two ranks of its group, so the other
# members' numbers on that group do not advance with it
_P2P_OPS = frozenset({"SEND", "RECV", "_SEND", "_RECV"})
# within one group, the ranks' numbers at a timeout are a few calls apart at most (every
# collective needs every member); numbers this far apart are of two groups
_APART = 1000


def _groups_their_numbers_tell_apart(found: Aftermath) -> dict[tuple[int, int | None], str]:
    """Groups for timeouts whose lines name none and whose rank's progress lines do not
    either (older torch), where the numbers themselves say that several groups are in play:
    a send or receive is its rank's own (no other rank's number on its group moves with
    it); and numbers more than ``_APART`` apart are of different groups, each run of close
    numbers one. Where the numbers are all close and no op is point-to-point, nothing is
    assigned (one group, as before)."""
    unnamed = [
        (record.rank, w)
        for record in found.ranks.values()
        for w in record.timeouts
        if w.group == _NO_GROUP
        and w.seq is not None
        and not any(p.timed_out == w.seq for p in record.progress.values())
    ]
    p2p = [(rank, w) for rank, w in unnamed if w.op.upper() in _P2P_OPS]
    numbers = sorted({w.seq for _rank, w in unnamed if w.op.upper() not in _P2P_OPS and w.seq is not None})
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number - runs[-1][-1] <= _APART:
            runs[-1].append(number)
        else:
            runs.append([number])
    assigned: dict[tuple[int, int | None], str] = {
        (rank, w.seq): f"(unnamed: rank {rank}'s {w.op.lower()})" for rank, w in p2p
    }
    if len(runs) > 1:
        for run in runs:
            for rank, w in unnamed:
                if w.seq in run and w.op.upper() not in _P2P_OPS:
                    assigned[(rank, w.seq)] = (
                        f"(unnamed, #{run[0]}{'-' + str(run[-1]) if len(run) > 1 else ''})"
                    )
    return assigned


def _place_by_pid(found: Aftermath) -> None:
    """A dump of no known rank whose pid another file ties to a rank (a worker's log line
    "(Worker_TP1 pid=1390)", a torchelastic summary's entry) is that rank's, where the rank
    has no stack of its own."""
    for unplaced in list(found.unplaced):
        pid = unplaced.stack.pid
        owner = next(
            (r for r in found.ranks.values() if pid and (r.pid == pid or (r.ending and r.ending.pid == pid))),
            None,
        )
        if owner is None or owner.stack is not None:
            continue
        owner.stack, owner.stack_source = unplaced.stack, unplaced.source
        found.unplaced.remove(unplaced)
        found.read.append(f"{unplaced.source.path}: the stack of pid {pid} is rank {owner.rank}'s (its pid)")


def _world_of_gathers(found: Aftermath) -> int:
    """The world size an all-gather or a reduce-scatter of the default group states: its
    output is every rank's input put together (NumelOut = world x NumelIn)."""
    sizes = set()
    for record in found.ranks.values():
        for work in record.timeouts:
            if work.group not in ("0", _NO_GROUP) or not work.numel_in or not work.numel_out:
                continue
            name = work.op.strip("_").upper()
            big, small = (
                (work.numel_out, work.numel_in) if "ALLGATHER" in name else (work.numel_in, work.numel_out)
            )
            if ("ALLGATHER" in name or "REDUCE_SCATTER" in name) and big % small == 0:
                sizes.add(big // small)
    return max(sizes) if len(sizes) == 1 else 0


def _place_in_groups(record: RankAftermath, default: str) -> None:
    """A watchdog line that names no process group is in the group of the rank's progress
    line about the same work ("at work: N" on PG 1), else in ``default``."""
    unnamed = record.progress.pop(_NO_GROUP, None)
    if unnamed is not None:
        record.progress.setdefault(default, replace(unnamed, group=default))
    by_work = {p.timed_out: group for group, p in record.progress.items() if p.timed_out is not None}
    record.timeouts = [
        w
        if w.group != _NO_GROUP
        else replace(w, group=default if w.seq is None else by_work.get(w.seq, default))
        for w in record.timeouts
    ]
    # a failed collective's stack trace is in the group of the timeout it follows
    group_of: dict[int | None, str] = {w.seq: w.group for w in record.timeouts}
    record.calls = [
        c if c.group != _NO_GROUP else replace(c, group=group_of.get(c.seq, default)) for c in record.calls
    ]


def _files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            yield path
        else:
            raise InputError(f"{path}: no such file or directory")


def _read_file(path: Path, found: Aftermath, trust_pickle: bool) -> None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except OSError as exc:
        found.skipped.append(f"{path}: unreadable ({exc.strerror})")
        return
    if not head.strip():
        found.skipped.append(f"{path}: empty")
        return
    if head[:1] == b"\x80":  # a pickle: torch's Flight Recorder writes them by default
        _read_pickled_flight_recorder(path, found, trust_pickle)
        return
    if b"\0" in head:
        found.skipped.append(f"{path}: binary, of no kind doctor reads")
        return
    if _JSON_START.match(head):  # "{" or "[{" / "[]": not a log's "[rank0]:" prefix
        try:
            document = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except ValueError:
            document = None
        if document is not None:
            _read_json(path, document, found)
            return
        if head.lstrip()[:1] == b"{" and b"\n" not in head.strip():
            found.skipped.append(f"{path}: not a doctor dump, nor JSON of any kind doctor reads (cut short?)")
            return
    if looks_like_fr_trace(head.decode("utf-8", errors="replace")):
        text = path.read_text(encoding="utf-8", errors="replace")
        verdicts = read_fr_trace(str(path), text)
        numbering, entries = read_entry_table(str(path), text)
        for rank, issued in entries.items():
            found.rank(rank).issued[numbering] = issued
        if verdicts or entries:
            found.fr_trace.extend(verdicts)
            found.world_size = max(
                [found.world_size, *(v.world_size or 0 for v in verdicts), max(entries, default=-1) + 1]
            )
            found.world_said = max([found.world_said, *(v.world_size or 0 for v in verdicts)])
            found.read.append(
                f"{path}: the Flight Recorder analyser's output (fr_trace"
                + (", its table of each rank's entries)" if entries else ")")
            )
            return
    _read_text(path, found)


def _read_json(path: Path, document: Any, found: Aftermath) -> None:
    if isinstance(document, dict) and document.get("format") == _DOCTOR_DUMP:
        _read_doctor_dump(path, document, found)
    elif looks_like_py_spy_json(document):
        rank = _rank_from_name(path)
        if rank is None:
            found.skipped.append(f"{path}: a py-spy JSON dump, but which rank's? (name it rank<N>.json)")
            return
        record = found.rank(rank)
        record.stack = ProcessStack(
            pid=0, threads=threads_from_py_spy_json(document, is_user=is_user_path), status="dumped"
        )
        record.stack_source = Source(str(path))
        found.read.append(f"{path}: py-spy JSON dump of rank {rank}")
    elif isinstance(document, dict) and "entries" in document:
        summary = flight_recorder.read_dump(str(path))
        rank = document.get("rank") if isinstance(document.get("rank"), int) else _rank_from_name(path)
        if rank is None:
            found.skipped.append(f"{path}: a Flight Recorder dump without its rank")
            return
        found.rank(rank).flight_recorder = summary
        found.read.append(f"{path}: Flight Recorder dump of rank {rank}")
    else:
        found.skipped.append(f"{path}: JSON, but not a doctor dump, a py-spy dump or a Flight Recorder dump")


def _read_doctor_dump(path: Path, document: dict[str, Any], found: Aftermath) -> None:
    try:
        for entry in document["ranks"]:
            rank = int(entry["rank"])
            if rank in found.ranks and found.ranks[rank].stack is not None:
                raise InputError(f"{path}: rank {rank} is also in another dump (two jobs in one directory?)")
            record = found.rank(rank)
            record.stack = ProcessStack.from_dict(entry["stack"])
            record.stack_source = Source(str(path))
            record.host, record.pid = entry.get("host"), entry.get("pid")
            record.flight_recorder = entry.get("flight_recorder") or {}
            found.doctor_ranks[rank] = {k: v for k, v in entry.items() if k != "stack"}
            found.world_size = max(found.world_size, int(entry.get("world_size", 0)))
            found.world_said = max(found.world_said, int(entry.get("world_size", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: malformed doctor dump ({exc})") from None
    found.read.append(f"{path}: doctor dump")


def _read_pickled_flight_recorder(path: Path, found: Aftermath, trust_pickle: bool) -> None:
    if not trust_pickle:
        found.skipped.append(
            f"{path}: a pickled Flight Recorder dump, not read: unpickling runs code. Convert it with "
            "`python -m torch.distributed.flight_recorder.fr_trace -j` (or pass --trust-pickle)"
        )
        return
    named = re.match(r"(.*?)(\d+)$", path.name)  # torch's loader takes the rank from the name's end
    if named is None:
        found.skipped.append(f"{path}: a pickle whose name does not end in its rank (nccl_trace_rank_3)")
        return
    try:
        from torch.distributed.flight_recorder.components.loader import read_dump as torch_read_dump

        document = torch_read_dump(named.group(1), str(path))
    except Exception as exc:  # torch's loader on a file it cannot read: said, not raised
        found.skipped.append(f"{path}: torch's Flight Recorder loader failed ({type(exc).__name__}: {exc})")
        return
    rank = document.get("rank") if isinstance(document.get("rank"), int) else _rank_from_name(path)
    if rank is None:
        found.skipped.append(f"{path}: a Flight Recorder dump without its rank")
        return
    found.rank(rank).flight_recorder = flight_recorder.summarize(str(path), document)
    found.read.append(f"{path}: Flight Recorder dump of rank {rank} (pickle, read with --trust-pickle)")


def _rank_from_name(path: Path) -> int | None:
    """A rank the file's name gives: "rank3.txt", "rank_3.log", or a name that is only
    the number ("3.json"). Other numbers in a name (a pid, a thread id, a node) are not
    ranks, and a name that gives two ("pyspy_rank0_rank3.txt", "ranks_1_5") gives none:
    the file holds several ranks' lines, each to be placed by what it says itself."""
    named = {int(n) for n in re.findall(r"(?<![a-z])rank[_\-]?(\d+)(?!\d)", path.name, re.IGNORECASE)}
    if len(named) > 1 or re.search(r"(?<![a-z])ranks(?![a-z])", path.name, re.IGNORECASE):
        return None
    if named:
        return named.pop()
    match = re.fullmatch(r"(\d+)\.\w+", path.name)
    return int(match.group(1)) if match else None


# -- text: logs and stack dumps ---------------------------------------------------------


@dataclass
class _Stream:
    """One rank's lines in a text file (its prefix's, or the whole file's)."""

    stack: StackReader | None = None
    stack_line: int = 0
    traceback: list[tuple[str, int, str]] | None = None  # frames (file, line, function)
    traceback_line: int = 0
    traceback_headed: bool = False  # "Traceback (most recent call last):" opened it
    # a DataLoader worker's error re-raised in the rank ("Caught X in DataLoader worker process
    # 3.", then "Original Traceback ..."): that line, and where the worker's own frames begin
    # in ``traceback``
    wrapped: str | None = None
    original_from: int | None = None
    elastic: dict[str, str] = field(default_factory=dict)
    call: list[Frame] | None = None  # the frames of a "Stack trace of the failed collective"
    call_line: int = 0
    summary: SummaryReader | None = None  # threads summarised a line each (evidence/summary.py)
    summary_line: int = 0


@dataclass
class _TextFile:
    path: Path
    found: Aftermath
    streams: dict[int | None, _Stream] = field(default_factory=dict)
    said_ranks: set[int] = field(default_factory=set)  # "Rank N]" in unprefixed lines
    heard: set[int] = field(default_factory=set)  # ranks with a prefixed line in this file
    local_base: int = 0  # the global rank of this file's "[default0]:" (_node_base)
    cut_rank: int | None = None  # the rank of the line before, when it was cut mid-sentence
    header_rank: int | None = None  # the latest "== rank N ==" header
    # a log record of several lines whose prefix only its first line carries (a worker's
    # "(Worker_TP1 pid=1390) ERROR ...", then its traceback): the rank of the prefixed line
    # just before, and whether a traceback it opened is being read
    last_prefixed: int | None = None
    timed_out: bool = False  # a watchdog timeout was read: what the job printed after is no phase
    ps_columns: tuple[int, int] | None = None  # a ps listing's PID and STAT columns, while in it
    dumping: int | None = None  # the pid of the `py-spy dump` command just read
    # the job's last two lines of its own output (not torch's, not NCCL's): line, number, rank
    own_output: deque[tuple[str, int, int | None]] = field(default_factory=lambda: deque(maxlen=2))
    adopted: int | None = None
    header_pid: int | None = None
    elastic_section: str | None = None  # "root" or "failures" inside torchelastic's summary
    elastic_entry: dict[str, str] | None = None
    elastic_line: int = 0
    pending_stacks: list[tuple[int | None, int | None, StackReader | SummaryReader, int]] = field(
        default_factory=list
    )
    kinds: set[str] = field(default_factory=set)
    coll: CollTrace = field(default_factory=CollTrace)  # NCCL_DEBUG_SUBSYS=COLL's lines
    # DeepSpeed's launcher: host -> (node rank, processes per node); (host, pid, local rank)
    launcher_nodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    launched: list[tuple[str, int, int]] = field(default_factory=list)
    ras: RasReport = field(default_factory=RasReport)  # ncclras's launch counts
    prefixed_processes: dict[tuple[str, int], int] = field(default_factory=dict)  # (host, pid) -> rank
    unowned: list[tuple[str, Any, int]] = field(default_factory=list)  # evidence of no known rank yet


# a rank's prefix in the middle of a line: two ranks' output spliced into one line (each
# rank writes to the same terminal without a lock, "...[02:32<30:38][default2]:[E ...")
_SPLICED = re.compile(r"(?<=\S)(?=\[(?:rank|default)\d+\]:)")


# `ps aux` / `ps -eo pid,stat,...`: a header naming PID and STAT, then a row per process
_PS_HEADER = re.compile(r"^\s*(?:\w+\s+)*?PID\s+(?:\S+\s+)*?STAT\b")
# a stack dumper that could not attach: "py-spy dump --pid 123", then "Error: Failed to ..."
_DUMP_COMMAND = re.compile(r"\bpy-spy\s+dump\b.*?--pid[= ](\d+)")
_DUMP_ERROR = re.compile(r"^\s*(?:Error|Reason):\s*(.+?)\s*$")


def _process_listing(text: _TextFile, line: str, number: int) -> bool:
    """Rows of a `ps` listing under its header: each pid's STAT (D: uninterruptible sleep,
    a process blocked in the kernel on a disk or a network file system)."""
    columns = text.ps_columns
    if columns is None:
        return False
    cells = line.split()
    if len(cells) <= max(columns) or not cells[columns[0]].isdigit():
        text.ps_columns = None
        return False
    where = Source(str(text.path), number)
    text.found.process_states[int(cells[columns[0]])] = (cells[columns[1]], where)
    text.kinds.add("a process listing (ps)")
    return True


# a post's or a log's word for how the model is wrapped: sharded parameters are gathered per
# module (their all-gathers' sizes follow the modules run), replicated ones are not
_WRAPPER = re.compile(
    r"\b(?:FSDP\d?|fully_shard|FullyShardedDataParallel|ZeRO(?:-?3|[_ -]?stage)?|zero_stage|zero3|"
    r"DeepSpeed|deepspeed|distributed[_ ]optimizer)\b|(?P<replicated>\bDDP\b|DistributedDataParallel)",
)


# torchrun's --tee prefix is the process's local rank ("[default3]:"); a line that holds the
# rank's own prefix beside it ("[default0]:[rank4]:") gives the node's first rank
_LOCAL_AND_GLOBAL = re.compile(r"\[default(\d+)\]:\s?\[rank(\d+)\]:")


def _node_base(path: Path) -> int:
    """The global rank of local rank 0 for the ``[defaultN]:`` prefixes of a file: 0 unless
    its lines pair a local prefix with a global one (``[default0]:[rank4]:`` on the second
    node of 4 processes each), all with one offset (torchrun numbers a node's ranks in a row)."""
    bases: set[int] = set()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for raw in handle:
            if "[default" in raw and (pair := _LOCAL_AND_GLOBAL.search(raw)):
                bases.add(int(pair.group(2)) - int(pair.group(1)))
                if len(bases) > 1:
                    return 0  # no one node's prefixes: leave them as they read
    return bases.pop() if bases else 0


def _read_text(path: Path, found: Aftermath) -> None:
    text = _TextFile(path, found)
    text.local_base = _node_base(path)
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, 1):
            raw = raw.rstrip("\n")
            if raw[:2] == '{"' and (unwrapped := _structured_line(raw)) is not None:
                raw = unwrapped
            if "PID" in raw and _PS_HEADER.match(raw):
                header = raw.split()
                text.ps_columns = (header.index("PID"), header.index("STAT"))
                continue
            if text.ps_columns is not None and _process_listing(text, raw, number):
                continue
            if "py-spy" in raw and (command := _DUMP_COMMAND.search(raw)):
                text.dumping = int(command.group(1))
            elif text.dumping is not None and (error := _DUMP_ERROR.match(raw)):
                pid, said = text.dumping, error.group(1)
                before = found.dump_errors.get(pid)
                if before is None or said not in before[0]:
                    said = f"{before[0]}; {said}" if before else said
                    found.dump_errors[pid] = (said, Source(str(path), number))
                if (rank := _rank_from_name(path)) is not None:
                    found.rank(rank).pid = found.rank(rank).pid or pid
                text.kinds.add("a stack dumper's error")
                continue
            if ("DP" in raw or "ZeRO" in raw or "ero" in raw or "hard" in raw or "peed" in raw) and (
                wrapper := _WRAPPER.search(raw)
            ):
                found.wrappers_said.add("replicated" if wrapper.group("replicated") else "sharded")
            # a second rank's prefix past the line's start (no slice: this runs on every line)
            if (raw.find("[rank", 1) != -1 or raw.find("[default", 1) != -1) and len(
                pieces := _SPLICED.split(raw)
            ) > 1:
                for piece in pieces:  # each rank's part read as its own line
                    _line(text, number, piece)
                text.found.spliced.append(f"{path}:{number}")
                continue
            _line(text, number, raw)
    _finish(text)


# a structured log's own fields, left out of the line it is read as
_STRUCTURED_FIELDS = frozenset(
    {"ts", "time", "timestamp", "level", "levelname", "logger", "name", "rank", "msg", "message"}
)


def _structured_line(raw: str) -> str | None:
    """The line a JSON record holds: a container runtime's (Docker's json-file, Kubernetes'
    `{"log": "...", "stream": ..., "time": ...}`) unwrapped, and a structured logger's
    (`{"rank": 5, "msg": "dist initialized", "world_size": 8}`) as `[rank5]: msg key=value`.
    None for a line that is no such record."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    inner = record.get("log")
    if isinstance(inner, str):
        inner = inner.rstrip("\n")
        return (_structured_line(inner) if inner[:2] == '{"' else None) or inner
    said = record.get("msg", record.get("message"))
    if not isinstance(said, str):
        return None
    rank = record.get("rank")
    fields = "".join(f" {key}={value}" for key, value in record.items() if key not in _STRUCTURED_FIELDS)
    prefix = f"[rank{rank}]: " if isinstance(rank, int) else ""
    return f"{prefix}{said}{fields}"


def _line(text: _TextFile, number: int, raw: str) -> None:
    # most lines of a log are the training's own: every test below starts with a cheap
    # substring or prefix check, so that such a line costs one prefix match
    prefix = _PREFIX.match(raw) if "]:" in raw[:200] else None
    rank = int(prefix.group(1)) if prefix else None
    if prefix is not None and text.local_base and "[default" in prefix.group(0):
        rank = text.local_base + int(prefix.group(1))  # a local rank: its node's first rank on
    if prefix is None and raw[:1] in ("[", "(", " ", "\t") and (prefix := _OTHER_PREFIX.match(raw)):
        rank = int(prefix.group(1) or prefix.group(2) or prefix.group(4))
        if prefix.group(3) is not None:
            text.found.rank(rank).pid = text.found.rank(rank).pid or int(prefix.group(3))
    if prefix is None and raw[:1] in _LABEL_STARTS and (label := _SRUN_LABEL.match(raw)):
        # srun --label's task number: the rank where srun starts the ranks itself; where it
        # starts a launcher per node, the rank a line says of itself ("[Rank 5]") wins
        prefix, said = label, _RANK_SAID.search(raw)
        rank = int(said.group(1)) if said else int(label.group(1))
    if prefix is None and text.cut_rank is not None and _continues(raw):
        rank = text.cut_rank  # a line a terminal or a forum wrapped: the rest of the last one
    text.cut_rank = rank if prefix is not None and _ends_mid_sentence(raw) else None
    if rank is None and text.adopted is not None:
        adopted = text.streams.get(text.adopted)
        if adopted is not None and (adopted.traceback is not None or adopted.call is not None):
            rank = text.adopted  # the rest of the prefixed record's traceback or stack trace
        else:
            text.adopted = None
    elif (
        rank is None
        and text.last_prefixed is not None
        and (raw.startswith("Traceback (") or _TRACEBACK_FRAME.match(raw) or _CALL_FRAME.match(raw))
    ):
        rank = text.adopted = text.last_prefixed  # a traceback right under a prefixed line
    text.last_prefixed = rank if prefix is not None else None
    if rank is not None and rank not in text.heard:
        text.heard.add(rank)
        record = text.found.rank(rank)
        record.heard = record.heard or Source(str(text.path), number)
    line = raw[prefix.end() :] if prefix else raw
    if (
        rank is None
        and ("rank" in line or "pid" in line or "RANK" in line)
        and (header := HEADER.match(line))
    ):
        _close_stack(text, text.header_rank)
        ids = {header.group(1).lower(): int(header.group(2))}
        if header.group(3) is not None:
            ids[header.group(3).lower()] = int(header.group(4))
        text.header_rank, text.header_pid = ids.get("rank"), ids.get("pid")
        if text.header_rank is not None:
            record = text.found.rank(text.header_rank)  # a rank whose dump is empty still counts
            record.pid = record.pid or text.header_pid
        return
    if rank is None:
        rank = text.header_rank
    if RasReport.may_be(line) and text.ras.read(line, Source(str(text.path), number)):
        return
    stream = text.streams.get(rank)
    if stream is not None and stream.call is not None:
        if called := _CALL_FRAME.match(line):
            stream.call.append(Frame(called.group(3), int(called.group(4)), called.group(2)))
            return
        _close_call(text, rank, stream)
    if _CALL_HEADER in line:
        stream = text.streams.setdefault(rank, _Stream())
        stream.call, stream.call_line = [], number
        return
    if "`" in line and is_summary_line(line):
        stream = text.streams.setdefault(rank, _Stream())
        if stream.summary is None:
            stream.summary, stream.summary_line = SummaryReader(), number
        if stream.summary.feed(line):
            return
    if (
        ("pid" in line or "PID" in line)
        and ("rank" in line or "Rank" in line)
        and "NCCL" not in line
        and _may_matter(line)
    ):
        # "rank 0 | world_size=4 pid=31207": a startup line that ties a process to its rank
        # while it says more (the job's size), read for both
        _pids_of_ranks(text, line)
    if (
        text.elastic_section is None
        and (stream is None or (stream.stack is None and stream.traceback is None))
        and not _may_matter(line)
    ):
        if "closing signal" in line and (closing := _CLOSING.search(line)):
            text.found.launcher_closed.setdefault(int(closing.group(1)), Source(str(text.path), number))
            return  # torchelastic's, not the job's
        if "srun: error:" in line and (tasks := _SRUN_TASKS.search(line)):
            _srun_task_endings(text, tasks.group(1), tasks.group(2), number)
            return  # srun's, not the job's
        if "Killed process" in line and (killed := _OOM_KILLED.search(line)):
            text.found.oom_killed.setdefault(int(killed.group(1)), Source(str(text.path), number))
            text.kinds.add("the kernel's OOM killer's lines")
            return  # the kernel's
        if "num_local_procs=" in line and (node := _DS_NODE.search(line)):
            host, nnodes, local_procs, node_rank = node.groups()
            text.launcher_nodes[host] = (int(node_rank), int(local_procs))
            text.found.world_said = max(text.found.world_said, int(nnodes) * int(local_procs))
            text.found.world_size = max(text.found.world_size, text.found.world_said)
            text.kinds.add("DeepSpeed launcher's lines")
            return  # the launcher's
        if "spawned with command" in line and (spawned := _DS_SPAWNED.search(line)):
            text.launched.append((spawned.group(1), int(spawned.group(2)), int(spawned.group(3))))
            return  # the launcher's
        if rank is None and "ank" in line[:120] and (tag := _RANK_TAG.search(line[:120])):
            rank = int(tag.group(1))  # a logger's format that tags its lines after its name
        elif rank is None and line[:2] == "[r" and (tag := _SHORT_RANK_TAG.match(line)):
            rank = int(tag.group(1))  # a script's own short tag, "[r3] epoch 0 done"
        if line.strip() and not _SOURCE_CODE.search(line):
            # the job's own output: the last of it before a timeout is evidence
            text.own_output.append((line, number, rank))
            if ("kip" in line or "rop" in line or "gnor" in line or "KIP" in line) and (
                _SKIPPED_STEP.search(line)
            ):
                _skip_line(text, rank, line, number)
            if any(word in line for word in _MAY_SAY_STOPPED) and _STOPPED.search(line):
                _stop_line(text, rank, line, number)
            if rank is not None:
                _rank_line(text, rank, line, number)
            if "['" in line or '["' in line:  # a printed list of names: the order this rank met them
                text.found.listed.append(_of_a_rank(text, rank, line, number, keep=400))
            if ("pid" in line or "PID" in line or "->" in line) and ("rank" in line or "Rank" in line):
                _pids_of_ranks(text, line)
            if "batch" in line and (counted := _BATCH_COUNT.search(line)):
                # its prefix's rank, else the one its text names ("[val shard] rank=3 batches=126")
                owner = rank if rank is not None else _named_rank(line)
                if owner is not None:
                    what = _NUMBER.sub("N", line.strip())[:200]
                    count = int(counted.group(1) or counted.group(2))
                    text.found.loop_lengths.append(
                        LoopLength(what, count, owner, Source(str(text.path), number), line.strip()[:200])
                    )
        return  # the training's own line: one search in C decides it
    if "run_id" in line and (run := _RUN_ID.search(line)) and run.group(1) not in ("none", "None"):
        text.found.run_ids.add(run.group(1))
    if ("WORLD_SIZE" in line or "world_size" in line) and (world := _WORLD.search(line)):
        text.found.world_size = max(text.found.world_size, int(world.group(1) or world.group(2)))
        text.found.world_said = max(text.found.world_said, int(world.group(1) or world.group(2)))
    if "NCCL INFO" in line and text.coll.read(line, Source(str(text.path), number)):
        if rank is not None and (process := _process_of(line)) is not None:
            text.prefixed_processes[process] = rank
        return
    if "NCCL work" in line or "WorkNCCL(" in line or "last enqueued work" in line:
        _nccl_line(text, rank, line, number)
    if "%|" in line:
        _progress_bar(text, rank, line, number)  # and on: a watchdog line often follows on the same line
    if "retrieving ncclUniqueId" in line and (waited := _UNIQUE_ID.search(line)):
        record = text.found.rank(int(waited.group(1)) if rank is None else rank)
        record.unique_id_from = record.unique_id_from or (
            int(waited.group(2)),
            waited.group(3).strip().rstrip("."),
            Source(str(text.path), number),
        )
        text.kinds.add("NCCL communicator set-up errors")
        return
    # a transport's report of mismatched calls is no failing transport (and may end a
    # rank's traceback: read on)
    mismatch = ("op.nbytes" in line or "ollective mismatch" in line or "Mismatched collective" in line) and (
        _size_mismatch(text, rank, line, number)
    )
    if not mismatch and _TRANSPORT_ERROR.search(line):
        text.found.transport_errors.append((rank, Source(str(text.path), number)))
        text.kinds.add("NCCL or transport errors")
    if "watchdog got stuck" in line or "Heartbeat monitor timed out" in line:
        _watchdog_stuck(text, rank, line, number)
        return
    if "monitoredBarrier" in line:
        _monitored_barrier(text, line, number)
        return
    if "Detected mismatch between collectives" in line:
        _fingerprint_mismatch(text, line, number)  # and on: it may end a rank's traceback
    elif "Running collective: CollectiveFingerPrint(" in line:
        _running_collective(text, rank, line, number)
        return
    if "collective #" in line and (desync := _NOT_JOINED.search(line) or _NOT_FINISHED.search(line)):
        ranks = tuple(int(r) for r in re.findall(r"\d+", desync.group(1)))
        joined = desync.re is _NOT_FINISHED
        seq = int(desync.group(2) if joined else desync.group(3))
        text.found.desync.append(DesyncVerdict(ranks, seq, joined, Source(str(text.path), number)))
        text.found.world_size = max(text.found.world_size, max(ranks) + 1)
        text.kinds.add("NCCL's desync report")
        return
    if ("] started " in line or "] finished " in line) and _desync_snapshot(text, line):
        return
    if (text.elastic_section is not None or line.startswith(("Root Cause", "Failures:"))) and _elastic_line(
        text, line, number
    ):
        return
    if stream is None:
        stream = text.streams[rank] = _Stream()
    if (
        stream.stack is not None
        or (stream.traceback is None and excerpt_frame(line))
        or (
            line.startswith(
                (
                    "Thread ",
                    "Current thread ",
                    "Process ",
                    "Traceback (most recent call first)",
                    "Traceback for thread ",
                    "-",
                    "#0 ",
                )
            )
            and (is_stack_line(line) or PROCESS.match(line))
        )
    ):
        if stream.stack is None:
            stream.stack, stream.stack_line = StackReader(pid=text.header_pid), number
        if stream.stack.feed(line):
            return
        _close_stack(text, rank)
        if PROCESS.match(line):  # the next dump of a process, right after the last
            stream.stack, stream.stack_line = StackReader(pid=text.header_pid), number
            stream.stack.feed(line)
            return
    if line.startswith("Traceback (most recent call last):"):
        stream.traceback, stream.traceback_line, stream.traceback_headed = [], number, True
        return
    if stream.traceback is None and _TRACEBACK_FRAME.match(line):
        # the rest of a traceback whose header the excerpt cut, or a stack cut from a
        # pystack or py-bt dump: the line after its frames tells which
        stream.traceback, stream.traceback_line, stream.traceback_headed = [], number, False
    if stream.traceback is not None:
        if frame := _TRACEBACK_FRAME.match(line):
            stream.traceback.append((frame.group(1), int(frame.group(2)), frame.group(3).strip()))
        elif line and not line[0].isspace():
            if stream.wrapped is None and _WRAPPED_ERROR.search(line):
                stream.wrapped = line  # the worker's traceback follows
            elif stream.wrapped is not None and stream.original_from is None:
                if line.startswith("Original Traceback"):
                    stream.original_from = len(stream.traceback)
                else:  # none followed: the wrapper's line is all there is of the error
                    _ending_from_traceback(text, rank, stream, stream.wrapped)
            elif stream.traceback_headed or _EXCEPTION_LINE.match(line):
                _ending_from_traceback(text, rank, stream, line)
            else:
                _stack_from_cut_traceback(text, rank, stream)


# gloo: "[enforce fail at .../pair.cc:456] op.preamble.length <= op.nbytes. 1480 vs 4" (newer
# gloo adds "Received data size doesn't match expected size"): the peer sent 1480 bytes to a
# receive of 4
_GLOO_SIZES = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")
# NCCL's IB transport: "collective mismatch error, local size 496640 remote size 65536"
_NET_SIZES = re.compile(r"collective mismatch error, local size (\d+) remote size (\d+)")
# NCCL (2.4-2.7): "Mismatched collective detected, please check your collective calls at and
# around rank 39"
_AROUND_RANK = re.compile(r"Mismatched collective detected.*?around rank (\d+)")


# the job's own word that a rank left out a step: "skipping batch 12", "dropped a batch",
# "ignoring sample 7 (...)", "skip this step: loss is nan"
_SKIPPED_STEP = re.compile(
    r"\b(?:skip(?:s|ping|ped)?|drop(?:s|ping|ped)?|ignor(?:e|es|ing|ed))\b\W{0,3}(?:\w+\W{1,3}){0,3}?"
    r"(?:batch|step|sample|iteration|record|example)s?\b",
    re.IGNORECASE,
)
# a loss scaler's overflow skip (DeepSpeed's "OVERFLOW! Rank 0 Skipping step", apex's
# "Gradient overflow.  Skipping step"): agreed on every rank, printed by one
_AGREED_SKIP = re.compile(r"overflow|loss scale", re.IGNORECASE)


# the job's own word that a rank stopped training or leaves: an early stop, its data run out,
# its loop done ("EarlyStopping: no improvement for 3 epochs", "stream shard exhausted",
# "done, exiting with status 0", "training finished"); never an exit code printed as a value
_STOPPED = re.compile(
    r"early[ _-]?stop|\bstop(?:s|ping|ped)?\s+(?:the\s+)?(?:training|run|early|here)\b"
    # "(Press CTRL+C to quit)": how to stop a server, not a stop
    r"|(?<![-_./=])(?<!to )\bexit(?:s|ing|ed)?\b(?![-_=(]|\.\w|\s*(?:code|status\s*[1-9]))"
    r"|(?<!to )\bquit(?:s|ting)?\b"
    r"|\bno more (?:data|batches|samples)\b|\b(?:exhausted|ran out)\b"
    r"|\b(?:training|run)\s+(?:is\s+)?(?:finished|done|complete[d]?|over|ended)\b|\bfinish(?:ed|ing)\s+training\b"
    r"|\bpatience\b[^.]{0,20}\b(?:exhausted|reached|exceeded|ran out)\b|\bno improvement\b"
    # "no data shards for this rank, nothing to do -> returning", "returning early"
    r"|\bnothing (?:left )?to do\b|\b(?:return|leav)(?:s|ing)\s+early\b|->\s*(?:returning|leaving)\b",
    re.IGNORECASE,
)
_MAY_SAY_STOPPED = (
    "top",
    "othing",
    "early",
    "-> ",
    "xit",
    "xhaust",
    "ran out",
    "inish",
    "atience",
    "mprovement",
    "uit",
    "no more",
    "TOP",
)


# torchelastic's agent stopping the survivors of the first failure it saw
_CLOSING = re.compile(r"Sending process (\d+) closing signal SIG")
# the kernel's OOM killer: "Out of memory: Killed process 118822 (python) total-vm:...",
# "Memory cgroup out of memory: Killed process 4410 (python)"
_OOM_KILLED = re.compile(r"out of memory: Killed process (\d+)\b", re.IGNORECASE)
# DeepSpeed's launcher on each node (pdsh prefixes its host): the node's rank and how many
# processes it starts, then each process it starts with its local rank
_DS_NODE = re.compile(r"^(\S+?): .*\bnnodes=(\d+), num_local_procs=(\d+), node_rank=(\d+)")
_DS_SPAWNED = re.compile(r"^(\S+?): .*\bprocess (\d+) spawned with command: .*--local_rank[= ,']+(\d+)")
# srun's word on how its tasks (under srun, a task's number is its rank) ended:
# "srun: error: node-01: task 2: Out Of Memory", "...: tasks 1,3,5-7: Aborted (core dumped)"
_SRUN_TASKS = re.compile(r"srun: error: \S+: tasks? ([\d,\-]+): (.+?)\s*$")
_SRUN_ENDINGS: tuple[tuple[str, int | None, str | None], ...] = (
    # (srun's words, the exit code they mean, the error they say), first match wins
    ("Out Of Memory", -9, "Out Of Memory (killed by the OOM killer)"),
    ("Killed", -9, None),
    ("Aborted", -6, None),
    ("Segmentation fault", -11, None),
    ("Terminated", -15, None),
    ("Bus error", -7, None),
)
# a rank's own count of its loop's batches: "eval shard: 1249 samples -> 79 batches",
# "val loader has 78 eval batches", "batches=126"; not a batch's index ("epoch 3 batch 12",
# "batch=12") nor its size
_BATCH_COUNT = re.compile(r"\b(\d+)\s+(?:\w+\s+)?batches\b(?!\s*[=:])|\b(?:num_|n_)?batches\s*[=:]\s*(\d+)\b")


# a rank's tag inside a logger's prefix: "INFO:trainer.loop:[rank3] step 8400 ..."
_RANK_TAG = re.compile(r"\[(?:rank|Rank|RANK)[ =:]?(\d+)\]")
_SHORT_RANK_TAG = re.compile(r"\[r(\d{1,5})\] ")
_RANK_LINE_KINDS = 2000  # distinct texts kept: a log's calls, not its values
_RANK_LINE_LAST = 64  # of each, the last: enough for every rank's copy of two of its calls
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _named_rank(line: str) -> int | None:
    """The rank a line's own text names ("rank 2: ..."), if it names one."""
    named = RANK_IN_TEXT.search(line)
    return int(named.group(1)) if named else None


def _rank_line(text: _TextFile, rank: int, line: str, number: int) -> None:
    kinds = text.found.rank_lines
    key = _NUMBER.sub("N", line.strip())[:200]
    kept = kinds.get(key)
    if kept is None:
        if len(kinds) >= _RANK_LINE_KINDS:
            return
        kept = kinds[key] = []
    kept.append(OwnOutput(line.strip()[:200], Source(str(text.path), number), rank))
    if len(kept) > _RANK_LINE_LAST:
        del kept[0]


# a line of the script pasted beside the logs, not one it printed: the call that prints, an
# f-string, a placeholder no format filled ("print(f\"[rank {rank}] early stopping\")")
_SOURCE_CODE = re.compile(
    r"\b(?:print|logger\.\w+|logging\.\w+|log|write)\(\s*f?[\"']|\bf[\"'][^\"']*\{"
    r"|\{[A-Za-z_][\w.]*(?:\[[^\]]*\])?(?:[!:][^{}]*)?\}"
)


# a failure said in the same line: an exit with an error is a crash, not a loop left
_FAILED_EXIT = re.compile(
    r"exit ?code\s*[:=]?\s*-?[1-9]|status\s*[:=]?\s*[1-9]|error|signal|killed|abort", re.I
)


def _stop_line(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    if not _FAILED_EXIT.search(line):
        text.found.stop_lines.append(_of_a_rank(text, rank, line, number))


def _skip_line(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    if not _AGREED_SKIP.search(line):
        text.found.skip_lines.append(_of_a_rank(text, rank, line, number))


def _of_a_rank(text: _TextFile, rank: int | None, line: str, number: int, keep: int = 200) -> OwnOutput:
    """A line of the job's own (its first ``keep`` characters), with its rank: its prefix's,
    else the one its text names."""
    return OwnOutput(
        line.strip()[:keep], Source(str(text.path), number), rank if rank is not None else _named_rank(line)
    )


def _size_mismatch(text: _TextFile, rank: int | None, line: str, number: int) -> bool:
    source = Source(str(text.path), number)
    if gloo := _GLOO_SIZES.search(line):
        found = SizeMismatch(rank, int(gloo.group(2)), int(gloo.group(1)), None, "gloo's size check", source)
    elif net := _NET_SIZES.search(line):
        found = SizeMismatch(
            rank, int(net.group(1)), int(net.group(2)), None, "NCCL's network transport", source
        )
    elif around := _AROUND_RANK.search(line):
        found = SizeMismatch(rank, None, None, int(around.group(1)), "NCCL's collective check", source)
    else:
        return False
    text.found.size_mismatches.append(found)
    text.kinds.add("a transport's report of mismatched collectives")
    return True


def _nccl_line(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    said = _RANK_SAID.search(line)
    group_match = _GROUP.search(line)
    group = group_match.group(1) if group_match else _NO_GROUP
    if said is not None:
        text.said_ranks.add(int(said.group(1)))
        if rank is not None and int(said.group(1)) != rank and group == _NO_GROUP:
            # "[rank43]:... [Rank 5] Watchdog caught ...": the line's rank is the process's rank
            # in the group of the work, not its global one, so the work is on a group other
            # than the default, which the line does not name: its numbers are that group's,
            # to compare with no other rank's (a data-parallel group's #329521 is no position
            # of a tensor-parallel group's #2471110)
            group = f"{_UNNAMED_SUBGROUP} {int(said.group(1))} in it, of rank {rank})"
        rank = int(said.group(1)) if rank is None else rank
    source = Source(str(text.path), number)
    text.kinds.add("NCCL watchdog lines")
    if work := _WORK.search(line) or _WORK_CUT.search(line) or _WORK_UNNUMBERED.search(line):
        numel_in: int | None = None
        numel_out: int | None = None
        if work.re is _WORK and work.group(3):
            numel_in, numel_out = int(work.group(3)), int(work.group(4))
        elif shape := _TENSOR_SHAPE.search(line):
            numel_in = math.prod(int(n) for n in shape.group(1).replace(" ", "").split(",") if n)
        timed_out = TimedOutWork(
            group,
            None if work.re is _WORK_UNNUMBERED else int(work.group(1)),
            work.group(1) if work.re is _WORK_UNNUMBERED else work.group(2) if work.re is _WORK else "",
            numel_in,
            numel_out,
            source,
            int(limit.group(1)) if (limit := _WORK_TIMEOUT.search(line)) else None,
        )
        if not text.timed_out and text.own_output:
            # what the job printed last before its first timeout: the phase a process not
            # waiting in the collective was in ("Clustering 111M points", "Saving checkpoint")
            text.found.output_before = [
                OwnOutput(said.strip()[:200], Source(str(text.path), at), whose)
                for said, at, whose in text.own_output
            ]
        text.timed_out = True
        _own(text, rank, "timeout", timed_out, number)
    if progress := _PROGRESS.search(line):
        _own(
            text,
            rank,
            "progress",
            Progress(
                group,
                int(progress.group(1)) if progress.group(1) else None,
                # -1: none yet (a group's works are numbered from 1): as 0, "up to #0"
                max(int(progress.group(2)), 0),
                max(int(progress.group(3)), 0),
                source,
            ),
            number,
        )


# a transport that failed, or NCCL reporting an error of its own rather than a timeout: the
# reading "the transport failed during the collective" needs one of these to stand on
_TRANSPORT_ERROR = re.compile(
    r"ncclRemoteError|ncclSystemError|ncclInternalError|remote process exited or there was a network error"
    r"|NET/(?:IB|Socket|OFI)\b.*\b(?:[Ee]rror|failed)"
    r"|Connection reset by peer|Connection closed by (?:remote )?peer"
)


# tqdm's bar: "desc:  9%|███▊      | 280000/2969526 [29:55<4:48:08, 155.57 examples/s]"
_BAR = re.compile(
    # a logger's tags before the description ("[rank0] eval:  98%|...") are not its words
    r"(?:^|\r)\s*(?:\[[^\]\r]{0,40}\]\s*)*(?P<what>[^|\r\[]*?):\s+(?P<pct>\d+)%\|[^|\r]*\|\s*(?P<done>[\d.]+[kMG]?/[\d.]+[kMG]?)"
    r"\s+\[(?P<elapsed>\d+(?::\d+){1,2})<"
)


def _progress_bar(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    """Per description, the longest-running unfinished state of a bar (a terminal's bar
    rewrites itself with carriage returns, and each rank may print its own: a bar that
    starts again at 0% is another one). A bar that reached 100% after it had run as long
    finished that work: it is dropped."""
    bars = text.found.progress_bars
    for bar in _BAR.finditer(line):
        what = bar.group("what").strip()
        if not what:
            continue
        elapsed = 0
        for part in bar.group("elapsed").split(":"):
            elapsed = elapsed * 60 + int(part)
        total = bar.group("done").rsplit("/", 1)[-1]
        if total.isdigit():
            lengths = text.found.loop_lengths
            length = LoopLength(what, int(total), rank, Source(str(text.path), number), what)
            if not any((x.what, x.total, x.rank) == (what, length.total, rank) for x in lengths[-8:]):
                lengths.append(length)
        kept = bars.get(what)
        if int(bar.group("pct")) >= 100:
            if kept is not None and elapsed >= kept.elapsed_s:
                del bars[what]
            continue
        if kept is None or elapsed >= kept.elapsed_s:
            bars[what] = ProgressBar(what, bar.group("done"), elapsed, Source(str(text.path), number), rank)
            text.kinds.add("the job's own progress bars")


# torch 2.2 and later, as a rank's NCCL communicator is created lazily at its first
# collective on a group: the group's first rank publishes the id, the others wait for it
_UNIQUE_ID = re.compile(
    r"\[(\d+)\] is setting up NCCL communicator and retrieving ncclUniqueId from \[(\d+)\]"
    r".*?got error: (.*)$"
)


_STUCK_FOR = re.compile(r"watchdog got stuck for (\d+) seconds")


def _watchdog_stuck(text: _TextFile, rank: int | None, line: str, number: int) -> None:
    """The heartbeat monitor's message: this rank's watchdog thread was blocked (torch 2.2+:
    "Heartbeat monitor timed out!", "ProcessGroupNCCL's watchdog got stuck for N seconds")."""
    said = _RANK_SAID.search(line)
    rank = int(said.group(1)) if rank is None and said is not None else rank
    text.kinds.add("the heartbeat monitor's messages")
    stuck = _STUCK_FOR.search(line)
    _own(
        text,
        rank,
        "watchdog-stuck",
        (int(stuck.group(1)) if stuck else 0, Source(str(text.path), number)),
        number,
    )


def _own(text: _TextFile, rank: int | None, kind: str, value: Any, number: int) -> None:
    if rank is None:
        text.unowned.append((kind, value, number))
        return
    record = text.found.rank(rank)
    if kind == "timeout":
        # one timeout, said again ("terminate called ... what(): [Rank 1] Watchdog caught ..."):
        # kept once, the fuller line of the two
        # (lines that number no work: the same op again)
        same = next(
            (
                w
                for w in record.timeouts
                if (w.group, w.seq) == (value.group, value.seq) and (w.seq is not None or w.op == value.op)
            ),
            None,
        )
        if same is None:
            record.timeouts.append(value)
        elif (same.op == "" and value.op) or (same.numel_in is None and value.numel_in is not None):
            record.timeouts[record.timeouts.index(same)] = value
    elif kind == "progress":
        record.progress[value.group] = value
    elif kind == "ending":
        _merge_ending(record, value)
    # the line with the duration says more than "Heartbeat monitor timed out!"
    elif kind == "watchdog-stuck" and (
        record.watchdog_stuck is None or (value[0] and not record.watchdog_stuck[0])
    ):
        record.watchdog_stuck = value


def _elastic_line(text: _TextFile, line: str, number: int) -> bool:
    """torchelastic's failure summary: ``Root Cause (first observed failure):`` and
    ``Failures:`` sections of ``[N]:`` entries with rank, exitcode, host, traceback."""
    stripped = line.strip()
    if stripped.startswith("Root Cause (first observed failure)"):
        _close_elastic(text)
        text.elastic_section = "root"
        text.kinds.add("torchelastic's failure summary")
        return True
    if stripped == "Failures:":
        _close_elastic(text)
        text.elastic_section = "failures"
        text.kinds.add("torchelastic's failure summary")
        return True
    if text.elastic_section is None:
        return False
    if re.match(r"^\[\d+\]:$", stripped):
        _close_elastic(text)
        text.elastic_entry, text.elastic_line = {}, number
        return True
    if text.elastic_entry is not None and (field_match := _ELASTIC_FIELD.match(line)):
        text.elastic_entry[field_match.group(1)] = field_match.group(2).strip()
        return True
    if stripped.startswith("====") or stripped.startswith("----") or not stripped:
        _close_elastic(text)
        if stripped.startswith("===="):
            text.elastic_section = None
        return True
    return text.elastic_entry is not None


def _srun_task_endings(text: _TextFile, tasks: str, said: str, number: int) -> None:
    """Each task srun says ended, with the exit code or error its words mean."""
    code: int | None = None
    error: str | None = None
    exited = re.match(r"Exited with exit code (\d+)", said)
    if exited is not None:
        code = int(exited.group(1))
    else:
        for words, code_said, error_said in _SRUN_ENDINGS:
            if words.lower() in said.lower():
                code, error = code_said, error_said
                break
    if code is None and error is None:
        return
    text.kinds.add("srun's task endings")
    for part in tasks.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            continue
        for rank in range(int(low), int(high or low) + 1):
            ending = Ending(exit_code=code, error=error, source=Source(str(text.path), number))
            _own(text, rank, "ending", ending, number)


def _close_elastic(text: _TextFile) -> None:
    entry, text.elastic_entry = text.elastic_entry, None
    if not entry or "rank" not in entry:
        return
    rank_match = re.match(r"(\d+)", entry["rank"])
    code_match = re.match(r"(-?\d+)(?: \(pid: (\d+)\))?", entry.get("exitcode", ""))
    if rank_match is None:
        return
    traceback = entry.get("traceback", "")
    ending = Ending(
        exit_code=int(code_match.group(1)) if code_match else None,
        pid=int(code_match.group(2)) if code_match and code_match.group(2) else None,
        host=entry.get("host"),
        root_cause=text.elastic_section == "root",
        # "Signal 6 (SIGABRT) received by PID ...": the exit code says it already
        error=None if traceback.startswith(("To enable traceback", "Signal ")) else traceback or None,
        source=Source(str(text.path), text.elastic_line),
    )
    _own(text, int(rank_match.group(1)), "ending", ending, text.elastic_line)


# torch's ExceptionWrapper, re-raising a DataLoader worker's (or a thread's) error in the
# rank: "Caught UnidentifiedImageError in DataLoader worker process 7."; the worker's own
# traceback follows under "Original Traceback (most recent call last):"
_WRAPPED_ERROR = re.compile(r"\bCaught \w+ in (?:DataLoader worker process \d+|[\w ]+)\.\s*$")


def _ending_from_traceback(text: _TextFile, rank: int | None, stream: _Stream, line: str) -> None:
    frames = stream.traceback or []
    original = frames[stream.original_from :] if stream.original_from is not None else []
    stream.wrapped = stream.original_from = None
    if "ChildFailedError" in line:  # torchrun's own, after a rank failed: the summary follows
        stream.traceback = None
        return
    # the worker's error and the line that raised it, where it was re-raised in the rank
    user = [f for f in original or frames if "site-packages" not in f[0] and "/lib/python" not in f[0]]
    innermost = (user or frames)[-1] if frames else None
    ending = Ending(
        error=line.strip()[:300],
        error_site=Frame(innermost[0], int(innermost[1]), innermost[2]) if innermost else None,
        source=Source(str(text.path), stream.traceback_line),
        frames=tuple(Frame(file, int(number_), function) for file, number_, function in frames),
    )
    stream.traceback = None
    text.kinds.add("Python tracebacks")
    _own(text, rank, "ending", ending, stream.traceback_line)


def _stack_from_cut_traceback(text: _TextFile, rank: int | None, stream: _Stream) -> None:
    """Frames `File "x.py", line 3, in f` that no header opened and no exception ends: a
    stack cut from a pystack, py-bt or traceback.print_stack dump, one thread of one
    process. Read as a stack excerpt (StackReader.excerpt), its rank the stream's if any."""
    frames = [Frame(file, line, function) for file, line, function in stream.traceback or []]
    stream.traceback = None
    if frames:
        text.pending_stacks.append((rank, None, StackReader.excerpt(frames), stream.traceback_line))


def _merge_ending(record: RankAftermath, ending: Ending) -> None:
    """A rank's summary entry and its own traceback describe one ending: keep both halves."""
    if record.ending is None:
        record.ending = ending
        return
    mine = record.ending
    mine.exit_code = mine.exit_code if mine.exit_code is not None else ending.exit_code
    mine.pid = mine.pid or ending.pid
    mine.host = mine.host or ending.host
    mine.root_cause = mine.root_cause or ending.root_cause
    if ending.error and (not mine.error or ending.error_site):
        mine.error, mine.error_site = ending.error, ending.error_site or mine.error_site
        mine.frames = ending.frames or mine.frames
    mine.source = mine.source or ending.source


def _close_call(text: _TextFile, rank: int | None, stream: _Stream) -> None:
    """The frames of a failed collective's stack trace, owned by the rank whose lines they
    are, for the last collective its watchdog timed out."""
    frames, stream.call = stream.call or [], None
    if not frames or rank is None:
        return
    record = text.found.rank(rank)
    last = record.timeouts[-1] if record.timeouts else None
    record.calls.append(
        CollectiveCall(
            last.seq if last else None,
            last.group if last else _NO_GROUP,
            tuple(frames),
            Source(str(text.path), stream.call_line),
        )
    )
    text.kinds.add("the stack traces of failed collectives")


def _close_stack(text: _TextFile, rank: int | None) -> None:
    stream = text.streams.get(rank)
    if stream is None:
        return
    if stream.summary is not None:
        text.pending_stacks.append((rank, None, stream.summary, stream.summary_line))
        stream.summary = None
    if stream.stack is not None:
        text.pending_stacks.append((rank, stream.stack.pid, stream.stack, stream.stack_line))
        stream.stack = None


_PROCESS = re.compile(r"([\w.\-]+):(\d+):\d+ \[")


def _process_of(line: str) -> tuple[str, int] | None:
    """The host and pid an NCCL line starts with (``node1:52937:52937 [0] NCCL INFO``)."""
    found = _PROCESS.match(line)
    return (found.group(1), int(found.group(2))) if found else None


def _launches(text: _TextFile) -> None:
    """Each rank's last launches on the communicator of every rank, from NCCL's COLL trace."""
    by_rank = text.coll.by_rank(text.prefixed_processes)
    for rank, launches in by_rank.items():
        text.found.rank(rank).issued[NCCL_COLL] = list(launches)
    if by_rank:
        text.kinds.add("NCCL's COLL trace")
    unknown = text.coll.of_no_known_rank(by_rank)
    if unknown:
        text.found.unplaced_issued.update(unknown)
        text.kinds.add("NCCL's COLL trace (processes of no known rank: no communicator init lines)")
    # the communicators' sizes, from their init lines ("rank 3 nranks 16") or launches: the
    # largest is the job's, stated, whether or not a collective was traced
    text.found.world_said = max(text.found.world_said, text.coll.world)


def _ras_counts(text: _TextFile) -> None:
    """Each rank's launch count where NCCL's RAS report places it."""
    placed, size = text.ras.by_rank()
    for rank, issued in placed.items():
        text.found.rank(rank).issued[NCCL_RAS] = [issued]
    if size and not placed:
        text.found.skipped.append(
            f"{text.path}: NCCL's RAS report counts launches that differ on a communicator of {size} "
            "ranks, but the ranks it lists are not one count's group: no rank is placed"
        )
    elif size:
        text.kinds.add("NCCL's RAS report")
        text.found.world_said = max(text.found.world_said, size)
        text.found.world_size = max(text.found.world_size, size)


def _finish(text: _TextFile) -> None:
    _launches(text)
    for host, started, local_rank in text.launched:
        if host in text.launcher_nodes:
            node_rank, per_node = text.launcher_nodes[host]
            text.found.launched[started] = node_rank * per_node + local_rank
    _ras_counts(text)
    for rank, stream in list(text.streams.items()):
        _close_stack(text, rank)
        if stream.traceback is not None and not stream.traceback_headed:
            _stack_from_cut_traceback(text, rank, stream)
        if stream.call is not None:
            _close_call(text, rank, stream)
    _close_elastic(text)
    # an unprefixed file that names one rank throughout is that rank's
    only = next(iter(text.said_ranks)) if len(text.said_ranks) == 1 else _rank_from_name(text.path)
    for kind, value, number in text.unowned:
        if only is None:
            what = {
                "timeout": "watchdog line",
                "progress": "watchdog line",
                "ending": "traceback",
                "watchdog-stuck": "heartbeat monitor's line",
            }[kind]
            text.found.skipped.append(f"{text.path}:{number}: a {what} of no known rank")
            if kind == "ending":
                text.found.unplaced_endings.append(value)
            continue
        _own(text, only, kind, value, number)
    for rank, pid, reader, number in text.pending_stacks:
        if isinstance(reader, StackReader):
            reader.beside = str(text.path.parent)
        stack = reader.stack()
        if stack is None:
            continue
        owner = rank if rank is not None else _rank_of_pid(text.found, pid) if pid else None
        if owner is None:
            owner = only
        kind = "stack summaries (a line per thread)" if isinstance(reader, SummaryReader) else "stack dumps"
        if owner is None:
            label = text.path.name + (f" (pid {stack.pid})" if stack.pid else "")
            text.found.unplaced.append(UnplacedStack(label, stack, Source(str(text.path), number)))
            text.kinds.add(f"{kind} of no known rank")
            continue
        record = text.found.rank(owner)
        if record.stack is not None and record.stack_source is not None:
            record.earlier_stack = (record.stack, record.stack_source)
        record.stack, record.stack_source = stack, Source(str(text.path), number)
        text.kinds.add(kind)
    if text.kinds:
        text.found.read.append(f"{text.path}: {', '.join(sorted(text.kinds))}")
    else:
        text.found.skipped.append(f"{text.path}: of no kind doctor reads (no rank's log, stack or summary)")


# a line that ties a process to its rank, as people write it beside their dumps: "rank 0
# pid 140219", "pid=4410 (rank 2)", "140219 -> GPU0 (rank 0)"; read per comma-separated part
_PID_AND_RANK = (
    re.compile(r"\bpid[ =:#]*(?P<pid>\d{2,8})\b.{0,40}?\brank[ =:#]*(?P<rank>\d{1,5})\b", re.I),
    re.compile(r"\brank[ =:#]*(?P<rank>\d{1,5})\b.{0,40}?\bpid[ =:#]*(?P<pid>\d{2,8})\b", re.I),
    re.compile(r"\b(?P<pid>\d{3,8})\s*(?:->|→|=>)\s*.{0,30}?\brank[ =:#]*(?P<rank>\d{1,5})\b", re.I),
)


def _pids_of_ranks(text: _TextFile, line: str) -> None:
    for part in re.split(r"[,;]", line):
        tied = next((m for pattern in _PID_AND_RANK if (m := pattern.search(part))), None)
        if tied is not None:
            record = text.found.rank(int(tied.group("rank")))
            record.pid = record.pid or int(tied.group("pid"))


def _rank_of_pid(found: Aftermath, pid: int) -> int | None:
    for record in found.ranks.values():
        if record.pid == pid or (record.ending is not None and record.ending.pid == pid):
            return record.rank
    return found.launched.get(pid)


def _place_oom_kills(found: Aftermath) -> None:
    """A process the kernel's OOM killer took whose pid the files tie to a rank: that rank's
    ending (SIGKILL), unless the files give it another of its own."""
    for pid, source in found.oom_killed.items():
        rank = _rank_of_pid(found, pid)
        if rank is None:
            continue
        record = found.rank(rank)
        if record.ending is None or record.ending.exit_code in (None, -9, -15):
            record.ending = Ending(
                exit_code=-9,
                pid=pid,
                error=f"killed by the kernel's OOM killer (Out of memory: Killed process {pid})",
                source=source,
            )
