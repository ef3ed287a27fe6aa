"""Is a job stuck at all? Two looks at every rank a moment apart.

One stack dump cannot tell a hung job from one that trains: a rank of a healthy
job is inside a collective much of the time. So doctor looks twice and compares,
per rank, the main thread's frames and the values of the user's local variables
(a loop counter that went on, a line that changed). A hang needs ranks that did
not move. CPU time decides only where the backend is known: a rank that waits on
gloo sleeps, one that waits on NCCL spins its CPU at 100%; a process with neither
CUDA nor NCCL loaded cannot be on NCCL, so a rank of it that used the CPU computed
(DDP's backward at one line, a forward too long for two looks), it did not wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from ncclcheck.evidence.stacks import ProcessStack, ThreadStack
from ncclcheck.wording import relative, who

# A rank blocked in a gloo wait sleeps in the kernel: a few hundredths of a core at
# most (the watchdog, a logger thread). A fifth of a core is work, even on a machine
# another job loads.
COMPUTING_CORES = 0.2


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


def cpu_seconds(pids: dict[int, int]) -> dict[int, float]:
    """rank -> user + system CPU seconds of its process and of the processes it started
    (its DataLoader workers: a rank waiting for batches they make is working), for the
    ranks still there."""
    used: dict[int, float] = {}
    for rank, pid in pids.items():
        try:
            process = psutil.Process(pid)
            family = [process, *process.children(recursive=True)]
        except psutil.Error:
            continue
        total = 0.0
        for member in family:
            try:
                times = member.cpu_times()
            except psutil.Error:  # a worker that ended between the two calls
                continue
            total += times.user + times.system
        used[rank] = total
    return used


def compare(
    first: dict[int, ProcessStack],
    second: dict[int, ProcessStack],
    interval: float,
    cpu_before: dict[int, float],
    cpu_after: dict[int, float],
    cwd: str,
    without_gpu: frozenset[int] = frozenset(),
) -> Movement:
    """``without_gpu``: ranks whose process loaded neither CUDA nor NCCL (gloo's waits
    sleep there, so their CPU use is work)."""
    movement = Movement(interval)
    for rank in sorted(first):
        if rank in cpu_before and rank in cpu_after and interval > 0:
            movement.cores[rank] = max(0.0, cpu_after[rank] - cpu_before[rank]) / interval
        what = _what_moved(first[rank], second.get(rank), cwd)
        cores = movement.cores.get(rank, 0.0)
        if what is None and rank in without_gpu and cores >= COMPUTING_CORES:
            what = (
                f"same frames, but it and the processes it started (DataLoader workers) used {cores:.2f} "
                "of a core with no CUDA or NCCL loaded: a rank waiting on gloo sleeps, this one works"
            )
        if what is None:
            movement.still.append(rank)
        else:
            movement.moved[rank] = what
            if second.get(rank) is None or not second[rank].threads:
                movement.gone.append(rank)
    return movement


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
