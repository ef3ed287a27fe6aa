"""Is a quiet dry run still working? What its processes do, sampled as it runs.

A rank that waits in a collective sleeps: its main thread is in state S and the
whole rank costs about 0.01 of a core (gloo's and the recorder's background
threads). A rank that computes (imports torch._dynamo inside DDP's constructor,
tokenises a data set, runs a long first step) is running or waiting for the
disk. Trace writes alone cannot tell them apart: 16 ranks on 2 cores spend 16 s
in DDP's constructor without writing a line.

The sample covers the launcher's process and every process under it, not only
the ranks that have said hello: a rank still importing torch has written nothing
yet, a rank that waits on its DataLoader workers sleeps while they compute, and a
script that starts its own ranks (mp.spawn, Lightning's ddp_spawn) is the
launcher: it imports and builds its model for many seconds before any rank exists.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import psutil

# The job's CPU use, in cores, above which it computes: a floor, plus what a
# sleeping process costs on its own (16 idle ranks measured 0.09-0.16 cores).
_BUSY_CORES_FLOOR = 0.3
_IDLE_CORES_PER_PROCESS = 0.015
_WORKING_STATES = (psutil.STATUS_RUNNING, psutil.STATUS_DISK_SLEEP)


@dataclass(frozen=True)
class Sample:
    at: float
    cpu_seconds: float  # user + system used by the processes since the first sample
    processes: int
    working: int  # processes running or waiting for the disk at this instant


class JobActivity:
    """Samples ``root_pid`` (torchrun, or a script that starts its own ranks) and the
    processes under it, and says whether they work.

    ``busy()`` judges the last ``window_s`` seconds: busy when the processes used
    more CPU than sleeping ones do, or when some process was running or in disk
    wait in at least half of the samples.
    """

    def __init__(self, root_pid: int, window_s: float = 2.0, refresh_s: float = 2.0) -> None:
        self.root_pid = root_pid
        self.window_s = window_s
        self.refresh_s = refresh_s
        self._processes: dict[int, psutil.Process] = {}
        self._cpu_seen: dict[int, float] = {}  # pid -> its cpu seconds when last sampled
        self._cpu_used = 0.0  # since the first sample, over every process ever sampled
        self._refreshed = float("-inf")
        self._samples: deque[Sample] = deque()
        self.extra_pids: set[int] = set()  # ranks known by their hello line (own sessions)

    def _refresh(self, now: float) -> None:
        """Find the processes again: ranks and their workers come and go."""
        self._refreshed = now
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.root_pid)
            found[root.pid] = root
            for child in root.children(recursive=True):
                found[child.pid] = child
        except psutil.Error:
            pass
        for pid in self.extra_pids - found.keys():
            try:
                process = psutil.Process(pid)
                found[pid] = process
                for child in process.children(recursive=True):
                    found.setdefault(child.pid, child)
            except psutil.Error:
                continue
        # keep the Process objects already held: psutil checks a pid was not reused by them
        self._processes = {pid: self._processes.get(pid, process) for pid, process in found.items()}
        # forget the exited: a reused pid starts from its own CPU time, not theirs
        self._cpu_seen = {pid: cpu for pid, cpu in self._cpu_seen.items() if pid in found}

    def sample(self, now: float | None = None) -> Sample:
        now = time.monotonic() if now is None else now
        if now - self._refreshed >= self.refresh_s:
            self._refresh(now)
        working = 0
        for pid, process in list(self._processes.items()):
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    status = process.status()
            except psutil.Error:
                self._processes.pop(pid, None)
                self._cpu_seen.pop(pid, None)
                continue
            cpu = times.user + times.system
            # a process seen for the first time counts from now, not from its start
            self._cpu_used += cpu - self._cpu_seen.get(pid, cpu)
            self._cpu_seen[pid] = cpu
            if status in _WORKING_STATES:
                working += 1
        taken = Sample(now, self._cpu_used, len(self._processes), working)
        self._samples.append(taken)
        while self._samples and now - self._samples[0].at > self.window_s:
            self._samples.popleft()
        return taken

    def busy(self) -> bool:
        """Did the job work over the last window? False until half of it is sampled."""
        if len(self._samples) < 2:
            return False
        first, last = self._samples[0], self._samples[-1]
        span = last.at - first.at
        if span < self.window_s / 2:
            return False
        cores = (last.cpu_seconds - first.cpu_seconds) / span
        threshold = _BUSY_CORES_FLOOR + _IDLE_CORES_PER_PROCESS * last.processes
        if cores >= threshold:
            return True
        working_samples = sum(1 for s in self._samples if s.working)
        return working_samples * 2 >= len(self._samples)
