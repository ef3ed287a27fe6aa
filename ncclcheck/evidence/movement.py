"""Is a job stuck at all? Two looks at every rank a moment apart.

One stack dump cannot tell a hung job from one that trains: a rank of a healthy
job is inside a collective much of the time. So doctor looks twice and compares,
per rank, the main thread's frames and the values of the user's local variables
(a loop counter that went on, a line that changed). A hang needs ranks that did
not move. CPU time decides only where the backend is known: a rank that waits on
gloo sleeps, one that waits on NCCL spins its CPU at 100%; a process with neither
CUDA nor NCCL loaded cannot be on NCCL, so a rank of it that used the CPU computed
(DDP's backward at one line, a forward too long for two looks), it did not wait.

CPU used is a share of a machine others load: a rank that computes on two cores
shared by eight processes gets a quarter of a core. Its main thread's time
running or ready to run (/proc schedstat) does not depend on the load: near all
of the interval for a thread that computes, near none for one that sleeps in a
wait. A rank that writes a checkpoint may do neither: it sits in the disk's
queue (state D) or copies megabytes through write(2), so what it read and wrote
between the looks, and its main thread's state at each look, are work too, on
any backend (a rank waiting for a peer moves no bytes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ncclcheck.evidence.stacks import ProcessStack, ThreadStack
from ncclcheck.wording import relative, who

# A rank blocked in a gloo wait sleeps in the kernel: a few hundredths of a core at
# most (the watchdog, a logger thread). A fifth of a core is work, even on a machine
# another job loads.
COMPUTING_CORES = 0.2
# A main thread running or ready to run half of the interval computes, whatever its
# share of the CPU was; one that waits on a peer is ready for a few milliseconds.
COMPUTING_RUNNABLE = 0.5
# Bytes read and written (files, pipes, sockets) over the interval that are work: a
# checkpoint or a data shard moves megabytes; a log line or a metrics heartbeat of a
# stuck rank's background thread moves a few kilobytes.
MOVING_BYTES = 1 << 20


@dataclass(frozen=True)
class Usage:
    """One rank's resource counters at a look: its process and those it started."""

    cpu_seconds: float = 0.0  # user + system, the process and its children
    io_bytes: int = 0  # read and written through system calls, the process and its children
    main_runnable_seconds: float | None = None  # main thread running or ready to run
    main_state: str = ""  # psutil's status of the main thread at the look


@dataclass
class Movement:
    """What changed between two looks ``interval`` seconds apart."""

    interval: float
    moved: dict[int, str] = field(default_factory=dict)  # rank -> what moved
    still: list[int] = field(default_factory=list)
    cores: dict[int, float] = field(default_factory=dict)  # rank -> CPU used, in cores
    gone: list[int] = field(default_factory=list)  # moved only by vanishing: no work seen

    @property
    def working(self) -> list[int]:
        """The ranks seen doing something between the looks (not merely gone)."""
        return sorted(r for r in self.moved if r not in self.gone)

    @property
    def everyone_moved(self) -> bool:
        return bool(self.moved) and not self.still

    def lines(self) -> list[str]:
        said = [f"rank {rank}: {what}" for rank, what in sorted(self.moved.items())]
        if self.still:
            said.append(f"{who(self.still)}: same frames and local values after {self.interval:g} s")
        if self.cores:
            low, high = min(self.cores.values()), max(self.cores.values())
            said.append(
                f"CPU over the {self.interval:g} s: {low:.2f}-{high:.2f} of a core per rank (a rank "
                "waiting on gloo sleeps, one waiting on NCCL spins at 100%: CPU decides only for a "
                "process with no CUDA or NCCL loaded)"
            )
        return said

    def decided(self) -> str:
        """Which evidence decided, in a sentence."""
        if self.everyone_moved:
            return (
                f"every rank moved between two looks {self.interval:g} s apart (its stack or a "
                "local value changed, or it computed with no GPU library loaded): the job is "
                "making progress, not hung"
            )
        if self.moved:
            return (
                f"{who(sorted(self.moved))} moved between two looks {self.interval:g} s apart, "
                f"{who(self.still)} did not"
            )
        return f"no rank moved between two looks {self.interval:g} s apart (same frames, same local values)"


def usage(pids: dict[int, int]) -> dict[int, Usage]:
    """rank -> its counters now, for the ranks still there. The CPU and the bytes count
    the processes it started too (its DataLoader workers: a rank waiting for batches
    they make is working)."""
    used: dict[int, Usage] = {}
    for rank, pid in pids.items():
        try:
            process = psutil.Process(pid)
            state = process.status()
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        cpu, moved_bytes = 0.0, 0
        for member in family:
            try:
                with member.oneshot():
                    times = member.cpu_times()
                    cpu += times.user + times.system
                    moved_bytes += _io_bytes(member)
            except psutil.Error:  # a worker that ended between the two calls
                continue
        used[rank] = Usage(cpu, moved_bytes, _runnable_seconds(pid), state)
    return used


def _io_bytes(process: psutil.Process) -> int:
    try:
        counters = process.io_counters()
    except (psutil.Error, AttributeError, NotImplementedError):  # not on every platform
        return 0
    # read_chars/write_chars (Linux): every read(2)/write(2), page cache included; the
    # storage bytes elsewhere
    return int(getattr(counters, "read_chars", counters.read_bytes)) + int(
        getattr(counters, "write_chars", counters.write_bytes)
    )


def _runnable_seconds(pid: int) -> float | None:
    """The main thread's time on a CPU plus its time waiting for one (Linux schedstat)."""
    try:
        running_ns, waiting_ns, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:3]
    except (OSError, ValueError):
        return None
    return (int(running_ns) + int(waiting_ns)) / 1e9


def compare(
    first: dict[int, ProcessStack],
    second: dict[int, ProcessStack],
    interval: float,
    before: dict[int, Usage],
    after: dict[int, Usage],
    cwd: str,
    without_gpu: frozenset[int] = frozenset(),
) -> Movement:
    """``before``/``after``: each rank's counters at the two looks; ``without_gpu``:
    ranks whose process loaded neither CUDA nor NCCL (gloo's waits sleep there, so their
    CPU use is work)."""
    movement = Movement(interval)
    for rank in sorted(first):
        was, now = before.get(rank), after.get(rank)
        if was is not None and now is not None and interval > 0:
            movement.cores[rank] = max(0.0, now.cpu_seconds - was.cpu_seconds) / interval
        what = _what_moved(first[rank], second.get(rank), cwd)
        if what is None and was is not None and now is not None:
            what = _what_it_used(was, now, interval, movement.cores.get(rank, 0.0), rank in without_gpu)
        if what is None:
            movement.still.append(rank)
        else:
            movement.moved[rank] = what
            if second.get(rank) is None or not second[rank].threads:
                movement.gone.append(rank)
    return movement


def _what_it_used(was: Usage, now: Usage, interval: float, cores: float, without_gpu: bool) -> str | None:
    """Work the counters show where the stacks did not move, said as evidence; None: none."""
    moved_bytes = now.io_bytes - was.io_bytes
    if moved_bytes >= MOVING_BYTES:
        return (
            f"same frames, but it and the processes it started read or wrote {moved_bytes / 1e6:.1f} MB "
            "(files, pipes, sockets) between the looks: a rank waiting for a peer moves no bytes"
        )
    if psutil.STATUS_DISK_SLEEP in (was.main_state, now.main_state):
        return "same frames, but its main thread was waiting for the disk at a look (state D): it does I/O"
    if not without_gpu or interval <= 0:
        return None  # a rank waiting on NCCL spins: its CPU says nothing
    if cores >= COMPUTING_CORES:
        return (
            f"same frames, but it and the processes it started (DataLoader workers) used {cores:.2f} "
            "of a core with no CUDA or NCCL loaded: a rank waiting on gloo sleeps, this one works"
        )
    if was.main_runnable_seconds is not None and now.main_runnable_seconds is not None:
        runnable = (now.main_runnable_seconds - was.main_runnable_seconds) / interval
        if runnable >= COMPUTING_RUNNABLE:
            return (
                f"same frames, but its main thread was running or ready to run {min(runnable, 1.0):.0%} "
                f"of the {interval:g} s (it got {cores:.2f} of a core on a loaded machine), with no "
                "CUDA or NCCL loaded: a rank waiting on gloo sleeps, this one works"
            )
    return None


def _what_moved(before: ProcessStack, after: ProcessStack | None, cwd: str) -> str | None:
    if after is None or (after.error and not after.threads):
        return "gone or unreadable at the second look"
    old, new = before.main, after.main
    if old is None or new is None:
        return None if old is new else "its main thread changed"
    old_frames, new_frames = _frames(old), _frames(new)
    if old_frames != new_frames:
        line_before, line_after = _innermost(old, cwd), _innermost(new, cwd)
        if line_before == line_after:
            return f"its stack changed below {line_before} (in library code)"
        return f"its stack changed ({line_before} -> {line_after})"
    for index, (was, now) in enumerate(zip(old.locals, new.locals, strict=False)):
        if not old.is_user(index):
            continue
        changed = sorted(
            (k for k in was.keys() & now.keys() if was[k] != now[k]),
            key=lambda k: (" at 0x" in was[k], k),  # a counter says more than a new object
        )
        if changed:
            name, function = changed[0], old.frames[index].function
            if " at 0x" in was[name]:
                return f"{name} in {function}() is a new object"
            return f"{name} in {function}() went from {was[name]} to {now[name]}"
    return None


def _frames(thread: ThreadStack) -> list[tuple[str, int, str]]:
    return [(f.file, f.line, f.function) for f in thread.frames]


def _innermost(thread: ThreadStack, cwd: str) -> str:
    user = [f for i, f in enumerate(thread.frames) if thread.is_user(i)]
    frame = user[0] if user else thread.frames[0] if thread.frames else None
    return f"{relative(frame.file, cwd)}:{frame.line}" if frame else "?"
