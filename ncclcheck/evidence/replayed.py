"""What a replay of the dry run saw: each rank's lines, values and exceptions in the
functions on the call chains (the files record/lines.py writes), and whether the replay
made the first run's calls (a script that draws unseeded random numbers or reads the
clock may not). explain/lines.py plans the replay and reads what decided from this."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclcheck.evidence.traces import RankTrace, load_rank_trace
from ncclcheck.record.lines import LINES_GLOB
from ncclcheck.record.tracefile import End

Key = tuple[str, int]  # (file, line)


@dataclass
class RankLines:
    """What the tracer saw on one rank (record/lines.py writes it)."""

    rank: int
    how: str  # "stopped" at its call of the divergence, or how the rank ended
    calls: int
    counts: dict[Key, int]
    values: dict[Key, dict[str, dict[str, str]]]  # per line: the first and last snapshot
    exceptions: list[dict[str, Any]]

    def count(self, key: Key) -> int:
        return self.counts.get(key, 0)


@dataclass
class Replay:
    """The replay's outcome: each rank's lines, and whether it made the first run's calls."""

    ranks: dict[int, RankLines] = field(default_factory=dict)
    mismatch: str | None = None  # why the replay cannot be read as the first run, in words
    seconds: float = 0.0

    @property
    def usable(self) -> bool:
        return self.mismatch is None and bool(self.ranks)


def load_replay(folder: Path, first_run: dict[int, RankTrace], stops: dict[int, int]) -> Replay:
    """Each rank's lines, and the check that the replay made the first run's calls: the
    same calls (op, group, seq, site) in the same order up to each rank's stop."""
    replay = Replay()
    for path in sorted(folder.glob(LINES_GLOB)):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        rank = int(raw["rank"])
        replay.ranks[rank] = RankLines(
            rank,
            str(raw.get("how")),
            int(raw.get("calls", 0)),
            {(str(f), int(line)): int(n) for f, line, n in raw.get("counts", [])},
            {(str(f), int(line)): v for f, line, v in raw.get("values", [])},
            list(raw.get("exceptions", [])),
        )
    replay.mismatch = _mismatch(folder, first_run, stops, replay)
    return replay


def _mismatch(
    folder: Path, first_run: dict[int, RankTrace], stops: dict[int, int], replay: Replay
) -> str | None:
    missing = sorted(set(first_run) - set(replay.ranks))
    if missing:
        return (
            f"rank {missing[0]} of the replay wrote no line evidence (it did not get as far as the first run)"
        )
    for rank, first in sorted(first_run.items()):
        path = next(iter(folder.glob(f"rank-{rank:05d}.jsonl")), None)
        if path is None or first.path is None:
            return f"rank {rank} of the replay wrote no trace"
        again = load_rank_trace(path)
        stop = stops.get(rank)
        if stop is not None and (again.exit is None or again.exit.how is not End.REPLAY_STOP):
            return f"rank {rank} did not reach its call #{stop} of the first run"
        before = load_rank_trace(first.path).calls
        expected = before[: stop if stop is not None else len(before)]
        for index, (old, new) in enumerate(zip(expected, again.calls, strict=False)):
            old_key = (old.op, old.group, old.seq, old.site.line if old.site else None)
            new_key = (new.op, new.group, new.seq, new.site.line if new.site else None)
            if old_key != new_key:
                return (
                    f"rank {rank}'s call #{index + 1} was {old.op} at line {old_key[3]} in the first run "
                    f"and {new.op} at line {new_key[3]} in the replay"
                )
        if len(again.calls) != len(expected):
            return (
                f"rank {rank} made {len(again.calls)} calls in the replay, {len(expected)} in the first run"
            )
    return None
