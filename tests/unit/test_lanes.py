"""The HTML report's lanes and eval bars in a large world: ranks alike share one lane
(one bar row), the divergent ranks stand on their own, small worlds keep a lane per
rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ncclcheck.evidence.traces import load_traces
from ncclcheck.model import RankState, Report, Verdict
from ncclcheck.render.html import report_html
from ncclcheck.render.lanes import GROUP_ABOVE, build_lanes


def _traces(folder: Path, world: int, odd: dict[int, int]) -> None:
    """``world`` ranks making 5 all_reduces at line 10; rank r in ``odd`` makes its last
    one at line odd[r] instead."""
    for rank in range(world):
        lines = [json.dumps({"t": "hello", "rank": rank, "world_size": world, "pid": rank, "host": "h"})]
        for n in range(1, 6):
            line = odd.get(rank, 10) if n == 5 else 10
            lines.append(
                f'{{"t":"call","n":{n},"seq":{n - 1},"time":{n}.0,"op":"all_reduce","group":"0",'
                f'"group_ranks":{list(range(world))},"shapes":[[4]],"dtypes":["float32"],"device":"cpu",'
                f'"async":false,"phase":"eval","src":"python","stack":[["t.py",{line},"f"]]}}'
            )
        (folder / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")


def test_ranks_alike_share_one_lane_in_a_large_world(tmp_path: Path) -> None:
    _traces(tmp_path, 64, {3: 11, 40: 11})
    lanes = build_lanes(load_traces(tmp_path))
    assert [lane.label for lane in lanes.lanes] == ["ranks 0-2,4-39,41-63", "ranks 3,40"]
    page = report_html(Report("preflight", Verdict.MISALIGNED, 64), lanes)
    labels = re.findall(r'<span class="lane-label">([^<]*)</span>', page)
    assert labels == ["ranks 0-2,4-39,41-63 (5)", "ranks 3,40 (5)"]
    assert 'data-ranks="3,40"' in page


def test_a_small_world_keeps_a_lane_per_rank(tmp_path: Path) -> None:
    _traces(tmp_path, GROUP_ABOVE, {3: 11})
    lanes = build_lanes(load_traces(tmp_path))
    assert [lane.label for lane in lanes.lanes] == [f"rank {r}" for r in range(GROUP_ABOVE)]


def test_eval_bars_of_consecutive_ranks_alike_share_a_row() -> None:
    ranks = [RankState(rank, eval_batches=14 if rank < 16 else 13) for rank in range(48)]
    page = report_html(Report("preflight", Verdict.HANG, 48, ranks=ranks))
    rows = re.findall(r'data-batches="(\d+)"><span class="lane-label">([^<]*)</span>', page)
    assert rows == [("14", "ranks 0-15"), ("13", "ranks 16-47")]
