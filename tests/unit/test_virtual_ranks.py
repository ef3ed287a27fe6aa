"""Which ranks of a virtual world run by default (launch/virtual.chosen_ranks), from
what rank 0's trace tells (reference_of): pure analysis."""

from __future__ import annotations

import json
from pathlib import Path

from ncclcheck.launch.virtual import VirtualLayout, chosen_ranks, reference_of

LAYOUT = VirtualLayout(world_size=64, per_node=8)


def test_the_layout_alone_gives_rank_0_the_last_rank_and_the_nodes_ends() -> None:
    assert sorted(chosen_ranks(LAYOUT, [], [])) == [0, 7, 8, 15, 56, 63]


def test_a_group_rank_0_called_on_adds_its_second_and_last_member_and_the_first_outside() -> None:
    leaders = tuple(range(0, 64, 4))
    chosen = chosen_ranks(LAYOUT, [], [], [leaders, tuple(range(64))])  # the world adds nothing
    assert sorted(chosen) == [0, 1, 4, 7, 8, 15, 56, 60, 63]
    assert chosen[4] == "the second member of the group of ranks 0,4,...,60"
    assert chosen[1] == "the first rank outside the group of ranks 0,4,...,60"
    assert chosen[60] == "the last member of the group of ranks 0,4,...,60"


def test_rank_0s_trace_gives_its_eval_sets_and_subgroups_in_the_order_it_used_them(tmp_path: Path) -> None:
    def site(ranks: list[int]) -> str:  # a call site's line: its group is named there, once
        return json.dumps(
            {"t": "site", "id": 1, "op": "all_reduce", "group_ranks": ranks}, separators=(",", ":")
        )

    lines = [
        json.dumps({"t": "hello", "rank": 0}),
        site(list(range(8))),
        site([0, 4]),
        json.dumps({"t": "pass", "role": "eval", "dataset_len": 40}, separators=(",", ":")),
        site([0, 2]),
        site([0, 4]),
    ]
    (tmp_path / "rank-00000.jsonl").write_text("\n".join(lines) + "\n")
    reference = reference_of(tmp_path)
    assert reference.dataset_sizes == [40]
    assert reference.subgroups == [tuple(range(8)), (0, 4), (0, 2)]
    assert reference_of(tmp_path / "missing").subgroups == []
