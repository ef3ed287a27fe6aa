"""The text torch's Flight Recorder analyser prints (``python -m
torch.distributed.flight_recorder.fr_trace DIR``, ``torchfrtrace``): its cross-rank
verdict on a collective, one block each. What the block says is the analyser's own
comparison of every rank's dump, read as it is:

    Not all ranks joining collective, sequence number: 31117
    internal record id: 31116
    group info: 0:default_pg
    collective: nccl:all_reduce
    missing ranks: {3, 4, 5, 6, 7}
    input sizes: [[1571911]]
    ...
    expected ranks: {0, 1, 2, 3, 4, 5, 6, 7}
    error msg: Culprit rank 3; Error type: SIZE_OR_SYNTAX_MISMATCH, ...
    collective stack trace:
     all_reduce at .../distributed_c10d.py:2707
    sync_buffers at .../model.py:650

Older versions head a block ``Not all ranks joining collective: sequence number: N``
or ``Collective N at entry M errors``; a pasted excerpt may stop anywhere.

With ``-j`` it prints each rank's entries instead, side by side (tabulate), a column per
rank, one entry per row as the dumps hold them:

     Rank 0                                              Rank 2
     all_reduce(input_sizes=[[8, 64]], state=scheduled)  all_reduce(input_sizes=[[8]], state=scheduled)

``-v`` adds ``collective_seq_id | p2p_seq_id=N`` and more fields to each entry."""

from __future__ import annotations

import ast
import re

from ncclcheck.evidence.aftermath import (
    FR_ENTRIES,
    FR_ROWS,
    MISMATCH,
    MISSING,
    SIZES,
    FrTraceVerdict,
    Issued,
    Source,
)
from ncclcheck.model import Frame

_MISSING = re.compile(r"^Not all ranks joining collective[,:] sequence number: (\d+)")
_ERRORS = re.compile(r"^Collective (?:sequence number: (\d+) has errors|(\d+) at entry \d+ errors)")
_SIZES = re.compile(r"^Input/output mismatch in the collective sequence number: (\d+)")
_FIELD = re.compile(
    r"^(internal record id|group info|collective|missing ranks|input sizes|output sizes|"
    r"world size|expected ranks|collective state|error msg): ?(.*)$"
)
_CULPRIT = re.compile(r"Culprit rank (\d+); (?:Error type: )?(\w+)")
_FRAME = re.compile(r"^\s*(\S+) at (.+):(\d+)\s*$")


_TABLE_HEADER = re.compile(r"^\s*Rank \d+(?:\s+Rank \d+)+\s*$", re.MULTILINE)
_HEADER_RANK = re.compile(r"Rank (\d+)")
# one entry as Op.__str__ prints it: "all_reduce(input_sizes=[[8, 64]], state=scheduled)"
_ENTRY = re.compile(r"\b([a-z_]+)\(([^()]*?\bstate=\w+)\)")
_ENTRY_SIZES = re.compile(r"\binput_sizes=(\[[^=]*?\]\])")
_ENTRY_SEQ = re.compile(r"collective_seq_id(?: \| p2p_seq_id)?=(\d+)")


def looks_like_fr_trace(text: str) -> bool:
    return (
        any(p.search(text) for p in (_MISSING, _ERRORS, _SIZES))
        or ("group info:" in text and "expected ranks:" in text)
        or bool(_TABLE_HEADER.search(text))
    )


def read_entry_table(path: str, text: str) -> tuple[str, dict[int, list[Issued]]]:
    """fr_trace -j's table: each rank's entries in its column, by the entries' sequence
    numbers where printed (FR_ENTRIES), else by row (FR_ROWS: the analyser takes one entry
    of each rank per row). A row a poster elided ("...") is skipped; the table ends at the
    first line with no entry after one that had some."""
    found: dict[int, list[Issued]] = {}
    columns: list[tuple[int, int]] = []  # (start, rank), left to right
    row = 0
    numbered = True
    for number, line in enumerate(text.splitlines(), 1):
        if _TABLE_HEADER.match(line):
            columns = [(m.start(), int(m.group(1))) for m in _HEADER_RANK.finditer(line)]
            row = 0
            continue
        if not columns:
            continue
        entries = list(_ENTRY.finditer(line))
        if not entries:
            if row and line.strip() and not set(line.strip()) <= set(".- "):
                columns = []  # past the table
            continue
        row += 1
        for entry in entries:
            # an entry sits under its rank's header (tabulate aligns cells left)
            rank = next((r for start, r in reversed(columns) if start <= entry.start() + 2), columns[0][1])
            body = entry.group(2)
            sizes = _ENTRY_SIZES.search(body)
            seq = _ENTRY_SEQ.search(body)
            # its state is no part of the call: one rank's watchdog may see it complete later
            found.setdefault(rank, []).append(
                Issued(
                    int(seq.group(1)) if seq else row,  # FR_ROWS where any entry lacks its number
                    entry.group(1),
                    sizes.group(1) if sizes else "",
                    Source(path, number),
                )
            )
            numbered = numbered and seq is not None
    return (FR_ENTRIES if numbered else FR_ROWS), found


def read_fr_trace(path: str, text: str) -> list[FrTraceVerdict]:
    verdicts: list[FrTraceVerdict] = []
    current: FrTraceVerdict | None = None
    in_stack = False
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = _MISSING.match(stripped) or _ERRORS.match(stripped) or _SIZES.match(stripped)
        if header is not None:
            seq = int(next(g for g in header.groups() if g is not None))
            kind = MISSING if header.re is _MISSING else MISMATCH if header.re is _ERRORS else SIZES
            current = FrTraceVerdict(kind, seq, Source(path, number))
            verdicts.append(current)
            in_stack = False
            continue
        if current is None:
            continue
        if in_stack and (frame := _FRAME.match(line)):
            current.frames.append(Frame(frame.group(2), int(frame.group(3)), frame.group(1)))
            continue
        field_match = _FIELD.match(stripped)
        if stripped.startswith("collective stack trace"):
            in_stack = True
            rest = stripped.split(":", 1)[1] if ":" in stripped else ""
            if frame := _FRAME.match(rest):
                current.frames.append(Frame(frame.group(2), int(frame.group(3)), frame.group(1)))
            continue
        if field_match is None:
            continue
        in_stack = False
        name, value = field_match.groups()
        if name == "group info":
            current.group = value.split(":", 1)[-1] or value
        elif name == "collective":
            current.op = value.rsplit(":", 1)[-1]
        elif name == "missing ranks":
            current.missing = _ranks(value)
        elif name == "expected ranks":
            current.expected = _ranks(value)
        elif name == "world size" and value.strip().isdigit():
            current.world_size = int(value)
        elif name == "input sizes":
            current.input_sizes = value
        elif name == "error msg":
            current.culprits = {int(r): kind for r, kind in _CULPRIT.findall(value)}
    return verdicts


def _ranks(text: str) -> list[int]:
    """``{3, 4, 5}`` as printed; a cut-off set keeps the ranks it shows."""
    try:
        return sorted(int(r) for r in ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError):
        return sorted({int(r) for r in re.findall(r"\d+", text)})
