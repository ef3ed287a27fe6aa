"""The warm server forks its ranks only once it is a single thread (launch/replay.py).

Python's ``join`` returns before the joined thread's OS thread has exited: its
thread-local destructors still run (MKL's takes its memory manager's lock, and a rank
forked then spins on that lock in its first matrix product). Here a destructor that
sleeps (libc's ``sleep``, given the key's value 1) holds the ended thread alive for a
second after ``join``, in a plain interpreter of its own (no torch, no xdist threads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")

PROGRAM = r"""
import ctypes, json, os, threading, time
from ncclcheck.launch.replay import _wait_until_single_threaded

libc = ctypes.CDLL(None, use_errno=True)
key = ctypes.c_uint()
assert libc.pthread_key_create(ctypes.byref(key), libc.sleep) == 0

def work():
    libc.pthread_setspecific(key, ctypes.c_void_p(1))  # at its exit: sleep(1)

thread = threading.Thread(target=work)
thread.start()
thread.join()
after_join = len(os.listdir("/proc/self/task"))
started = time.monotonic()
_wait_until_single_threaded()
print(json.dumps({
    "after_join": after_join,
    "after_wait": len(os.listdir("/proc/self/task")),
    "waited_s": time.monotonic() - started,
}))
"""


def test_the_ranks_are_forked_only_once_a_joined_thread_has_really_exited() -> None:
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout)
    assert seen["after_join"] == 2, seen  # join returned; the OS thread runs its destructor
    assert seen["after_wait"] == 1, seen
    assert seen["waited_s"] > 0.5, seen
