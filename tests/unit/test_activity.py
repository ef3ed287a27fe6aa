"""ncclcheck.evidence.activity on real processes: a job that sleeps is idle, one whose grandchild
(a DataLoader worker, a rank under torchrun) computes is busy, and CPU a process used
before it was first seen does not count."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ncclcheck.evidence.activity import JobActivity
from ncclcheck.launch.proctree import kill_tree

SLEEP = "import time; time.sleep(60)"
SPIN = "import time\nend = time.time() + 60\nwhile time.time() < end: pass"


def parent_of(child_code: str, *, burn_first_s: float = 0.0) -> str:
    """A parent that sleeps (as torchrun's agent does) over one child running child_code."""
    return (
        "import subprocess, sys, time\n"
        f"end = time.time() + {burn_first_s}\n"
        "while time.time() < end: pass\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
        "child.wait()\n"
    )


@contextmanager
def job(code: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=30)


def judge(root_pid: int, seconds: float = 2.5) -> tuple[bool, int]:
    activity = JobActivity(root_pid, window_s=2.0, refresh_s=0.5)
    end = time.monotonic() + seconds
    processes = 0
    while time.monotonic() < end:
        processes = max(processes, activity.sample().processes)
        time.sleep(0.1)
    return activity.busy(), processes


def wait_for_grandchild(root_pid: int, bound_s: float = 20.0) -> None:
    import psutil

    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        children = psutil.Process(root_pid).children(recursive=True)
        if len(children) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError("the grandchild never started")


def test_a_job_whose_processes_sleep_is_idle() -> None:
    with job(parent_of(parent_of(SLEEP))) as proc:
        wait_for_grandchild(proc.pid)
        busy, processes = judge(proc.pid)
    assert processes == 3  # the root (torchrun, or a script that spawns its ranks) and both below
    assert not busy


def test_a_computing_grandchild_makes_the_job_busy() -> None:
    with job(parent_of(parent_of(SPIN))) as proc:
        wait_for_grandchild(proc.pid)
        busy, _ = judge(proc.pid)
    assert busy


def test_a_computing_root_makes_the_job_busy() -> None:
    """A script that starts its own ranks (mp.spawn, Lightning's ddp_spawn) is the root:
    it imports and builds its model for seconds before any rank exists, and was called
    idle, so a slow first import (a new machine) ended the dry run before it spawned."""
    with job(SPIN) as proc:
        busy, processes = judge(proc.pid)
    assert (busy, processes) == (True, 1)


def test_cpu_used_before_the_first_sample_does_not_count() -> None:
    # the child burns 2 s, then sleeps over its own child: seen only afterwards, it is idle
    with job(parent_of(parent_of(SLEEP, burn_first_s=2.0))) as proc:
        wait_for_grandchild(proc.pid)
        busy, _ = judge(proc.pid)
    assert not busy


def test_an_exited_root_leaves_nothing_to_sample() -> None:
    with job("pass") as proc:
        proc.wait(timeout=30)
        activity = JobActivity(proc.pid)
        assert activity.sample().processes == 0
        assert not activity.busy()
