"""How findings put things into words: ranks, sites, ops, shapes, exits. Shared by every
rule and both commands, so the same thing is always said the same way."""

from __future__ import annotations

import os

from ncclcheck.communicates import OP_ADVICE, OP_ORIGINS, issuer_of
from ncclcheck.model import CollectiveCall, format_ranks


def relative(path: str, cwd: str) -> str:
    """A path as docs/contract.md shows sites: relative to cwd when below it, else absolute."""
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def issued_by(call: CollectiveCall) -> tuple[str, str] | None:
    if not call.issuer:
        return None
    module, _, qualname = call.issuer.partition(":")
    return issuer_of(module, qualname)


def op_text(call: CollectiveCall) -> str:
    """The op as a finding names it: one the user never wrote says what issued it (DDP's
    internal broadcast, a SyncBatchNorm layer)."""
    issued = issued_by(call)
    origin = issued[0] if issued else OP_ORIGINS.get(call.op)
    return f"{call.op} ({origin})" if origin else call.op


def issuer_advice(call: CollectiveCall | None) -> list[str]:
    """What to do about a collective that library code issued (or an op whose contract
    surprises, such as new_group), for a finding's evidence."""
    if call is None:
        return []
    issued = issued_by(call)
    if issued:
        return [issued[1]] if issued[1] else []
    return [OP_ADVICE[call.op]] if call.op in OP_ADVICE else []


def line_ranges(spans: list[tuple[int, int]]) -> str:
    """ "line 83" / "lines 83-85, 90": statements' line spans, merged where they touch."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    texts = [f"{a}-{b}" if b > a else str(a) for a, b in merged]
    single = len(merged) == 1 and merged[0][0] == merged[0][1]
    return ("line " if single else "lines ") + ", ".join(texts)


def who(ranks: list[int]) -> str:
    """'rank 0' or 'ranks 1-3': how a sentence names ranks."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def its(ranks: list[int]) -> str:
    """The possessive that goes with ``who(ranks)``."""
    return "its" if len(ranks) == 1 else "their"


def shapes_text(shapes: list[list[int]]) -> str:
    """[[8], [8], [8]] -> '[8] x3'; [[2], [4, 4]] -> '[2], [4, 4]'."""
    if not shapes:
        return ""
    texts = ["[" + ", ".join(map(str, shape)) + "]" for shape in shapes]
    if len(set(texts)) == 1 and len(texts) > 1:
        return f"{texts[0]} x{len(texts)}"
    return ", ".join(texts)


def collapse(lines: list[str]) -> list[str]:
    """'rank 1: X', 'rank 2: X' -> 'ranks 1-2: X'."""
    groups: dict[str, list[int]] = {}
    for line in lines:
        head, _, text = line.partition(": ")
        rank = int(head.split()[-1])
        groups.setdefault(text, []).append(rank)
    return [f"rank{'s' if len(r) > 1 else ''} {format_ranks(r)}: {text}" for text, r in groups.items()]


def signal_name(code: int | None) -> str | None:
    import signal

    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def is_user(path: str) -> bool:
    from ncclcheck.frames import is_user_file

    return is_user_file(path)


def first_line(text: str, limit: int) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
