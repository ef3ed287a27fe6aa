"""probe: can these ranks talk, all of them, correctly, and how fast.

Launches ``ncclcheck.runtime.probe_worker`` through torch.distributed.run with the same
launch options as preflight, bounds the whole run, reaps every process, then
reads what each rank wrote: who checked in, what each rank is, which checks
failed and whose contributions were wrong, and the bandwidth table computed as
nccl-tests computes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ncclcheck.causes import Cause
from ncclcheck.errors import UsageError
from ncclcheck.launch.proctree import kill_tree
from ncclcheck.launch.stop import STOP
from ncclcheck.launch.torchrun import TorchrunOptions, parse_torchrun_failures, start_torchrun
from ncclcheck.model import Finding, RankState, RankStatus, Report, Severity, Verdict
from ncclcheck.runtime.probe_worker import BUS_FACTOR, CHECKIN_FAILED_EXIT, ENV_CONFIG, ENV_OUT
from ncclcheck.wording import who

# Of the settings the worker collects (probe_worker._SETTINGS_PREFIXES), the one that
# differs between ranks by design: which GPU each one sees.
_PER_RANK_SETTINGS = ("CUDA_VISIBLE_DEVICES",)


@dataclass
class ProbeSettings:
    backend: str = "auto"
    max_bytes: int = 1 << 20  # CPU default; 1 GiB on GPUs
    repeats: int = 5
    iterations: int = 10
    checkin_timeout: float = 20.0
    op_timeout: float = 60.0
    layout: list[tuple[str, int]] = field(default_factory=list)


def parse_layout(text: str, world: int) -> list[tuple[str, int]]:
    """``tp=2,dp=2`` -> [("tp", 2), ("dp", 2)], innermost first; the sizes multiply to the world."""
    layout: list[tuple[str, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        if not name or not count.isdigit() or int(count) < 1:
            raise UsageError(f"--layout {text!r}: each part is NAME=SIZE, e.g. tp=2,dp=2")
        layout.append((name, int(count)))
    product = 1
    for _name, size in layout:
        product *= size
    if layout and product != world:
        raise UsageError(f"--layout {text!r} covers {product} ranks, but the probe runs {world}")
    return layout


def choose_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"
    except ImportError:
        return "gloo"


def run_probe(torchrun: TorchrunOptions, settings: ProbeSettings, world: int) -> Report:
    if torchrun.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {torchrun.nproc_per_node}")
    backend = choose_backend(settings.backend)
    config = {
        "backend": backend,
        "max_bytes": settings.max_bytes,
        "repeats": settings.repeats,
        "iterations": settings.iterations,
        "checkin_timeout": settings.checkin_timeout,
        "op_timeout": settings.op_timeout,
        "layout": settings.layout,
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *torchrun.argv(),
        "--module",
        "ncclcheck.runtime.probe_worker",
    ]
    # the whole probe is bounded: check-in, each stage's collectives, and a margin
    bound = settings.checkin_timeout + 4 * settings.op_timeout + 60
    out: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    timed_out = reaped = False
    try:
        with STOP.held():  # the folder and torchrun are known before a stop is raised
            out = Path(tempfile.mkdtemp(prefix="ncclcheck-probe-"))
            env = {**os.environ, ENV_OUT: str(out), ENV_CONFIG: json.dumps(config), "PYTHONUNBUFFERED": "1"}
            env["TMPDIR"] = str(out)  # torchrun's agent leaves a log folder in TMPDIR: removed with ours
            log_path = out / "torchrun.log"
            start = time.monotonic()
            proc = start_torchrun(argv, env, log_path)
        try:
            proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            timed_out = True
        with STOP.held():
            _reap(proc, out)
            reaped = True
        elapsed = time.monotonic() - start
        log_text = log_path.read_text(encoding="utf-8", errors="replace")
        ranks = {int(p.stem.split("-")[1]): _read(p) for p in sorted(out.glob("rank-*.json"))}
    finally:
        # a stop (Stopped, KeyboardInterrupt) or an error on the way: nothing left running, no
        # temporary folder left; everything needed is read by then otherwise
        with STOP.held():
            if proc is not None and out is not None and not reaped:
                _reap(proc, out)
            if out is not None:
                shutil.rmtree(out, ignore_errors=True)
    exits, first_failure = parse_torchrun_failures(log_text)
    log_tail = [line for line in log_text.splitlines() if line.strip()][-5:]
    world = max([world, *(int(d["world"]) for d in ranks.values() if isinstance(d.get("world"), int))])
    report = build_report(ranks, world, backend, exits, first_failure, timed_out, elapsed, settings)
    for finding in report.findings:
        if finding.cause == Cause.RANK_CRASHED:  # what the ranks printed last says why
            finding.evidence += [f"log: {line}" for line in log_tail]
    return report


def _reap(proc: subprocess.Popen[bytes], out: Path) -> None:
    """torchrun and every rank gone: the ranks run in sessions of their own, found by the
    pids they wrote in ``out``."""
    if proc.poll() is None:
        kill_tree(proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    for rank_file in out.glob("rank-*.json"):
        pid = _read(rank_file).get("pid")
        if isinstance(pid, int):
            kill_tree(pid)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def build_report(
    ranks: dict[int, dict[str, Any]],
    world: int,
    backend: str,
    exits: dict[int, int],
    first_failure: int | None,
    timed_out: bool,
    elapsed: float,
    settings: ProbeSettings,
) -> Report:
    """Pure: the report from what the ranks wrote and what torchrun said."""
    report = Report(command="probe", verdict=Verdict.ALIGNED, world_size=world)
    missing, findings = _who_arrived(ranks, world, exits, settings)
    # what each rank is, and where they differ
    everyone = next((d.get("everyone") for d in ranks.values() if d.get("everyone")), None)
    if everyone:
        findings += _differences(everyone)
    wrong = _wrong_results(ranks)
    findings += wrong
    # performance: the collective is as slow as its slowest rank
    table = _bandwidth(ranks, world)
    layout_rows = [row for d in ranks.values() for row in d.get("layout", [])]
    findings += _wrong_in_subgroups(layout_rows)
    if timed_out:
        findings.append(
            Finding(
                cause=Cause.TRANSPORT_HANG,
                severity=Severity.ERROR,
                message=f"the probe did not finish within its bound and was stopped after {elapsed:.0f} s",
                ranks=sorted(ranks),
                evidence=[f"rank {r}: last stage {d.get('stage')}" for r, d in sorted(ranks.items())],
            )
        )
    elif first_failure is not None and not missing and not wrong:
        findings.append(
            Finding(
                cause=Cause.RANK_CRASHED,
                severity=Severity.ERROR,
                message=f"rank {first_failure} failed during the probe (exit {exits.get(first_failure)})",
                ranks=[first_failure],
                evidence=[f"rank {r}: last stage {d.get('stage')}" for r, d in sorted(ranks.items())],
            )
        )
    report.findings = findings
    errors = any(f.severity is Severity.ERROR for f in findings)
    report.verdict = Verdict.ERROR if errors else Verdict.ALIGNED
    report.ranks = [_rank_state(r, ranks.get(r, {}), exits) for r in range(world)]
    report.summary = {
        "backend": backend,
        "elapsed_s": round(elapsed, 2),
        "checks": _check_summary(ranks),
        "performance": table,
        "layout": _layout_summary(layout_rows),
    }
    return report


def _who_arrived(
    ranks: dict[int, dict[str, Any]], world: int, exits: dict[int, int], settings: ProbeSettings
) -> tuple[list[int], list[Finding]]:
    """The ranks that never checked in, and the finding that names them."""
    hosts = {r: d.get("host", "?") for r, d in ranks.items()}
    checked_in = {r for r, d in ranks.items() if d.get("stage") not in (None, "started", "check-in failed")}
    said_missing = sorted({m for d in ranks.values() for m in d.get("missing", [])})
    # no record and not stopped by torchrun's signal either (a stopped rank was running)
    never_started = sorted(r for r in set(range(world)) - set(ranks) if exits.get(r, 0) >= 0)
    # exited on its own before checking in; a negative code is torchrun stopping the
    # survivors after the first failure, not a fault of theirs
    crashed = sorted(
        r for r, code in exits.items() if r not in checked_in and code > 0 and code != CHECKIN_FAILED_EXIT
    )
    missing = sorted(set(said_missing) | set(never_started) | set(crashed))
    if not checked_in and not missing:
        missing = list(range(world))
    if not missing:
        return [], []
    present = sorted(set(range(world)) - set(missing))
    why = []
    for r in missing:
        if r in exits and exits[r] != CHECKIN_FAILED_EXIT:
            why.append(f"rank {r} exited with {exits[r]} before checking in")
        elif r in ranks:
            why.append(f"rank {r} started on {hosts[r]} (pid {ranks[r].get('pid')}) and never checked in")
        else:
            why.append(f"rank {r} never started (no process wrote its record)")
    finding = Finding(
        cause=Cause.RANK_CRASHED,
        severity=Severity.ERROR,
        message=f"{who(missing)} of {world} never checked in within "
        f"{settings.checkin_timeout:.0f} s; {who(present) if present else 'no rank'} did",
        ranks=present,
        absent_ranks=missing,
        op="check-in",
        evidence=why,
    )
    return missing, [finding]


def _wrong_results(ranks: dict[int, dict[str, Any]]) -> list[Finding]:
    """Collectives that gave wrong results on known values, and whose contribution was wrong."""
    failed: dict[str, list[int]] = {}
    blamed: dict[str, set[int]] = {}
    for r, d in sorted(ranks.items()):
        for check in d.get("checks", []):
            if not check.get("ok"):
                failed.setdefault(check["op"], []).append(r)
                blamed.setdefault(check["op"], set()).update(check.get("wrong_from", []))
    culprits = sorted(set().union(*blamed.values())) if blamed else []
    findings = []
    for op, seen_by in sorted(failed.items()):
        details = [
            f"rank {r}: {c.get('detail') or 'wrong'}"
            for r, d in sorted(ranks.items())
            for c in d.get("checks", [])
            if c["op"] == op and not c.get("ok")
        ]
        findings.append(
            Finding(
                cause=Cause.TRANSPORT_HANG,
                severity=Severity.ERROR,
                message=f"{op} gave wrong results on {who(seen_by)}"
                + (f"; the wrong contribution came from {who(culprits)}" if culprits else ""),
                ranks=culprits,
                absent_ranks=[],
                op=op,
                evidence=details[:8],
            )
        )
    return findings


def _wrong_in_subgroups(layout_rows: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding(
            cause=Cause.TRANSPORT_HANG,
            severity=Severity.ERROR,
            message=f"all_reduce on {row['dimension']} group {row['members']} gave a wrong result",
            ranks=row["members"],
            op="all_reduce",
            evidence=[row["detail"]],
        )
        for row in layout_rows
        if not row["ok"]
    ]


def _rank_state(rank: int, record: dict[str, Any], exits: dict[int, int]) -> RankState:
    if record.get("stage"):
        where = f"probe stage: {record['stage']}"
    elif exits.get(rank, 0) < 0:
        where = "stopped by torchrun before it wrote anything"
    else:
        where = "never started"
    return RankState(
        rank=rank,
        host=record.get("host", "?"),
        pid=record.get("pid"),
        exit_code=exits.get(rank, 0 if record.get("stage") == "done" else None),
        state=RankStatus.EXITED,
        where=where,
    )


def _differences(everyone: list[dict[str, Any]]) -> list[Finding]:
    """Versions or settings that differ between ranks (where each rank is does not count)."""
    findings = []
    for key in ("torch", "cuda", "nccl", "python", "backend"):
        values: dict[str, list[int]] = {}
        for r, item in enumerate(everyone):
            values.setdefault(str(item.get(key)), []).append(r)
        if len(values) > 1:
            findings.append(_differ_finding(key, values))
    names = {name for item in everyone for name in item.get("settings", {})}
    for name in sorted(names):
        if name.startswith(_PER_RANK_SETTINGS):
            continue
        values = {}
        for r, item in enumerate(everyone):
            values.setdefault(str(item.get("settings", {}).get(name, "<unset>")), []).append(r)
        if len(values) > 1:
            findings.append(_differ_finding(name, values))
    return findings


def _differ_finding(key: str, values: dict[str, list[int]]) -> Finding:
    described = "; ".join(f"{who(ranks)}: {value}" for value, ranks in sorted(values.items()))
    fewest = min(values.values(), key=len)
    return Finding(
        cause=Cause.TRANSPORT_HANG,
        severity=Severity.WARNING,
        message=f"{key} differs between ranks ({described}): a mismatch here is a classic cause of hangs "
        f"that look like transport faults",
        ranks=fewest,
        evidence=[described],
    )


def _check_summary(ranks: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    by_op: dict[str, dict[str, Any]] = {}
    for r, d in sorted(ranks.items()):
        for check in d.get("checks", []):
            row = by_op.setdefault(
                check["op"], {"op": check["op"], "ok_on": [], "failed_on": [], "skipped": None}
            )
            (row["ok_on"] if check.get("ok") else row["failed_on"]).append(r)
            if check.get("skipped"):
                row["skipped"] = check["skipped"]
    return list(by_op.values())


def _significant(value: float, digits: int = 4) -> float:
    """Rounded to significant digits, not decimal places: small payloads on a loaded CPU
    give 0.0002 GB/s, where four decimals keep one digit and busbw no longer reads as
    algbw times the bus factor."""
    return float(f"{value:.{digits}g}")


def _bandwidth(ranks: dict[int, dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """Per op and size: time of the slowest rank, algbw and busbw in GB/s (nccl-tests)."""
    cells: dict[tuple[str, int], dict[int, float]] = {}
    for r, d in ranks.items():
        for row in d.get("performance", []):
            cells.setdefault((row["op"], row["bytes"]), {})[r] = row["seconds"]
    table = []
    for (op, size), by_rank in sorted(
        cells.items(), key=lambda item: (list(BUS_FACTOR).index(item[0][0]), item[0][1])
    ):
        slowest = max(by_rank, key=lambda r: by_rank[r])
        seconds = by_rank[slowest]
        algbw = size / seconds / 1e9
        table.append(
            {
                "op": op,
                "bytes": size,
                "time_us": round(seconds * 1e6, 1),
                "algbw_GBps": _significant(algbw),
                "busbw_GBps": _significant(algbw * BUS_FACTOR[op](world)),
                "slowest_rank": slowest,
                "slowest_host": ranks[slowest].get("host", "?"),
            }
        )
    return table


def _layout_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for row in rows:
        entry = summary.setdefault(row["dimension"], {"groups": [], "ok": True})
        if row["members"] not in entry["groups"]:
            entry["groups"].append(row["members"])
        entry["ok"] = entry["ok"] and row["ok"]
    for entry in summary.values():
        entry["groups"].sort()
    return summary
