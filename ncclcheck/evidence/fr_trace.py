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
or ``Collective N at entry M errors``; a pasted excerpt may stop anywhere."""

from __future__ import annotations

import ast
import re

from ncclcheck.evidence.aftermath import MISMATCH, MISSING, SIZES, FrTraceVerdict, Source
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


def looks_like_fr_trace(text: str) -> bool:
    return any(p.search(text) for p in (_MISSING, _ERRORS, _SIZES)) or (
        "group info:" in text and "expected ranks:" in text
    )


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
