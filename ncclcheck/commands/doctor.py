"""doctor: diagnose a job that is stuck right now, from the stacks of all its ranks.

Works on any job: no environment variable, no change to its code. From one pid
(a torchrun agent, a rank, or a launcher such as a shell, srun or mpirun) it
finds the rank processes on this host by their environment (RANK, WORLD_SIZE,
LOCAL_RANK, GROUP_RANK, TORCHELASTIC_RUN_ID), dumps their stacks with py-spy in
parallel, merges them into classes of identical stacks (as LLNL's STAT does for
MPI jobs) and matches the classes to the catalogue. It only reads: the job is
neither written to nor signalled.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import psutil

from ncclcheck.causes import Cause
from ncclcheck.communicates import DEFERRED_FRAMES, DeferredFrame
from ncclcheck.errors import InputError, StackPermissionError
from ncclcheck.evidence import flight_recorder
from ncclcheck.evidence.stacks import ProcessStack, blocking, dump_stacks, issuer_advice
from ncclcheck.explain import source
from ncclcheck.explain.align import Divergence, Mismatch
from ncclcheck.explain.diagnose import Diagnoser, Evidence, relative, who
from ncclcheck.model import (
    CollectiveCall,
    Finding,
    Frame,
    RankState,
    RankStatus,
    Report,
    Severity,
    Verdict,
    format_ranks,
)
from ncclcheck.record.frames import framework_name


@dataclass
class RankProcess:
    pid: int
    rank: int
    world_size: int
    local_rank: int = 0
    group_rank: int = 0
    run_id: str = ""
    host: str = field(default_factory=socket.gethostname)
    status: str = ""
    # a Flight Recorder dump of this rank, read on its host (see flight_recorder.read_dump)
    flight_recorder: dict[str, Any] = field(default_factory=dict)


@dataclass
class StackClass:
    """Ranks whose relevant stacks are identical."""

    ranks: list[int]
    blocking: str  # all_reduce, barrier, DataLoader, sleep, compute, ...
    in_collective: bool
    frames: list[Frame]  # the user's frames, outermost first
    # per rank: what tells apart ranks waiting at the same line (see rank_state)
    states: dict[int, dict[str, str]] = field(default_factory=dict)
    # a framework running a collective for an earlier call of the user's (see DEFERRED_FRAMES)
    deferred: DeferredFrame | None = None
    libraries: list[str] = field(default_factory=list)  # third-party packages on the stack
    advice: str | None = None  # what to do about a collective library code issued

    @property
    def site(self) -> Frame | None:
        return self.frames[-1] if self.frames else None


def _environ(proc: psutil.Process) -> dict[str, str]:
    try:
        return proc.environ()
    except psutil.AccessDenied:
        raise StackPermissionError(f"no permission to read the environment of pid {proc.pid}") from None
    except psutil.Error:
        return {}


def _peek_environ(proc: psutil.Process) -> dict[str, str]:
    """The environment of a process we only glance at (a parent): unreadable is empty,
    not an error, since it may belong to someone else (init, a container runtime)."""
    try:
        return proc.environ()
    except psutil.Error:
        return {}


def discover(pids: list[int]) -> tuple[list[RankProcess], list[psutil.Process]]:
    """The rank processes reachable from ``pids``; and the Python processes seen if none is a rank."""
    roots: list[psutil.Process] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise InputError(f"no process with pid {pid}") from None
        env = _environ(proc)
        if "RANK" in env and "WORLD_SIZE" in env:
            parent = proc.parent()  # a rank: look from its agent, to find its siblings too
            parent_env = _peek_environ(parent) if parent is not None and parent.pid != 1 else {}
            if parent is not None and parent_env and "RANK" not in parent_env:
                proc = parent
        roots.append(proc)
    seen: dict[int, RankProcess] = {}
    pythons: list[psutil.Process] = []
    for root in roots:
        for proc in [root, *root.children(recursive=True)]:
            env = _environ(proc)
            if "RANK" not in env or "WORLD_SIZE" not in env:
                if _is_python(proc):
                    pythons.append(proc)
                continue
            parent = proc.parent()
            if parent is not None and _peek_environ(parent).get("RANK") == env["RANK"]:
                continue  # a DataLoader worker inherits its rank's environment
            seen[proc.pid] = RankProcess(
                pid=proc.pid,
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                group_rank=int(env.get("GROUP_RANK", "0")),
                run_id=env.get("TORCHELASTIC_RUN_ID", ""),
                status=_status(proc),
            )
            fr_path = flight_recorder.dump_path(env, int(env["RANK"]))
            if fr_path is not None:
                seen[proc.pid].flight_recorder = flight_recorder.read_dump(fr_path)
    return sorted(seen.values(), key=lambda r: r.rank), pythons


def _is_python(proc: psutil.Process) -> bool:
    try:
        return "python" in os.path.basename(proc.exe() or proc.name()).lower()
    except psutil.Error:
        return False


def _status(proc: psutil.Process) -> str:
    try:
        return str(proc.status())
    except psutil.Error:
        return "gone"


def _deferred_in(stack: ProcessStack) -> DeferredFrame | None:
    main = stack.main
    for frame in main.frames if main else []:
        path = frame.file.replace("\\", "/")
        for known in DEFERRED_FRAMES:
            # py-spy qualifies methods with their class: _ResultMetric.compute
            if path.endswith(known.file) and frame.function.rsplit(".", 1)[-1] == known.function:
                return known
    return None


def _libraries(stack: ProcessStack) -> list[str]:
    """Third-party packages on the main thread's stack (lightning, transformers), named
    after their folder in site-packages: the playbooks give some fixes in their terms."""
    main = stack.main
    found: set[str] = set()
    for index, frame in enumerate(main.frames if main else []):
        path = frame.file.replace("\\", "/")
        marker = path.rfind("-packages/")
        if main is not None and not main.is_user(index) and marker >= 0:
            name = framework_name(path[marker + len("-packages/") :].split("/", 1)[0])
            if name is not None and not name.endswith(".py"):
                found.add(name)
    return sorted(found)


def merge_stacks(stacks: dict[int, ProcessStack]) -> list[StackClass]:
    classes: dict[tuple[object, ...], StackClass] = {}
    for rank, stack in sorted(stacks.items()):
        where = blocking(stack)
        what, in_collective = where.what, where.waits_for_peers
        frames = list(reversed(_user_frames(stack)))
        deferred = _deferred_in(stack) if in_collective else None
        key = (what, tuple((f.file, f.line, f.function) for f in frames), deferred)
        if key not in classes:
            classes[key] = StackClass(
                [],
                what,
                in_collective,
                frames,
                deferred=deferred,
                libraries=_libraries(stack),
                advice=issuer_advice(stack),
            )
        classes[key].ranks.append(rank)
        if in_collective:
            classes[key].states[rank] = rank_state(stack, what)
    return sorted(classes.values(), key=lambda c: c.ranks[0])


def _user_frames(stack: ProcessStack) -> list[Frame]:
    """The user's frames of the main thread, innermost first."""
    main = stack.main
    return [f for i, f in enumerate(main.frames) if main.is_user(i)] if main else []


_CREATED_GROUP = "name of the group being created"


def rank_state(stack: ProcessStack, op: str) -> dict[str, str]:
    """What tells apart ranks that wait at the same line, from py-spy's locals: the
    process group the user's call passes (named after the variable that holds it)
    and the values of the loop variables around each user frame. Ranks at one line
    with different values are at different points of their collective sequences."""
    main = stack.main
    if main is None or not main.locals:
        return {}
    user = [  # innermost first
        (f, values)
        for i, (f, values) in enumerate(zip(main.frames, main.locals, strict=False))
        if main.is_user(i)
    ]
    state: dict[str, str] = {}
    for frame, values in zip(main.frames, main.locals, strict=False):
        # torch names a new group by a count of new_group calls on that rank
        if frame.function.endswith("_new_group_with_tag") and "group_name" in values:
            state[_CREATED_GROUP] = values["group_name"]
    if user:
        site, site_locals = user[0]
        group = source.group_argument(site.file, site.line, op)
        if group is None:
            state["process group"] = "the default group"
        else:
            text = site_locals.get(group.id) if isinstance(group, ast.Name) else None
            if text is None:
                state["process group"] = ast.unparse(group)
            elif text == "None":
                state["process group"] = "the default group"
            else:
                # an object: name it after the outermost user variable holding the same one
                holders = [n for _f, values in reversed(user) for n, t in values.items() if t == text]
                state["process group"] = holders[0] if holders else ast.unparse(group)
    for frame, values in user:
        for loop in source.enclosing_loops(frame.file, frame.line):
            for target in source.loop_targets(loop):
                text = values.get(target)
                if text is not None and " at 0x" not in text:  # addresses differ by process
                    state[f"{target} in {frame.function}()"] = text
    return state


def _state_split(cls: StackClass) -> tuple[list[list[int]], list[str]] | None:
    """Ranks of one class grouped by the state values that differ among them."""
    if len(cls.states) < 2:
        return None
    shared = set.intersection(*(set(state) for state in cls.states.values()))
    differing = sorted(k for k in shared if len({state[k] for state in cls.states.values()}) > 1)
    if not differing:
        return None
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank, state in sorted(cls.states.items()):
        groups.setdefault(tuple(state[k] for k in differing), []).append(rank)
    parts = sorted(groups.values(), key=lambda ranks: (len(ranks), ranks[0]))
    lines = [
        f"{who(ranks)}: " + ", ".join(f"{k} = {v}" for k, v in zip(differing, values, strict=True))
        for values, ranks in groups.items()
    ]
    return parts, lines


def collect(
    pids: list[int], native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> tuple[list[RankProcess], dict[int, ProcessStack]]:
    """The rank processes reachable from ``pids`` on this host and their stacks, by rank."""
    ranks, pythons = discover(pids)
    by_pid: dict[int, ProcessStack] = {}
    if not ranks:
        if not pythons:
            raise InputError(
                f"pid {', '.join(map(str, pids))}: no Python process there",
                hint="Give the pid of a rank, of torchrun, or of the launcher that started it.",
            )
        ranks, by_pid = _spawned_ranks(pythons, native, nonblocking, timeout)
        if not ranks:
            _not_distributed(pythons, native, nonblocking, timeout)
    if not by_pid:
        by_pid = dump_stacks(
            [r.pid for r in ranks], timeout=timeout, native=native, nonblocking=nonblocking, with_locals=True
        )
    stacks = {r.rank: by_pid[r.pid] for r in ranks}
    failed = [r.rank for r in ranks if stacks[r.rank].error and not stacks[r.rank].threads]
    if failed and len(failed) == len(ranks):
        raise InputError(f"py-spy could not read any rank: {stacks[ranks[0].rank].error}")
    return ranks, stacks


def run_doctor(
    pids: list[int], native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> Report:
    ranks, stacks = collect(pids, native, nonblocking, timeout)
    return diagnose_ranks(ranks, stacks)


# -- several hosts: each dumps its ranks, one reads them all ----------------------------

DUMP_FORMAT = "ncclcheck-doctor-dump/1"


def dump_to(
    directory: Path, pids: list[int], native: bool = False, nonblocking: bool = False, timeout: float = 10.0
) -> tuple[Path, list[RankProcess]]:
    """Write this host's ranks and stacks to ``directory/<host>-node<N>.json``."""
    ranks, stacks = collect(pids, native, nonblocking, timeout)
    try:
        # private: stacks carry local variables' values
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {directory}: {exc.strerror}") from None
    node = min(r.group_rank for r in ranks)
    path = directory / f"{socket.gethostname()}-node{node}.json"
    document = {
        "format": DUMP_FORMAT,
        "host": socket.gethostname(),
        "time": time.time(),
        "ranks": [{**asdict(r), "stack": stacks[r.rank].to_dict()} for r in ranks],
    }
    partial = path.with_suffix(".json.partial")  # readers never see half a file
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(document))
        partial.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    return path, ranks


def run_doctor_from(directory: Path) -> Report:
    """One diagnosis from the dumps of several hosts (``doctor --dump-to`` on each)."""
    if not directory.is_dir():
        raise InputError(f"{directory}: no such directory")
    files = sorted(directory.glob("*.json"))
    ranks: dict[int, RankProcess] = {}
    stacks: dict[int, ProcessStack] = {}
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"{path}: not a doctor dump ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != DUMP_FORMAT:
            raise InputError(f"{path}: not a doctor dump (no format {DUMP_FORMAT!r})")
        try:
            for entry in document["ranks"]:
                proc = RankProcess(**{k: v for k, v in entry.items() if k != "stack"})
                if proc.rank in ranks:
                    raise InputError(
                        f"{path}: rank {proc.rank} is also in another dump (two jobs in one directory?)"
                    )
                ranks[proc.rank] = proc
                stacks[proc.rank] = ProcessStack.from_dict(entry["stack"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: malformed doctor dump ({exc})") from None
    if not ranks:
        raise InputError(
            f"{directory}: no doctor dumps (*.json) in it",
            hint="On each host: ncclcheck doctor --pid PID --dump-to DIR",
        )
    return diagnose_ranks(sorted(ranks.values(), key=lambda r: r.rank), stacks)


def diagnose_ranks(ranks: list[RankProcess], stacks: dict[int, ProcessStack]) -> Report:
    """Merge the stacks into classes and name the cause."""
    classes = merge_stacks({r: s for r, s in stacks.items() if s.threads or s.status == "stopped"})
    world = max(r.world_size for r in ranks)
    report = Report(command="doctor", verdict=Verdict.HANG, world_size=world)
    for proc in ranks:
        stack = stacks[proc.rank]
        where = blocking(stack)
        user = _user_frames(stack)
        report.ranks.append(
            RankState(
                rank=proc.rank,
                host=proc.host,
                pid=proc.pid,
                phase=None,
                state=RankStatus.IN_COLLECTIVE if where.waits_for_peers else RankStatus.STUCK,
                where=f"{_frame_text(user[0])} ({where.what})" if user else where.what,
            )
        )
    report.findings = diagnose_classes(classes, world, [r.rank for r in ranks])
    dumps = {r.rank: r.flight_recorder for r in ranks if r.flight_recorder}
    recorded = flight_recorder.evidence(dumps)
    if recorded and report.findings:
        report.findings[0].evidence += recorded
        parted = flight_recorder.disagreement(dumps)
        if parted is not None and report.findings[0].cause in (Cause.TRANSPORT_HANG, Cause.STRAGGLER):
            # The stacks look alike, the Flight Recorder shows the sequences differ.
            group, by_op = parted
            sides = sorted(by_op.values(), key=lambda ranks: (len(ranks), ranks[0]))
            report.findings[0] = Diagnoser(Evidence(traces={}, world_size=world)).finding(
                Cause.COLLECTIVE_ORDER_MISMATCH,
                f"the ranks wait alike, but their Flight Recorders show different collectives at the "
                f"same position on group {group}: "
                + "; ".join(f"{who(r)} issued {op}" for op, r in sorted(by_op.items())),
                ranks=sides[0],
                absent_ranks=sorted(r for side in sides[1:] for r in side),
                op=None,
                site=report.findings[0].site,
                evidence=report.findings[0].evidence,
            )
    if report.findings and report.findings[0].cause == Cause.TRANSPORT_HANG and not recorded:
        # What a stack cannot show: on which pass of this line each rank is. An extra or
        # missing collective earlier (an uneven eval loop) may have paired silently with
        # one of the same size, leaving the ranks a call apart here.
        report.findings[0].evidence.append(
            "the stacks agree but do not show on which pass of this line each rank is: if an eval "
            "loop or a skipped step came before, preflight the script, or run the job with "
            "TORCH_FR_BUFFER_SIZE=2000 so that doctor can compare the ranks' sequence numbers"
        )
    report.summary["classes"] = [
        {
            "ranks": format_ranks(c.ranks),
            "blocking": c.blocking + (f" (inside {c.deferred.what})" if c.deferred else ""),
            "frames": [f"{relative(f.file, os.getcwd())}:{f.line} in {f.function}" for f in c.frames],
        }
        for c in classes
    ]
    return report


def diagnose_classes(classes: list[StackClass], world: int, found: list[int]) -> list[Finding]:
    """The playbooks' doctor signals, applied to the merged stack classes."""
    missing = sorted(set(range(world)) - set(found))
    evidence = [f"{who(c.ranks)}: {c.blocking} at {_where(c)}" for c in classes]
    # what to do about a collective library code issued (SyncBatchNorm in training mode)
    evidence += dict.fromkeys(c.advice for c in classes if c.advice is not None)
    waiting = [c for c in classes if c.in_collective]
    outside = [c for c in classes if not c.in_collective]
    diagnoser = Diagnoser(Evidence(traces={}, world_size=world))
    if missing:
        ranks = sorted(r for c in classes for r in c.ranks)
        return [
            diagnoser.finding(
                Cause.RANK_CRASHED,
                f"{who(missing)} of {world} are not running on this host while {who(ranks)} wait",
                ranks=ranks,
                absent_ranks=missing,
                op=waiting[0].blocking if waiting else None,
                site=_site(waiting[0]) if waiting else None,
                evidence=[*evidence, "a rank on another host? run doctor there too, with --dump-to"],
            )
        ]
    frozen = sorted(r for c in outside if c.blocking.startswith("stopped") for r in c.ranks)
    if len(waiting) == 1 and len(outside) == (1 if frozen else 0):
        only = waiting[0]
        split = _state_split(only)
        if split is not None:
            parts, lines = split
            if all(_CREATED_GROUP in state for state in only.states.values()):
                return [
                    diagnoser.finding(
                        Cause.RANK_CONDITIONAL_COLLECTIVE,
                        f"every rank waits in new_group at {_site(only)}, but they give the group "
                        "different names: "
                        + "; ".join(lines)
                        + ". torch names a group by a count of new_group calls, so the ranks made "
                        "different numbers of them before: an earlier new_group ran on some ranks "
                        "only (under a rank or membership test), and each side now waits for peers "
                        "of a group the others call by another name",
                        ranks=parts[0],
                        absent_ranks=sorted(r for part in parts[1:] for r in part),
                        op="new_group",
                        site=_site(only),
                        evidence=[
                            *evidence,
                            *lines,
                            "find the new_group under a test of the rank: `ncclcheck lint` on the "
                            "script names it, `ncclcheck preflight` shows which ranks called it",
                        ],
                    )
                ]
            return [
                diagnoser.finding(
                    Cause.COLLECTIVE_ORDER_MISMATCH,
                    f"every rank waits in {only.blocking} at {_site(only)}, but not at the same point "
                    f"of its sequence: "
                    + "; ".join(lines)
                    + ". Each side waits for a call the other makes later (or on another group)",
                    ranks=parts[0],
                    absent_ranks=sorted(r for part in parts[1:] for r in part),
                    op=only.blocking,
                    site=_site(only),
                    evidence=[*evidence, *lines],
                )
            ]
        if frozen:
            evidence.append(f"{who(frozen)} frozen: process state stopped, stack unreadable")
        return [
            diagnoser.finding(
                Cause.TRANSPORT_HANG,
                f"every rank is in {only.blocking} at {_site(only)}"
                + (f" or frozen ({who(frozen)})" if frozen else "")
                + ": the stacks are aligned, so the transport is the suspect; run `ncclcheck probe` "
                "with the same launcher options",
                ranks=sorted(only.ranks + frozen),
                absent_ranks=[],
                op=only.blocking,
                site=_site(only),
                evidence=evidence,
            )
        ]
    if waiting and outside:
        late = sorted(r for c in outside for r in c.ranks)
        ranks = sorted(r for c in waiting for r in c.ranks)
        return [
            diagnoser.finding(
                Cause.STRAGGLER,
                f"{who(ranks)} wait in {waiting[0].blocking} while {who(late)} are busy outside any "
                f"collective ({outside[0].blocking} at {_where(outside[0])})",
                ranks=ranks,
                absent_ranks=late,
                op=waiting[0].blocking,
                site=_site(waiting[0]),
                evidence=evidence,
            )
        ]
    if len(waiting) >= 2:
        deferred = _deferred_finding(waiting, diagnoser, evidence)
        if deferred is not None:
            return [deferred]
        looped = _left_loop(waiting, diagnoser, evidence)
        if looped is not None:
            return [looped]
        # Ranks wait in different collectives: read the source as preflight does,
        # the smaller class being the one that took the branch.
        small, big = sorted(waiting, key=lambda c: (len(c.ranks), c.ranks[0]))[:2]
        calls: dict[int, CollectiveCall | None] = {}
        for cls in (small, big):
            for rank in cls.ranks:
                calls[rank] = CollectiveCall(
                    rank=rank,
                    seq=0,
                    op=cls.blocking,
                    group="?",
                    group_ranks=[],
                    site=cls.site,
                    user_stack=cls.frames,
                    libraries=cls.libraries,
                )
        divergence = Divergence("?", 0, Mismatch.SITE, sorted(calls), calls)
        finding = diagnoser.branch(divergence, small.ranks, big.ranks, evidence)
        if small.blocking == big.blocking and finding.message.endswith("at that point"):
            finding = diagnoser.finding(
                Cause.COLLECTIVE_ORDER_MISMATCH,
                f"{who(small.ranks)} and {who(big.ranks)} wait in {small.blocking} at different "
                f"sites ({_site(small)} and {_site(big)}): their collective sequences differ",
                ranks=small.ranks,
                absent_ranks=big.ranks,
                op=small.blocking,
                site=_site(small),
                evidence=evidence,
            )
        return [finding]
    return [
        Finding(
            cause=Cause.STRAGGLER,
            severity=Severity.WARNING,
            message="no rank is inside a collective: the job is slow or stuck outside communication",
            ranks=found,
            evidence=evidence,
        )
    ]


def _deferred_finding(waiting: list[StackClass], diagnoser: Diagnoser, evidence: list[str]) -> Finding | None:
    """Ranks waiting in a collective a framework runs later (Lightning's epoch-end sync):
    the stack cannot say which of the user's calls asked for it, so read the user's
    source, as lint does, for such a call under a rank test."""
    inside = next((c for c in waiting if c.deferred is not None and c.frames), None)
    if inside is None or inside.deferred is None:
        return None
    from ncclcheck.commands.lint import run_lint  # reads source: only for this case

    known = inside.deferred
    entry = Path(inside.frames[0].file)  # the script: lint follows its imports
    try:
        findings, _ = run_lint([entry]) if entry.is_file() else ([], None)
    except Exception:  # unreadable source must not hide the stacks' own diagnosis
        return None
    asked = [
        f for f in findings if f.cause == Cause.RANK_CONDITIONAL_COLLECTIVE and known.marker in f.message
    ]
    if not asked:
        return None
    others = sorted(r for c in waiting if c is not inside for r in c.ranks)
    first = asked[0]
    site = f"{relative(first.path, os.getcwd())}:{first.line}"
    return diagnoser.finding(
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        f"{who(inside.ranks)} {_verb(inside.ranks)} in {inside.blocking} inside {known.what}, while "
        f"{who(others)} {_verb(others)} elsewhere: the source makes that call only on some ranks ({site})",
        ranks=inside.ranks,
        absent_ranks=others,
        op=inside.blocking,
        site=site,
        evidence=[
            *evidence,
            f"{who(inside.ranks)}: {inside.blocking} inside {known.what}, called from {_where(inside)}",
            *(f"source: {f.site}: {f.message}" for f in asked),
        ],
        libraries=[known.library],
    )


def _verb(ranks: list[int]) -> str:
    return "waits" if len(ranks) == 1 else "wait"


def _left_loop(waiting: list[StackClass], diagnoser: Diagnoser, evidence: list[str]) -> Finding | None:
    """Some ranks still in a loop's collective, the others past the loop in the same function.

    A try whose handler swallows errors around the call: rank-exception. A loop
    with no conditional exit: it ran a different number of times per rank, which
    for a loader loop means loaders of different lengths (uneven-eval-batches).
    """
    for inside in waiting:
        for outside in waiting:
            if inside is outside or inside.site is None or not outside.frames:
                continue
            shared = list(
                itertools.takewhile(
                    lambda pair: (pair[0].file, pair[0].function) == (pair[1].file, pair[1].function),
                    zip(inside.frames, outside.frames, strict=False),
                )
            )
            if not shared:
                continue
            here, there = inside.frames[len(shared) - 1], outside.frames[len(shared) - 1]
            if _rank_branch_apart(here, there.line):
                # `if rank == 0: evaluate(...)`: the others never entered the loop below;
                # the source-reading diagnosis names the branch
                return None
            # the shared function's loops that the other side is outside of, then the
            # loops of the functions below it, which the other side has left entirely
            candidates = [(here, there.line)] + [(f, None) for f in inside.frames[len(shared) :]]
            for frame, other_line in candidates:
                loops = source.enclosing_loops(frame.file, frame.line)
                if other_line is not None and any(source.contains(lp, other_line) for lp in loops):
                    continue  # both sides inside one loop: they drifted apart, they did not leave it
                if not loops:
                    continue
                if other_line is not None and other_line < loops[-1].lineno:
                    # the other side waits above the loop, no loop of this function around
                    # both: it never reached the loop (a branch before it sent it elsewhere)
                    return None
                if any(
                    g.statement in ("break", "return")
                    for loop in loops
                    for g in source.conditional_exits(frame.file, loop)
                ):
                    return None  # a break or return decided: the source-reading diagnosis says which
                return _loop_finding(inside, outside, frame, loops[0], diagnoser, evidence)
    return None


def _rank_branch_apart(frame: Frame, other_line: int) -> bool:
    """Whether a rank test encloses ``frame``'s line but not ``other_line`` (same function)."""
    for node in source.enclosing_chain(frame.file, frame.line):
        if (
            isinstance(node, ast.If)
            and not source.contains(node, other_line)
            and source.condition_kind(frame.file, node.test) == source.RANK
        ):
            return True
    return False


def _loop_finding(
    inside: StackClass,
    outside: StackClass,
    frame: Frame,
    loop: ast.stmt,
    diagnoser: Diagnoser,
    evidence: list[str],
) -> Finding:
    assert inside.site is not None
    if source.swallowing_try(inside.site.file, inside.site.line) is not None:
        cause = Cause.RANK_EXCEPTION
        message = (
            f"{who(inside.ranks)} wait in {inside.blocking} inside a try whose handler swallows "
            f"errors, while {who(outside.ranks)} are past the loop: they skipped one of its "
            f"collectives"
        )
    else:
        cause = Cause.UNEVEN_EVAL_BATCHES
        message = (
            f"{who(inside.ranks)} are still in the loop at "
            f"{relative(frame.file, os.getcwd())}:{loop.lineno} (in "
            f"{inside.blocking}), {who(outside.ranks)} already left it: the loop ran fewer "
            f"times on them"
        )
        depth = inside.frames.index(frame) if frame in inside.frames else len(inside.frames) - 1
        origin = source.loader_origin(
            [(f.file, f.line) for f in inside.frames[: depth + 1]],
            loop,
        )
        if origin is not None:
            built = f"{origin.name} = DataLoader(...) at {relative(origin.file, os.getcwd())}:{origin.line}"
            if origin.sampler is None and not origin.rank_sharded:
                cause = Cause.MISSING_DISTRIBUTED_SAMPLER
                message += (
                    f"; the loader ({built}) has no sampler and its dataset is not sharded by "
                    f"rank, so each rank iterates a set of its own length"
                )
            else:
                evidence.append(
                    f"{built}, sampler: {origin.sampler or 'none, dataset sharded by rank by hand'}"
                )
    return diagnoser.finding(
        cause,
        message,
        ranks=inside.ranks,
        absent_ranks=outside.ranks,
        op=inside.blocking,
        site=_site(inside),
        evidence=evidence,
    )


_SPAWN_WRAPPER = ("torch/multiprocessing/spawn.py", "_wrap")  # _wrap(fn, i, args, ...)
_MAX_SPAWN_CANDIDATES = 256


def _spawned_ranks(
    pythons: list[psutil.Process], native: bool, nonblocking: bool, timeout: float
) -> tuple[list[RankProcess], dict[int, ProcessStack]]:
    """Ranks started by torch.multiprocessing.spawn, which sets no RANK: each runs the
    user's function under spawn's ``_wrap(fn, i, ...)``, whose ``i`` (the process index)
    is the rank on one node. Read from the stacks, dumped once with their locals."""
    candidates = pythons[:_MAX_SPAWN_CANDIDATES]
    stacks = dump_stacks(
        [p.pid for p in candidates], timeout=timeout, native=native, nonblocking=nonblocking, with_locals=True
    )
    found = _spawn_indices(stacks)
    # Given one rank's pid: its siblings are the other ranks.
    siblings = [
        child
        for parent in {_parent_pid(pid) for pid in found} - {None}
        for child in _children(parent)
        if child.pid not in stacks and _is_python(child)
    ]
    if siblings:
        more = dump_stacks(
            [p.pid for p in siblings[:_MAX_SPAWN_CANDIDATES]],
            timeout=timeout,
            native=native,
            nonblocking=nonblocking,
            with_locals=True,
        )
        stacks |= more
        found |= _spawn_indices(more)
    world = len(found)
    ranks = [
        RankProcess(pid=pid, rank=index, world_size=world, local_rank=index, status=stacks[pid].status)
        for pid, index in sorted(found.items(), key=lambda item: item[1])
    ]
    if len({r.rank for r in ranks}) != len(ranks):  # two spawn jobs under one pid: cannot tell
        return [], {}
    return ranks, {r.pid: stacks[r.pid] for r in ranks}


def _spawn_indices(stacks: dict[int, ProcessStack]) -> dict[int, int]:
    """pid -> process index, for the stacks that run under spawn's ``_wrap(fn, i, ...)``."""
    found: dict[int, int] = {}
    for pid, stack in stacks.items():
        main = stack.main
        if main is None:
            continue
        for index, frame in enumerate(main.frames):
            path = frame.file.replace("\\", "/")
            if path.endswith(_SPAWN_WRAPPER[0]) and frame.function.rsplit(".", 1)[-1] == _SPAWN_WRAPPER[1]:
                value = main.locals[index].get("i") if index < len(main.locals) else None
                if value is not None and value.isdigit():
                    found[pid] = int(value)
                break
    return found


def _parent_pid(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def _children(pid: int | None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children() if pid else []
    except psutil.Error:
        return []


def _not_distributed(
    pythons: list[psutil.Process], native: bool, nonblocking: bool, timeout: float
) -> NoReturn:
    """No rank here: say so, with the stack of what is there."""
    stacks = dump_stacks(
        [p.pid for p in pythons[:4]], timeout=timeout, native=native, nonblocking=nonblocking
    )
    lines = []
    for pid, stack in stacks.items():
        frames = stack.main.frames[:8] if stack.main else []
        lines.append(
            f"pid {pid}: "
            + " <- ".join(f"{f.function} ({relative(f.file, os.getcwd())}:{f.line})" for f in frames)
        )
    raise InputError(
        "not a distributed job: no process there has RANK and WORLD_SIZE in its environment",
        hint="Its stack, innermost first:\n  " + "\n  ".join(lines or ["(none readable)"]),
    )


def _frame_text(frame: Frame) -> str:
    return f"{relative(frame.file, os.getcwd())}:{frame.line} in {frame.function}"


def _site(cls: StackClass) -> str | None:
    return f"{relative(cls.site.file, os.getcwd())}:{cls.site.line}" if cls.site else None


def _where(cls: StackClass) -> str:
    if not cls.frames:
        return "?"
    return " -> ".join(f"{f.function}() {relative(f.file, os.getcwd())}:{f.line}" for f in cls.frames)
