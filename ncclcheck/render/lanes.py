"""The per-rank lanes an HTML report draws: each rank's collectives in order, the first
divergence marked across them. A window around the divergence (or the end of the
run), so a dry run of 100,000 calls still gives a page people can read; in a large
world, ranks whose lanes are alike share one ("ranks 1-255"), so a 1,024-rank page
shows the few that differ."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field

from ncclcheck.evidence.traces import RankTrace, divergences_of
from ncclcheck.frames import shown_path
from ncclcheck.model import CollectiveCall, format_ranks


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


# more ranks than this: ranks alike share one row of the console table, one lane of the page
GROUP_ABOVE = 16


@dataclass
class Lane:
    rank: int
    host: str
    total: int  # calls this rank made in all
    calls: list[LaneCall] = field(default_factory=list)
    note: str = ""  # what this rank did at the divergence, when it made no call there
    ranks: list[int] = field(default_factory=list)  # the ranks it stands for: [rank] unless grouped

    @property
    def label(self) -> str:
        shared = self.ranks or [self.rank]
        return f"rank {shared[0]}" if len(shared) == 1 else f"ranks {format_ranks(shared)}"


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
        lane.ranks = [rank]
        lanes.append(lane)
    if len(lanes) > GROUP_ABOVE:
        lanes = _alike_together(lanes)
    divergence = f"group {first.group}, call #{first.seq + 1} of the group" if first is not None else ""
    window = (
        f"up to {before} calls before the first divergence and {after} after, per rank"
        if first is not None
        else f"the last {before} calls of each rank"
    )
    return Lanes(lanes, divergence, window)


def _alike_together(lanes: list[Lane]) -> list[Lane]:
    """One lane for the ranks whose lanes show the same calls (and the same note), in
    the order of their lowest rank: the divergent ranks stand out on their own."""
    shared: dict[tuple[object, ...], Lane] = {}
    for lane in lanes:
        key = (lane.total, lane.note, tuple(astuple(call) for call in lane.calls))
        if key in shared:
            shared[key].ranks.append(lane.rank)
        else:
            shared[key] = lane
    return list(shared.values())
