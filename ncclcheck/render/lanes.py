"""The per-rank lanes an HTML report draws: each rank's collectives in order, the first
divergence marked across them. A window around the divergence (or the end of the
run), so a dry run of 100,000 calls still gives a page people can read."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclcheck.model import CollectiveCall
from ncclcheck.record.frames import shown_path
from ncclcheck.record.traces import RankTrace, divergences_of


@dataclass
class LaneCall:
    n: int
    op: str
    group: str
    seq: int
    phase: str
    tensors: str  # "float32[2, 3]"
    site: str  # "train.py:39 in evaluate()"
    divergent: bool = False


@dataclass
class Lane:
    rank: int
    host: str
    total: int  # calls this rank made in all
    calls: list[LaneCall] = field(default_factory=list)
    note: str = ""  # what this rank did at the divergence, when it made no call there


@dataclass
class Lanes:
    lanes: list[Lane]
    divergence: str = ""  # "group 0, call #7 of the group" or ""
    window: str = ""  # which part of the run the lanes show


def _lane_call(call: CollectiveCall, divergent: bool) -> LaneCall:
    shapes = ", ".join("x".join(str(d) for d in shape) or "scalar" for shape in call.shapes)
    dtype = call.dtypes[0] if call.dtypes else ""
    where = f"{shown_path(call.site.file)}:{call.site.line} in {call.site.function}()" if call.site else "?"
    if call.later is not None:
        where += f" (run later by {call.later.by} for {call.later.request})"
    return LaneCall(
        n=call.n,
        op=call.op + (" (DDP bucket)" if call.source == "ddp" else ""),
        group=call.group,
        seq=call.seq,
        phase=call.phase,
        tensors=f"{dtype}[{shapes}]" if shapes else "",
        site=where,
        divergent=divergent,
    )


def build_lanes(traces: dict[int, RankTrace], before: int = 40, after: int = 8) -> Lanes:
    found = divergences_of(traces)
    first = found[0] if found else None
    lanes: list[Lane] = []
    for rank, trace in sorted(traces.items()):
        calls = trace.calls
        marked = first.calls.get(rank) if first is not None else None
        # a rank that never made the divergent call: its lane ends where it stopped
        centre = next((i for i, c in enumerate(calls) if c is marked), len(calls))
        start = max(0, centre - before)
        shown = calls[start : centre + after + 1]
        lane = Lane(rank, trace.host, trace.collectives, [_lane_call(c, c is marked) for c in shown])
        if first is not None and rank in first.members and marked is None:
            lane.note = f"made no call #{first.seq + 1} on group {first.group}"
        lanes.append(lane)
    divergence = f"group {first.group}, call #{first.seq + 1} of the group" if first is not None else ""
    window = (
        f"up to {before} calls before the first divergence and {after} after, per rank"
        if first is not None
        else f"the last {before} calls of each rank"
    )
    return Lanes(lanes, divergence, window)
