"""Reading the per-rank trace files a dry run writes (see record/recorder.py).

Lines are read as JSON, never unpickled. A rank killed while writing leaves a
truncated last line, which is expected and skipped; anything else that is not
a trace line is an error naming the file and the line.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ncclcheck.errors import InputError
from ncclcheck.model import CollectiveCall, Deferred, Frame

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
    calls: Sequence[CollectiveCall] = field(default_factory=lambda: CallHistory())
    passes: list[LoaderPass] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    cpu_mapped: list[tuple[str, Frame]] = field(default_factory=list)  # preflight --cpu
    perturbed: list[tuple[str, Frame]] = field(default_factory=list)  # preflight --perturb
    adapted: list[tuple[str, Frame]] = field(default_factory=list)  # framework options the dry run set
    phase: str = "train"
    last_time: float = 0.0
    path: Path | None = None

    @property
    def eval_passes(self) -> list[LoaderPass]:
        return [p for p in self.passes if p.role == "eval"]

    def eval_batches(self) -> int | dict[str, int] | None:
        """Batches drawn from eval loaders: a number, or one per loader when there are several."""
        per_loader: dict[str, int] = {}
        for loader_pass in self.eval_passes:
            per_loader[loader_pass.loader] = per_loader.get(loader_pass.loader, 0) + loader_pass.batches
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


def _call(rank: int, record: dict[str, Any]) -> CollectiveCall:
    stack = [Frame(str(f[0]), int(f[1]), str(f[2])) for f in record.get("stack", [])]
    return CollectiveCall(
        rank=rank,
        seq=int(record["seq"]),
        op=str(record["op"]),
        group=str(record["group"]),
        group_ranks=[int(r) for r in record.get("group_ranks", [])],
        shapes=[list(s) for s in record.get("shapes", [])],
        dtypes=list(record.get("dtypes", [])),
        device=str(record.get("device", "cpu")),
        async_op=bool(record.get("async", False)),
        phase=str(record.get("phase", "train")),
        site=stack[-1] if stack else None,
        user_stack=stack,
        time=float(record.get("time", 0.0)),
        source=str(record.get("src", "python")),
        n=int(record.get("n", 0)),
        position=record.get("pos"),
        peer=record.get("peer"),
        later=_deferred(record.get("later")),
        libraries=[str(name) for name in record.get("libs", [])],
    )


def _deferred(record: dict[str, Any] | None) -> Deferred | None:
    if not record:
        return None
    ran_in = record.get("in")
    frame = Frame(str(ran_in[0]), int(ran_in[1]), str(ran_in[2])) if ran_in else None
    return Deferred(str(record.get("by", "a framework")), str(record.get("for", "?")), frame)


_STATIC_START = ',"op":'  # the recorder writes n, seq, time and pos first, then the static fields


class CallHistory(Sequence[CollectiveCall]):
    """One rank's calls, held compactly: a loop's 100,000 calls share one parsed
    template per call site (stack, shapes, group) and differ in seq, n, time and
    loader position, kept here in arrays: 20 bytes per call. A call is rebuilt
    from its template when it is read, so the analysis, which reads each call once
    or twice, holds a few of them at a time, not the whole history."""

    def __init__(self) -> None:
        self._templates: list[CollectiveCall] = []
        self._positions: list[dict[str, Any] | None] = [None]
        self._template = array("i")
        self._seq = array("i")
        self._n = array("i")
        self._time = array("d")
        self._position = array("i")  # an index into _positions; 0 is none

    def add_template(self, call: CollectiveCall) -> int:
        self._templates.append(call)
        return len(self._templates) - 1

    def add_position(self, position: dict[str, Any]) -> int:
        self._positions.append(position)
        return len(self._positions) - 1

    def add(self, template: int, seq: int, n: int, time: float, position: int = 0) -> None:
        self._template.append(template)
        self._seq.append(seq)
        self._n.append(n)
        self._time.append(time)
        self._position.append(position)

    def append(self, call: CollectiveCall) -> None:
        """A call parsed whole (a line the fast reader did not take): its own template."""
        position = self.add_position(call.position) if call.position else 0
        self.add(self.add_template(call), call.seq, call.n, call.time, position)

    def __len__(self) -> int:
        return len(self._template)

    def _get(self, index: int) -> CollectiveCall:
        return replace(
            self._templates[self._template[index]],
            seq=self._seq[index],
            n=self._n[index],
            time=self._time[index],
            position=self._positions[self._position[index]],
        )

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._get(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("call index out of range")
        return self._get(index)

    def __iter__(self) -> Iterator[CollectiveCall]:
        for index in range(len(self)):
            yield self._get(index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def group_indices(self, skip_ops: frozenset[str]) -> dict[str, array[int]]:
        """group -> the indices of this rank's calls on it, in order (ops in skip_ops left out)."""
        by_template: list[str | None] = [
            None if call.op in skip_ops else call.group for call in self._templates
        ]
        groups: dict[str, array[int]] = {}
        for index, template in enumerate(self._template):
            group = by_template[template]
            if group is not None:
                groups.setdefault(group, array("i")).append(index)
        return groups

    def last_phase_and_time(self) -> tuple[str, float]:
        return self._templates[self._template[-1]].phase, self._time[-1]


class _CallReader:
    """Call lines into a CallHistory, each distinct call site parsed once."""

    def __init__(self, rank: int, history: CallHistory) -> None:
        self.rank = rank
        self._history = history
        self._templates: dict[str, int] = {}
        self._positions: dict[str, int] = {}

    def read(self, line: str) -> None:
        start = line.find(_STATIC_START)
        if start < 0:
            self._history.append(_call(self.rank, json.loads(line)))
            return
        static = line[start:].rstrip()
        template = self._templates.get(static)
        if template is None:
            record = json.loads("{" + static[1:])
            record.update(seq=0, n=0)
            template = self._templates[static] = self._history.add_template(_call(self.rank, record))
        head = line[:start]
        position_at = head.find(',"pos":')
        position = 0
        if position_at >= 0:
            text = head[position_at + 7 :]
            known = self._positions.get(text)
            if known is None:
                known = self._positions[text] = self._history.add_position(json.loads(text))
            position = known
            head = head[:position_at]
        dynamic = json.loads(head + "}")
        self._history.add(
            template, int(dynamic["seq"]), int(dynamic.get("n", 0)), float(dynamic.get("time", 0.0)), position
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
    )


def load_rank_trace(path: Path) -> RankTrace:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return _read_trace(path, handle)
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace file ({exc.strerror})") from None


def _read_trace(path: Path, lines: Iterable[str]) -> RankTrace:
    """One pass over the lines, streamed: the file is never held whole."""
    trace: RankTrace | None = None
    calls: _CallReader | None = None
    history = CallHistory()
    open_passes: dict[int, LoaderPass] = {}
    content = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        content = True
        if trace is not None and calls is not None and line.startswith('{"t":"call"'):
            try:
                calls.read(line)
                trace.phase, last_time = history.last_phase_and_time()
                trace.last_time = max(trace.last_time, last_time)
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
                trace = RankTrace(
                    rank=int(record["rank"]),
                    host=str(record.get("host", "")),
                    pid=record.get("pid"),
                    local_rank=int(record.get("local_rank", 0)),
                    group_rank=int(record.get("group_rank", 0)),
                    world_size=int(record.get("world_size", 0)),
                    script=str(record.get("script", "")),
                    path=path,
                )
                history = CallHistory()
                trace.calls = history
                calls = _CallReader(trace.rank, history)
            elif trace is None:
                raise InputError(f"{path}:{number}: trace does not start with a hello line")
            elif kind == "call":
                history.append(_call(trace.rank, record))
                trace.phase = history.last_phase_and_time()[0]
            elif kind == "init":
                trace.initialised = True
                trace.backend = record.get("backend")
            elif kind == "pass":
                if record.get("event") == "start":
                    open_passes[int(record["pass"])] = loader_pass = _pass(record)
                    trace.passes.append(loader_pass)
                else:
                    ended = open_passes.pop(int(record["pass"]), None)
                    loader_pass = ended if ended is not None else _pass(record)
                    loader_pass.batches = int(record.get("batches", loader_pass.batches))
                    loader_pass.exhausted = bool(record.get("exhausted", False))
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
                trace.exit = record
            elif kind == "destroy":
                trace.destroyed = True
            elif kind == "probe":
                trace.probe = record
            elif kind in ("cpu", "perturb", "framework"):
                file, line, function = record["site"]
                noted = (str(record["kind"]), Frame(str(file), int(line), str(function)))
                {"cpu": trace.cpu_mapped, "perturb": trace.perturbed, "framework": trace.adapted}[
                    kind
                ].append(noted)
        except (KeyError, TypeError, ValueError):
            raise InputError(f"{path}:{number}: malformed {kind!r} trace line") from None
        if trace is not None and isinstance(record.get("time"), (int, float)):
            trace.last_time = max(trace.last_time, float(record["time"]))
    if trace is None:
        if content:
            raise InputError(
                f"{path}: not a trace file (no complete first line)",
                hint="Trace files are written by ncclcheck preflight; is this the right folder?",
            )
        raise InputError(f"{path}: empty trace file (the rank never started its bootstrap)")
    return trace


def load_traces(folder: Path) -> dict[int, RankTrace]:
    """All rank traces below ``folder`` (one file per rank, from one or several nodes)."""
    if not folder.is_dir():
        raise InputError(f"{folder}: no such trace folder")
    traces: dict[int, RankTrace] = {}
    for path in sorted(folder.rglob(TRACE_GLOB)):
        if path.stat().st_size == 0:
            continue
        trace = load_rank_trace(path)
        if trace.rank in traces:
            raise InputError(
                f"{path}: a second trace for rank {trace.rank} (also {traces[trace.rank].path})",
                hint="Give --from one run's traces: each node's --trace-dir, gathered in one folder.",
            )
        traces[trace.rank] = trace
    return traces
