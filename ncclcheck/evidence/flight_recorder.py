"""Extra evidence for doctor from PyTorch's Flight Recorder, where a job has one.

A job that runs with ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
keeps a ring buffer of its collectives; NCCL dumps it on timeout, and a job (or the
torch.distributed debug server) can dump it on demand, to
``<TORCH_FR_DUMP_TEMP_FILE><rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` before
2.6; default ``/tmp/nccl_trace_rank_``). doctor never asks for a dump (that would
change the job) and never needs one: it reads a dump that is there.

Only JSON dumps are read. The default format is a pickle, and unpickling a file
runs whatever code it names: for those, doctor points at PyTorch's own reader
instead (``python -m torch.distributed.flight_recorder.fr_trace``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
_MAX_BYTES = 64 * 1024 * 1024  # a dump of a few thousand entries is a few MB


@dataclass(frozen=True)
class LastCall:
    """A rank's most recent Flight Recorder entry on one process group."""

    group: str
    seq: int  # collective_seq_id: the n-th collective of the group on this rank
    op: str  # profiling_name, e.g. nccl:all_reduce, gloo:barrier
    state: str  # scheduled, started, completed


def dump_path(env: dict[str, str], rank: int) -> str | None:
    """Where this rank's dump would be, if the job has the Flight Recorder on."""
    enabled = any(env.get(var, "0").strip() not in ("", "0") for var in _BUFFER_VARS)
    if not enabled:
        return None
    prefix = next((env[var] for var in _FILE_VARS if env.get(var)), DEFAULT_PREFIX)
    return f"{prefix}{rank}"


def read_dump(path: str) -> dict[str, Any]:
    """A compact summary of one dump: ``{"path", "format", "last": {group: LastCall fields}}``,
    or ``{"path", "format": "pickle"|"unreadable", "note"}``. Missing file: empty dict."""
    try:
        if os.path.getsize(path) > _MAX_BYTES:
            return {"path": path, "format": "unreadable", "note": "larger than 64 MiB"}
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        return {"path": path, "format": "unreadable", "note": exc.strerror or str(exc)}
    if raw[:1] == b"\x80":  # pickle protocol 2+
        return {
            "path": path,
            "format": "pickle",
            "note": "pickled (ncclcheck does not unpickle files); read it with "
            "python -m torch.distributed.flight_recorder.fr_trace",
        }
    try:
        data = json.loads(raw)
        data["entries"]
    except (ValueError, KeyError, TypeError):
        return {"path": path, "format": "unreadable", "note": "neither JSON with entries nor a pickle"}
    return summarize(path, data)


def summarize(path: str, data: dict[str, Any]) -> dict[str, Any]:
    """The summary read_dump gives, of a dump already loaded (JSON, or a pickle torch's
    own loader read with the user's consent)."""
    entries = data.get("entries") or []
    last: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or [str(entry.get("pg_id", "?")), ""]
        name = str(group[0]) + (f" ({group[1]})" if len(group) > 1 and group[1] else "")
        seq = int(entry.get("collective_seq_id", 0))
        if name not in last or seq >= last[name]["seq"]:
            last[name] = {
                "group": name,
                "seq": seq,
                "op": str(entry.get("profiling_name", "?")),
                "state": str(entry.get("state", "?")),
            }
    return {"path": path, "format": "json", "last": last}


def evidence(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """Lines for a finding: each rank's last collective per group, and where they disagree."""
    lines: list[str] = []
    for rank, dump in sorted(dumps.items()):
        if dump.get("format") != "json":
            if dump:
                lines.append(f"Flight Recorder, rank {rank}: {dump['path']} {dump.get('note', '')}".rstrip())
            continue
        for call in dump["last"].values():
            lines.append(
                f"Flight Recorder, rank {rank}: last on group {call['group']} was "
                f"#{call['seq']} {call['op']} ({call['state']})"
            )
    for group, calls in sorted(_by_group(dumps).items()):
        if len({(c.seq, c.op) for c in calls.values()}) > 1:
            described = "; ".join(
                f"rank {r}: #{c.seq} {c.op}" for r, c in sorted(calls.items(), key=lambda item: item[0])
            )
            lines.append(f"Flight Recorder: the ranks disagree on group {group}: {described}")
    return lines


def disagreement(dumps: dict[int, dict[str, Any]]) -> tuple[str, dict[str, list[int]]] | None:
    """The first group whose ranks' last entries have the same position but different ops:
    (group, {op: ranks}). None when the dumps agree or say too little."""
    for group, calls in sorted(_by_group(dumps).items()):
        if len(calls) < 2 or len({c.seq for c in calls.values()}) != 1:
            continue
        by_op: dict[str, list[int]] = {}
        for rank, call in sorted(calls.items()):
            by_op.setdefault(call.op, []).append(rank)
        if len(by_op) > 1:
            return group, by_op
    return None


def _by_group(dumps: dict[int, dict[str, Any]]) -> dict[str, dict[int, LastCall]]:
    groups: dict[str, dict[int, LastCall]] = {}
    for rank, dump in dumps.items():
        for call in dump.get("last", {}).values():
            groups.setdefault(call["group"], {})[rank] = LastCall(**call)
    return groups
