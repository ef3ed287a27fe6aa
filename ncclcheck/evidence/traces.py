"""Reading the per-rank trace files a dry run writes (see record/recorder.py).

Lines are read as JSON, never unpickled. A rank killed while writing leaves a
truncated last line, which is expected and skipped, and a file its rank left open
ends in zero bytes past its data (record/tracefile.py), where reading stops;
anything else that is not a trace line is an error naming the file and the line.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from ncclcheck.errors import InputError
from ncclcheck.evidence.align import Divergence, StreamAligner, divergences
from ncclcheck.model import CollectiveCall, Deferred, Frame
from ncclcheck.record.tracefile import End

TRACE_GLOB = "rank-*.jsonl"


@dataclass
class LoaderPass:
    """One pass over a DataLoader on one rank."""

    loader: str
    index: int
    role: str
    length: int | None
    sampler: str | None
    distributed_sampler: bool
    dataset: str | None
    batches: int = 0
    exhausted: bool | None = None  # None: the pass never ended
    sample_ids: list[int] | None = None
    iterable: bool = False  # an IterableDataset: it shards itself, no sampler can
    batch_sampler: str | None = None  # its batch sampler's class (torch's BatchSampler, or one of its own)

    @property
    def sampled_by_hand(self) -> bool:
        """A map-style dataset read through torch's plain samplers: each rank's share was
        cut by hand (or not at all), where a DistributedSampler would give every rank one
        count. Not a DistributedSampler or a framework's sharding, not a batch sampler of the
        user's own (a token budget), not an IterableDataset."""
        return (
            not self.distributed_sampler
            and not self.iterable
            and self.sampler in ("RandomSampler", "SequentialSampler")
            and self.batch_sampler in (None, "BatchSampler")
        )

    budget_cut: bool = False  # the dry run ended it after --train-steps batches
    # --eval-batches (record/fastforward.py): the leading batches every rank skipped, the
    # length each rank told at the start (None: unknown), why none were skipped
    skipped: int = 0
    read: bool = False  # the skipped batches were read ahead (no length), not skipped
    told: dict[int, int | None] | None = None
    why_not: str | None = None
    # --train-end-batches: a train pass's first ``head`` batches ran, then ``skipped`` were
    # left out, then its last ones ran to the loader's end; ``yields``: the batches its
    # sampler yields, where that is not what len() said (an estimate)
    head: int = 0
    yields: int | None = None
    # the length of the whole set behind its dataset (a Subset's parent's): ranks whose sets
    # have other lengths read sets of their own, whose positions name other samples
    dataset_len: int | None = None

    @property
    def drawn(self) -> int:
        """The batches the loop body got (``batches`` is a position: the skipped count)."""
        if self.head and self.batches <= self.head:
            return self.batches  # stopped within its head: nothing skipped yet
        return self.batches - self.skipped

    @property
    def true_length(self) -> int | None:
        """The batches the pass yields: what its sampler gave where that was counted."""
        return self.yields if self.yields is not None else self.length


@dataclass(frozen=True)
class RootedRead:
    """A rank read a tensor that dist.reduce gave to another rank (record/rooted.py)."""

    how: str  # ".item()", "float()", "a comparison (<)"
    site: Frame  # the user's line that read it
    stack: list[Frame]  # the user's frames there, outermost first (as a call's)
    var: str | None  # the name the tensor had there
    phase: str
    reduce_site: Frame  # the user's line that called dist.reduce
    dst: int


@dataclass(frozen=True)
class RankEnding:
    """How a rank ended, from its trace's exit record."""

    how: End
    code: int
    error: str | None = None  # as written: an exception's ends with " at FILE:LINE in FUNCTION"
    site: Frame | None = None  # the user's line an exception or exit left from
    stack: tuple[Frame, ...] = ()  # where the dry run's budget stopped it, outermost first
    stop: str | None = None  # why the budget stopped the run, in words

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RankEnding:
        site = record.get("site")
        return cls(
            how=End(str(record["how"])),
            code=int(record.get("code", 0)),
            error=str(record["error"]) if record.get("error") else None,
            site=trace_frame(site) if isinstance(site, list) and len(site) == 3 else None,
            stack=tuple(trace_frame(f) for f in record.get("stack") or []),
            stop=str(record["stop"]) if record.get("stop") else None,
        )

    @property
    def message(self) -> str:
        """The error without the " at FILE:LINE in FUNCTION" it ends with (``site``)."""
        error = self.error or ""
        where = self.site
        return error.removesuffix(f" at {where.file}:{where.line} in {where.function}") if where else error


class Decided(NamedTuple):
    """A watched decision took a side on this rank for the first time, or was forced to."""

    site: Frame  # the test's line, in the function that took it
    taken: bool
    forced: bool
    time: float


class Caught(NamedTuple):
    """An except handler of the user's caught an error, the first time it did on this rank."""

    site: Frame  # the except line, in the function that caught it
    error: str  # "IndexError: index 7 is out of bounds ..."
    raised: Frame | None  # where it was raised: the innermost frame in the user's files


@dataclass
class RankTrace:
    rank: int
    host: str = ""
    pid: int | None = None
    local_rank: int = 0
    group_rank: int = 0
    world_size: int = 0
    script: str = ""
    initialised: bool = False
    destroyed: bool = False  # destroy_process_group() was called
    backend: str | None = None
    # how long the job's collectives wait for their peers (init_process_group's timeout)
    timeout_s: float | None = None
    calls: Sequence[CollectiveCall] = field(default_factory=list)
    passes: list[LoaderPass] = field(default_factory=list)
    exit: RankEnding | None = None
    probe: dict[str, Any] | None = None
    cpu_mapped: list[tuple[str, Frame]] = field(default_factory=list)  # preflight --cpu
    perturbed: list[tuple[str, Frame]] = field(default_factory=list)  # preflight --perturb
    adapted: list[tuple[str, Frame]] = field(default_factory=list)  # framework options the dry run set
    # periodic actions that fired, at their if: "fired", or "made to fire" (record/firing.py)
    fired: list[tuple[str, Frame]] = field(default_factory=list)
    # decisions on a rank's own value, each side the first time it was taken (record/firing.py)
    decided: list[Decided] = field(default_factory=list)
    # (file, line) of a watched test -> evaluations n -> (a digest of what it read over its
    # first n, whether a value read was a fraction) (record/firing.py)
    decision_reads: dict[tuple[str, int], dict[int, tuple[str, bool]]] = field(default_factory=dict)
    # the first error each except handler of the user's files caught (record/firing.py)
    caught: list[Caught] = field(default_factory=list)
    rooted_reads: list[RootedRead] = field(default_factory=list)
    phase: str = "train"
    last_time: float = 0.0
    path: Path | None = None
    # Set by load_traces, whose ``calls`` keeps only windows of the history (CallWindow).
    call_count: int | None = None
    phase_counts: dict[str, int] | None = None
    shadow_count: int | None = None

    @property
    def collectives(self) -> int:
        """How many collectives this rank called, whether or not ``calls`` holds them all."""
        return self.call_count if self.call_count is not None else len(self.calls)

    @property
    def join_stand_ins(self) -> int:
        """Collectives this rank made as a stand-in inside DDP's Join (it ran out of batches)."""
        if self.shadow_count is not None:
            return self.shadow_count
        return sum(1 for call in self.calls if call.shadow)

    def calls_per_phase(self) -> dict[str, int]:
        if self.phase_counts is not None:
            return dict(self.phase_counts)
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call.phase] = counts.get(call.phase, 0) + 1
        return counts

    @property
    def eval_passes(self) -> list[LoaderPass]:
        return [p for p in self.passes if p.role == "eval"]

    def eval_batches(self) -> int | dict[str, int] | None:
        """Batches drawn from eval loaders: a number, or one per loader when there are several.

        A pass counts to its position, the loader's own (2,500 after --eval-batches skipped
        2,492 of them), unless the caller left it before its end (a peek at one batch,
        Lightning's sanity check: ended unexhausted, or left open with a later pass over
        the same loader): that one counts the batches it drew, as with every batch run."""
        per_loader: dict[str, int] = {}
        passes = self.eval_passes
        for i, loader_pass in enumerate(passes):
            left = loader_pass.exhausted is False or (
                loader_pass.exhausted is None and any(p.loader == loader_pass.loader for p in passes[i + 1 :])
            )
            count = loader_pass.batches - loader_pass.skipped if left else loader_pass.batches
            per_loader[loader_pass.loader] = per_loader.get(loader_pass.loader, 0) + count
        if not per_loader:
            return None
        if len(per_loader) == 1:
            return next(iter(per_loader.values()))
        return per_loader

    @property
    def position(self) -> dict[str, Any] | None:
        """The loader batch this rank drew last, if its pass is still open."""
        for loader_pass in reversed(self.passes):
            if loader_pass.exhausted is None:
                return {
                    "loader": loader_pass.loader,
                    "pass": loader_pass.index,
                    "batch": loader_pass.batches,
                    "role": loader_pass.role,
                }
        return None


def record_time(record: dict[str, Any]) -> float | None:
    """A record's wall-clock time in seconds: call lines carry integer nanoseconds
    (``ns``: cheaper for the recorder to format than a float), the others ``time``."""
    value = record.get("ns")
    if isinstance(value, int):
        return value / 1e9
    value = record.get("time")
    return float(value) if isinstance(value, (int, float)) else None


def trace_frame(raw: Sequence[Any]) -> Frame:
    """[file, line, function] as the trace writes a place."""
    return Frame(str(raw[0]), int(raw[1]), str(raw[2]))


def _call(rank: int, record: dict[str, Any]) -> CollectiveCall:
    stack = [trace_frame(f) for f in record.get("stack", [])]
    return CollectiveCall(
        rank=rank,
        seq=int(record["seq"]),
        op=str(record["op"]),
        group=str(record["group"]),
        group_ranks=[int(r) for r in record.get("group_ranks", [])],
        shapes=[list(s) for s in record.get("shapes", [])],
        dtypes=list(record.get("dtypes", [])),
        device=str(record.get("device", "")),
        async_op=bool(record.get("async", False)),
        phase=str(record.get("phase", "train")),
        site=stack[-1] if stack else None,
        user_stack=stack,
        time=record_time(record) or 0.0,
        source=str(record.get("src", "python")),
        n=int(record.get("n", 0)),
        position=record.get("pos"),
        peer=record.get("peer"),
        later=_deferred(record.get("later")),
        libraries=[str(name) for name in record.get("libs", [])],
        issuer=str(record["issuer"]) if record.get("issuer") else None,
        shadow=bool(record.get("shadow")),
    )


def _deferred(record: dict[str, Any] | None) -> Deferred | None:
    if not record:
        return None
    ran_in = record.get("in")
    frame = trace_frame(ran_in) if ran_in else None
    return Deferred(str(record.get("by", "a framework")), str(record.get("for", "?")), frame)


# A call line: n, seq, ns and pos, then the id of its site line (",\"site\":3"), whose
# fields (op, group, shapes, stack...) it shares with every call of that site; traces
# of earlier versions carried those fields in each call line, from ",\"op\":" on.
_SITE_REF = ',"site":'
_STATIC_START = ',"op":'


class CallWindow(Sequence[CollectiveCall]):
    """One rank's calls as load_traces keeps them while it reads every rank's file in
    turns: each call goes to the aligner (which keeps it only until every member of
    its group has made its call at that position), the last RECENT calls are held,
    and so are the calls around each divergence the aligner finds (for the lanes).
    Memory does not grow with the length of the run; the sequence is the calls held,
    in order, and RankTrace.call_count the number read."""

    BEFORE = 40
    AFTER = 16
    # what a rank read in its last two turns: its call at a divergence found after a turn
    RECENT = 2 * 64 + BEFORE + AFTER
    MAX_WINDOWS = 8

    def __init__(self, rank: int, aligner: StreamAligner) -> None:
        self.rank = rank
        self._aligner = aligner
        self._recent: deque[CollectiveCall] = deque(maxlen=self.RECENT)
        self._kept: dict[int, CollectiveCall] = {}
        self._keep_until = -1
        self._windows = 0
        self._held: list[CollectiveCall] | None = None
        self.calls_read = 0
        self.phases: dict[str, int] = {}
        self.shadows = 0

    def append(self, call: CollectiveCall) -> None:
        self.calls_read += 1
        self.phases[call.phase] = self.phases.get(call.phase, 0) + 1
        self.shadows += call.shadow
        self._recent.append(call)
        if call.n <= self._keep_until:
            self._kept[call.n] = call
        self._held = None
        self._aligner.add(self.rank, call)

    def keep_around(self, call: CollectiveCall | None) -> None:
        """Hold the calls around ``call`` (this rank's call at a divergence): those already
        read, from the recent ones, and those still to come."""
        if call is None or self._windows >= self.MAX_WINDOWS:
            return
        self._windows += 1
        for recent in self._recent:
            if call.n - self.BEFORE <= recent.n <= call.n + self.AFTER:
                self._kept[recent.n] = recent
        self._keep_until = max(self._keep_until, call.n + self.AFTER)
        self._held = None

    def _calls(self) -> list[CollectiveCall]:
        if self._held is None:
            merged = dict(self._kept)
            merged.update((call.n, call) for call in self._recent)
            self._held = [merged[n] for n in sorted(merged)]
        return self._held

    def __len__(self) -> int:
        return len(self._calls())

    def __getitem__(self, index: Any) -> Any:
        return self._calls()[index]


class Traces(dict[int, RankTrace]):
    """Every rank's trace, and the first divergence of each process group, found while
    the files were read (see CallWindow)."""

    divergences: list[Divergence] | None = None


def eval_calls_without_loader(traces: Mapping[int, RankTrace]) -> int | None:
    """How much evaluation the traces show when no rank iterated an eval loader: the most
    collectives a rank made in eval mode (evaluation from prompts or a fixed batch), 0 for
    no eval phase at all; None where an eval loader was seen."""
    if any(t.eval_passes for t in traces.values()):
        return None
    return max((t.calls_per_phase().get("eval", 0) for t in traces.values()), default=0)


def divergences_of(traces: Mapping[int, RankTrace]) -> list[Divergence]:
    """The first divergence of each group: found while reading (load_traces), or from
    the whole histories (traces built otherwise)."""
    found = getattr(traces, "divergences", None)
    if found is not None:
        return list(found)
    return divergences({rank: trace.calls for rank, trace in traces.items()})


class _CallReader:
    """Call lines, parsed once per distinct call site: a loop's 100,000 calls share one
    parsed template (stack frames, shapes, group ranks) and differ only in n, seq, ns
    and loader position."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._templates: dict[str, CollectiveCall] = {}
        self._positions: dict[str, dict[str, Any]] = {}
        self._sites: dict[int, CollectiveCall] = {}  # site id -> its template

    def add_site(self, record: dict[str, Any]) -> None:
        """A site line: the fields every call naming its id shares."""
        self._sites[int(record["id"])] = _call(self.rank, {**record, "seq": 0, "n": 0})

    def read(self, line: str) -> CollectiveCall:
        start = line.find(_STATIC_START)
        if start >= 0:  # a line that carries its static fields (traces of earlier versions)
            static = line[start:].rstrip()
            template = self._templates.get(static)
            if template is None:
                record = json.loads("{" + static[1:])
                record.update(seq=0, n=0)
                template = self._templates[static] = _call(self.rank, record)
        else:
            start = line.rfind(_SITE_REF)
            if start < 0:
                return _call(self.rank, json.loads(line))
            template = self._sites[int(line[start + len(_SITE_REF) :].rstrip().rstrip("}"))]
        head = line[:start]
        position_at = head.find(',"pos":')
        position = None
        if position_at >= 0:
            text = head[position_at + 7 :]
            position = self._positions.get(text)
            if position is None:
                position = self._positions[text] = json.loads(text)
            head = head[:position_at]
        dynamic = json.loads(head + "}")
        return replace(
            template,
            seq=int(dynamic["seq"]),
            n=int(dynamic.get("n", 0)),
            time=record_time(dynamic) or 0.0,
            position=position,
        )


def _pass(record: dict[str, Any]) -> LoaderPass:
    return LoaderPass(
        loader=str(record["loader"]),
        index=int(record["pass"]),
        role=str(record.get("role", "train")),
        length=record.get("len"),
        sampler=record.get("sampler"),
        distributed_sampler=bool(record.get("distributed_sampler", False)),
        dataset=record.get("dataset"),
        batches=int(record.get("batches", 0)),
        sample_ids=record.get("sample_ids"),
        iterable=bool(record.get("iterable", False)),
        batch_sampler=record.get("batch_sampler"),
        budget_cut=bool(record.get("budget_cut", False)),
        skipped=int(record.get("skipped", 0)),
        read=bool(record.get("read", False)),
        told={int(r): n for r, n in record["told"].items()} if record.get("told") else None,
        why_not=record.get("why_not"),
        head=int(record.get("head", 0)),
        yields=record.get("yields"),
        dataset_len=record.get("dataset_len"),
    )


class EmptyTrace(InputError):
    """A trace file with no record: created, or its pages zero-filled ahead of the writes,
    by a rank stopped before it wrote its first line."""


def load_rank_trace(path: Path) -> RankTrace:
    """One rank's whole trace, every call held (load_traces holds windows of many)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            steps = _read_trace(path, handle, lambda rank: [])
            while True:
                try:
                    next(steps)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace file ({exc.strerror})") from None


def _read_trace(
    path: Path, lines: Iterable[str], make_calls: Callable[[int], list[CollectiveCall] | CallWindow]
) -> Generator[None, None, RankTrace]:
    """One pass over the lines, streamed: the file is never held whole. Yields after
    each call line, so that several ranks' files can be read in turns."""
    trace: RankTrace | None = None
    calls: _CallReader | None = None
    history: list[CollectiveCall] | CallWindow = []
    open_passes: dict[int, LoaderPass] = {}
    content = False
    for number, line in enumerate(lines, 1):
        cut = line.find("\0")
        if cut >= 0 and not line[cut:].strip("\0"):
            # the zero bytes past the records of a file its rank still writes (or was
            # killed while writing): the end of the data
            line = line[:cut]
            if not line:
                break
        if not line.strip():
            continue
        content = True
        if trace is not None and calls is not None and line.startswith('{"t":"call"'):
            try:
                call = calls.read(line)
                history.append(call)
                trace.phase = call.phase
                trace.last_time = max(trace.last_time, call.time)
                yield
                continue
            except (ValueError, KeyError, TypeError):
                pass  # parse it the slow way below, for a precise error
        try:
            record = json.loads(line)
            kind = record["t"]
        except (ValueError, KeyError, TypeError):
            if not line.endswith("\n"):
                break  # the rank died while writing its last line
            raise InputError(
                f"{path}:{number}: not a trace line",
                hint="Trace files are written by ncclcheck preflight; is this the right folder?",
            ) from None
        try:
            if kind == "hello":
                trace = _hello(record, path)
                history = make_calls(trace.rank)
                trace.calls = history
                calls = _CallReader(trace.rank)
            elif trace is None:
                raise InputError(f"{path}:{number}: trace does not start with a hello line")
            elif kind == "site":
                assert calls is not None  # made with the hello line
                calls.add_site(record)
            else:
                _apply(trace, kind, record, history, open_passes)
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}:{number}: malformed {kind!r} trace line") from None
        when = record_time(record)
        if trace is not None and when is not None:
            trace.last_time = max(trace.last_time, when)
    if trace is None:
        if content:
            raise InputError(
                f"{path}: not a trace file (no complete first line)",
                hint="Trace files are written by ncclcheck preflight; is this the right folder?",
            )
        raise EmptyTrace(f"{path}: empty trace file (the rank never started its bootstrap)")
    return trace


def _hello(record: dict[str, Any], path: Path) -> RankTrace:
    return RankTrace(
        rank=int(record["rank"]),
        host=str(record.get("host", "")),
        pid=record.get("pid"),
        local_rank=int(record.get("local_rank", 0)),
        group_rank=int(record.get("group_rank", 0)),
        world_size=int(record.get("world_size", 0)),
        script=str(record.get("script", "")),
        path=path,
    )


def _apply(
    trace: RankTrace,
    kind: str,
    record: dict[str, Any],
    history: list[CollectiveCall] | CallWindow,
    open_passes: dict[int, LoaderPass],
) -> None:
    """One record after the hello line, applied to the rank's trace."""
    if kind == "call":
        history.append(_call(trace.rank, record))
        trace.phase = history[-1].phase
    elif kind == "init":
        trace.initialised = True
        trace.backend = record.get("backend")
        timeout = record.get("timeout_s")
        trace.timeout_s = float(timeout) if isinstance(timeout, (int, float)) else None
    elif kind == "pass":
        if record.get("event") == "start":
            open_passes[int(record["pass"])] = loader_pass = _pass(record)
            trace.passes.append(loader_pass)
        else:
            ended = open_passes.pop(int(record["pass"]), None)
            loader_pass = ended if ended is not None else _pass(record)
            loader_pass.batches = int(record.get("batches", loader_pass.batches))
            loader_pass.exhausted = bool(record.get("exhausted", False))
            loader_pass.budget_cut = bool(record.get("budget_cut", False))
            loader_pass.role = str(record.get("role", loader_pass.role))
    elif kind == "batch":
        current = open_passes.get(int(record["pass"]))
        if current is not None:
            current.batches = int(record["batch"])
            current.role = str(record.get("role", current.role))
        trace.phase = str(record.get("phase", trace.phase))
    elif kind == "phase":
        trace.phase = str(record["phase"])
    elif kind == "exit":
        trace.exit = RankEnding.of(record)
    elif kind == "destroy":
        trace.destroyed = True
    elif kind == "probe":
        trace.probe = record
    elif kind == "rooted_read":
        trace.rooted_reads.append(
            RootedRead(
                how=str(record["how"]),
                site=trace_frame(record["site"]),
                stack=[trace_frame(f) for f in record.get("stack") or []],
                var=record.get("var"),
                phase=str(record.get("phase", "train")),
                reduce_site=trace_frame(record["reduce"]["site"]),
                dst=int(record["reduce"]["dst"]),
            )
        )
    elif kind == "caught":
        raised = record.get("raised")
        trace.caught.append(
            Caught(trace_frame(record["site"]), str(record["error"]), trace_frame(raised) if raised else None)
        )
    elif kind == "decided":
        site = trace_frame(record["site"])
        taken, forced = bool(record["taken"]), bool(record["forced"])
        trace.decided.append(Decided(site, taken, forced, float(record["time"])))
    elif kind == "decision_read":
        file, line = record["site"]
        digests = trace.decision_reads.setdefault((os.path.realpath(str(file)), int(line)), {})
        digests[int(record["n"])] = (str(record["read"]), bool(record["informative"]))
    elif kind in ("cpu", "perturb", "framework", "fired"):
        noted = (str(record["kind"]), trace_frame(record["site"]))
        {
            "cpu": trace.cpu_mapped,
            "perturb": trace.perturbed,
            "framework": trace.adapted,
            "fired": trace.fired,
        }[kind].append(noted)


def load_traces(folder: Path, live: bool = False) -> Traces:
    """All rank traces below ``folder`` (one file per rank, from one or several nodes).

    The files are read in turns, a few hundred calls of each at a time, and the
    calls aligned as they arrive (StreamAligner): what is held is the calls some
    rank has made and another not yet, plus windows of each history (CallWindow),
    so memory stays flat however long the run was.

    ``live``: the ranks may still be running. A rank's history ends at the end of its
    file only if it wrote its exit; ``divergences`` holds only the positions where the
    ranks made different calls, not those some rank has not reached yet.
    """
    if not folder.is_dir():
        raise InputError(f"{folder}: no such trace folder")
    aligner = StreamAligner()
    windows: dict[int, CallWindow] = {}

    def window(rank: int) -> CallWindow:
        windows[rank] = CallWindow(rank, aligner)
        return windows[rank]

    def divergence_found(found: Divergence) -> None:
        for rank, call in found.calls.items():
            if rank in windows:
                windows[rank].keep_around(call)

    aligner.on_divergence = divergence_found
    done_by_path: dict[Path, RankTrace] = {}
    paths = [path for path in sorted(folder.rglob(TRACE_GLOB)) if path.stat().st_size > 0]
    _allow_open_files(len(paths) + 64)
    with contextlib.ExitStack() as files:
        readers: list[tuple[Path, Generator[None, None, RankTrace]]] = []
        for path in paths:
            try:
                handle = files.enter_context(path.open(encoding="utf-8", errors="replace"))
            except OSError as exc:
                raise InputError(f"{path}: cannot read trace file ({exc.strerror})") from None
            readers.append((path, _read_trace(path, handle, window)))
        while readers:
            for path, reader in list(readers):
                try:
                    for _ in range(_CALLS_PER_TURN):
                        next(reader)
                except StopIteration as done:
                    readers.remove((path, reader))
                    done_by_path[path] = done.value
                    if not live or done.value.exit is not None:
                        aligner.rank_done(done.value.rank)
                except EmptyTrace:
                    # a rank stopped before its first record: as a file of no bytes, not read
                    readers.remove((path, reader))
                except OSError as exc:
                    raise InputError(f"{path}: cannot read trace file ({exc.strerror})") from None
            aligner.advance(set(windows))
    traces = Traces()
    for path, trace in sorted(done_by_path.items()):  # in the order of the files, as before
        _add_trace(traces, trace, path)
    for rank, trace in traces.items():
        if rank in windows and trace.calls is windows[rank]:
            trace.call_count = windows[rank].calls_read
            trace.phase_counts = dict(windows[rank].phases)
            trace.shadow_count = windows[rank].shadows
    traces.divergences = aligner.found() if live else aligner.finish(set(traces))
    return traces


def _allow_open_files(needed: int) -> None:
    """Every rank's file is open during the read: raise the soft limit on open files
    (1024 by default) toward the hard one when thousands of ranks need it."""
    try:
        import resource
    except ImportError:  # not on this platform: the default limit applies
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed > soft:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


_CALLS_PER_TURN = 64  # CallWindow.RECENT holds two turns


def _add_trace(traces: Traces, trace: RankTrace, path: Path) -> None:
    if trace.rank in traces:
        raise InputError(
            f"{path}: a second trace for rank {trace.rank} (also {traces[trace.rank].path})",
            hint="Give --from one run's traces: each node's --trace-dir, gathered in one folder.",
        )
    traces[trace.rank] = trace
