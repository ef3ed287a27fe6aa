"""Each rank's GPU, through NVML: which rank is the odd one when every stack looks alike.

On NCCL the ranks that wait inside a collective's kernel keep their GPU at 100%
utilisation, while a rank that never launched the kernel (it is elsewhere on the
host: in its data, a checkpoint, a branch the others did not take) leaves its GPU
idle. People find the culprit with ``nvidia-smi`` by eye; this reads the same
figures per rank. NVML comes from ``nvidia-ml-py`` (``pip install
'ncclcheck[gpu]'``); without it, or on a job that maps no CUDA library, doctor
says what it could not read and goes on.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from typing import Any

from ncclcheck.wording import who

_BUSY = 90  # utilisation (%) of a GPU spinning in an NCCL kernel
_IDLE = 10


@dataclass
class GpuReading:
    """Per rank: its GPU's index, utilisation (%) and memory used (GiB)."""

    used: dict[int, tuple[int, int, float]] = field(default_factory=dict)
    note: str | None = None  # why nothing (or not everything) was read

    def lines(self) -> list[str]:
        said = [
            f"rank {r}: GPU {gpu} at {busy}% utilisation, {mem:.1f} GiB"
            for r, (gpu, busy, mem) in sorted(self.used.items())
        ]
        return said + ([self.note] if self.note else [])

    def odd_ones(self) -> tuple[list[int], list[int]] | None:
        """(idle ranks, busy ranks) when some GPUs spin and others idle: the idle ranks
        never launched the collective the busy ones wait in."""
        idle = sorted(r for r, (_g, busy, _m) in self.used.items() if busy <= _IDLE)
        busy = sorted(r for r, (_g, b, _m) in self.used.items() if b >= _BUSY)
        if idle and busy and len(idle) < len(busy) + len(idle):
            return idle, busy
        return None

    def verdict(self) -> str | None:
        odd = self.odd_ones()
        if odd is None:
            return None
        idle, busy = odd
        return (
            f"the GPUs of {who(idle)} idle while those of {who(busy)} spin at 100% (NCCL kernels "
            f"waiting for a partner): {who(idle)} never launched the collective the others wait in"
        )


def maps_cuda(pid: int) -> bool:
    """Whether the process has loaded CUDA or NCCL (a GPU job)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            return any("libcuda.so" in line or "libnccl" in line for line in maps)
    except OSError:
        return False


def read(pids: dict[int, int], nvml: Any = None) -> GpuReading | None:
    """rank -> pid, read through NVML; None for a job with no GPU. ``nvml``: the pynvml
    module (tests pass a stand-in; by default it is imported, if installed)."""
    if nvml is None:
        if not any(maps_cuda(pid) for pid in pids.values()):
            return None
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return GpuReading(
                note="GPU utilisation not read: nvidia-ml-py is not installed (pip install 'ncclcheck[gpu]')"
            )
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVML's own error types, a missing driver
        return GpuReading(note=f"GPU utilisation not read: NVML did not start ({exc})")
    reading = GpuReading()
    try:
        by_pid: dict[int, tuple[int, int, float]] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            busy = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                memory = (process.usedGpuMemory or 0) / 2**30
                by_pid[int(process.pid)] = (index, busy, memory)
        for rank, pid in pids.items():
            if pid in by_pid:
                reading.used[rank] = by_pid[pid]
        unseen = sorted(set(pids) - set(reading.used))
        if unseen:
            # in a container, NVML reports host pids: the ranks are not found by theirs
            reading.note = f"{who(unseen)}: no GPU process with their pid (a container's pid namespace?)"
    except Exception as exc:
        reading.note = f"GPU utilisation not fully read: {exc}"
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return reading
