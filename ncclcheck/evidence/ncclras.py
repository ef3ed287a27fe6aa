"""NCCL's RAS report (``ncclras``, NCCL 2.24 and later), its part that counts collective
launches per communicator:

    #0-0 (fa93daea854b060b) MISMATCH
      Communicator ranks have different AllGather operation counts
      30 ranks have launched up to operation 640
      2 ranks have launched up to operation 641
      Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124
      Rank 13 -- GPU 5 managed by process 323033 on node 10.137.190.124

RAS lists the ranks of the smaller count only. They are placed at that count where the
list is exactly that group; with two counts in all, the communicator's other ranks are
at the other one (their number is the other count's). Anything else stays unplaced. A
launch count says what a rank launched, not whether it completed: a hang in which every
rank sits inside the same collective shows no mismatch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ncclcheck.evidence.aftermath import Issued, Source

_BLOCK = re.compile(r"^\s*#\d+-\d+ \((?P<comm>[0-9a-fA-F]+)\)")
_OP = re.compile(r"Communicator ranks have different (?P<op>\w+) operation counts")
_COUNT = re.compile(r"(?P<ranks>\d+) ranks? ha(?:ve|s) launched up to operation (?P<position>\d+)")
_RANK = re.compile(r"^\s*Rank (?P<rank>\d+) -- GPU \d+ managed by process (?P<pid>\d+) on node (?P<node>\S+)")


@dataclass
class _Block:
    comm: str
    op: str = ""
    counts: dict[int, int] = field(default_factory=dict)  # position -> how many ranks
    listed: list[int] = field(default_factory=list)
    source: Source | None = None


@dataclass
class RasReport:
    blocks: list[_Block] = field(default_factory=list)

    @staticmethod
    def may_be(line: str) -> bool:
        return "operation" in line or " -- GPU " in line or ") MISMATCH" in line

    def read(self, line: str, source: Source) -> bool:
        """Take one line; True when it was part of the report's launch counts."""
        if block := _BLOCK.match(line):
            self.blocks.append(_Block(block["comm"], source=source))
            return True
        if not self.blocks:
            return False
        current = self.blocks[-1]
        if op := _OP.search(line):
            current.op = op["op"]
        elif count := _COUNT.search(line):
            current.counts[int(count["position"])] = int(count["ranks"])
        elif rank := _RANK.match(line):
            current.listed.append(int(rank["rank"]))
        else:
            return False
        return True

    def by_rank(self) -> tuple[dict[int, Issued], int]:
        """rank -> the launch count RAS places it at, on the largest communicator that
        disagrees; and that communicator's size (0: none)."""
        blocks = [b for b in self.blocks if b.op and len(b.counts) >= 2 and b.source is not None]
        if not blocks:
            return {}, 0
        block = max(blocks, key=lambda b: sum(b.counts.values()))
        assert block.source is not None
        size = sum(block.counts.values())
        listed_at = [p for p, n in block.counts.items() if n == len(block.listed)]
        if len(listed_at) != 1 or not block.listed:
            return {}, size
        placed = {rank: Issued(listed_at[0], block.op, "", block.source) for rank in block.listed}
        others = [p for p in block.counts if p != listed_at[0]]
        if len(others) == 1:
            for rank in set(range(size)) - set(block.listed):
                placed[rank] = Issued(others[0], block.op, "", block.source)
        return placed, size
