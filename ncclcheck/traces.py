"""Reading the per-rank trace files a dry run writes (see record/recorder.py).

Lines are read as JSON, never unpickled. A rank killed while writing leaves a
truncated last line, which is expected and skipped; anything else that is not
a trace line is an error naming the file and the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
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
    calls: list[CollectiveCall] = field(default_factory=list)
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


class _CallReader:
    """Call lines, parsed once per distinct call site: a loop's 100,000 calls share one
    parsed template (stack frames, shapes, group ranks) and differ only in n, seq, time
    and loader position, so memory grows by one small object per call."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._templates: dict[str, CollectiveCall] = {}
        self._positions: dict[str, dict[str, Any]] = {}

    def read(self, line: str) -> CollectiveCall:
        start = line.find(_STATIC_START)
        if start < 0:
            return _call(self.rank, json.loads(line))
        static = line[start:].rstrip()
        template = self._templates.get(static)
        if template is None:
            record = json.loads("{" + static[1:])
            record.update(seq=0, n=0)
            template = self._templates[static] = _call(self.rank, record)
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
            time=float(dynamic.get("time", 0.0)),
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
    open_passes: dict[int, LoaderPass] = {}
    content = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        content = True
        if trace is not None and calls is not None and line.startswith('{"t":"call"'):
            try:
                trace.calls.append(calls.read(line))
                trace.phase = trace.calls[-1].phase
                trace.last_time = max(trace.last_time, trace.calls[-1].time)
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
                calls = _CallReader(trace.rank)
            elif trace is None:
                raise InputError(f"{path}:{number}: trace does not start with a hello line")
            elif kind == "call":
                trace.calls.append(_call(trace.rank, record))
                trace.phase = trace.calls[-1].phase
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
