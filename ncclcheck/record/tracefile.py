"""A rank's trace file: JSON lines written into a shared memory map of the file.

Why a map and not ``write(2)``: a trace line is written before every collective,
and on a small gloo all_reduce the system call alone added 4% to the call (see
benchmarks/bench_preflight.py). A store into a ``MAP_SHARED`` mapping lands in
the page cache at once, so the record is as durable as a written one: it outlives
the rank whether it returns, raises, aborts (SIGABRT) or is killed (SIGKILL), and
a reader in another process sees it as soon as it is stored.

The file is grown ahead of the data in steps of ``GROWTH`` bytes, so until the
writer closes it (or preflight seals it after the job) it ends in zero bytes. The
text is ASCII JSON and never holds a zero byte: the first zero byte is the end of
the data. Readers use ``data_end`` or cut lines at the first ``\\0``.

No torch import here: the CLI reads traces without it.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

from ncclcheck.model import TextEnum
from ncclcheck.record.hotstate import new_state

GROWTH = 1 << 20  # bytes the file is extended by when the data reaches its end


class End(TextEnum):
    """How a rank ended: the ``how`` of its trace's exit record (written by
    record/bootstrap.py and record/lines.py, read by evidence/traces.py), and the two
    endings the launcher tells of a rank that wrote none."""

    RETURNED = "returned"  # the script ran to its end
    DRY_RUN_COMPLETE = "dry-run-complete"  # the dry run's budget stopped it, on every rank alike
    EXCEPTION = "exception"
    SYS_EXIT = "sys.exit"
    VIRTUAL_REFUSED = "virtual-refused"  # a virtual world's rank that cannot run alone
    OWN_LAUNCHER = "own-launcher"  # a rank that tried to start ranks of its own
    REPLAY_STOP = "replay-stop"  # a replay's rank stopped at its call of the divergence
    # written by no rank
    KILLED = "killed"  # no exit record, and a non-zero code from the launcher
    RUNNING = "running"  # no exit record, no code: still running when the job was read


# Writers of this process, so that a forked child (a DataLoader worker) stops
# writing: it would share the parent's mapping and write over the parent's lines.
_OPEN: weakref.WeakSet[TraceFile] = weakref.WeakSet()


def _stop_writing_in_child() -> None:
    for trace in list(_OPEN):
        trace.detach()


os.register_at_fork(after_in_child=_stop_writing_in_child)


_ZEROS = bytes(GROWTH)


def _write_zeros(fd: int, offset: int, length: int) -> None:
    """Extend the file with written zero bytes, not a hole: a store into a hole faults
    into the file system's read path, which zeroes the page there (about 230 ns more
    per call line on ext4 here than a store into a page already written)."""
    while length > 0:
        written = os.pwrite(fd, _ZEROS[: min(length, GROWTH)], offset)
        offset += written
        length -= written


class TraceFile:
    """Appends bytes to a file through a shared mapping. Thread-safe.

    Its offset, capacity and mapping live in ``state`` (hotstate.new_state), which
    the recorder's C fast path shares to store call lines without a lookup."""

    def __init__(self, path: str, state: Any = None) -> None:
        self.path = path
        self.state = state if state is not None else new_state(in_c=False)
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        _write_zeros(self._fd, 0, GROWTH)
        self.state.capacity = GROWTH
        self.state.end = 0
        self.state.map = mmap.mmap(self._fd, GROWTH, mmap.MAP_SHARED)
        self._lock = threading.Lock()
        _OPEN.add(self)

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def append(self, data: bytes) -> None:
        """Store ``data`` after what was written; a no-op once closed or in a forked child."""
        with self._lock:
            self.append_locked(data)

    def append_locked(self, data: bytes) -> None:
        """``append`` for a caller that holds ``lock`` already (the recorder's hot path)."""
        state = self.state
        mapped = state.map
        if mapped is None:
            return
        start = state.end
        end = start + len(data)
        if end > state.capacity:
            self._grow(end)
            mapped = state.map
        mapped[start:end] = data
        state.end = end

    def _grow(self, needed: int) -> None:
        state = self.state
        capacity = (needed // GROWTH + 1) * GROWTH
        _write_zeros(self._fd, state.capacity, capacity - state.capacity)
        state.map.resize(capacity)
        state.capacity = capacity

    def close(self) -> None:
        """Unmap, and cut the file to its data: a closed trace is plain JSON lines."""
        with self._lock:
            state = self.state
            if state.map is None:
                return
            state.map.close()
            state.map = None
            try:
                os.ftruncate(self._fd, state.end)
            finally:
                os.close(self._fd)
                self._fd = -1

    def detach(self) -> None:
        """In a forked child: forget the parent's mapping and file without touching them."""
        self.state.map = None
        self._fd = -1


def data_end(fd: int) -> int:
    """The length of the data in a trace file: the offset of its first zero byte, or its
    size. The data has no zero byte and the tail beyond it is all zero bytes, so a binary
    search over single bytes finds it in about 20 reads (a closed file: none)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) != b"\0":
        return size
    low, high = 0, size - 1  # the first zero byte is in [low, high]
    while low < high:
        middle = (low + high) // 2
        if os.pread(fd, 1, middle) == b"\0":
            high = middle
        else:
            low = middle + 1
    return low


def seal(path: str) -> None:
    """Cut a trace file its rank left open (killed, aborted) to its data."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        end = data_end(fd)
        if end < os.fstat(fd).st_size:
            os.ftruncate(fd, end)
    finally:
        os.close(fd)
