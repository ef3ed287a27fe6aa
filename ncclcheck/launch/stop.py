"""Stops asked by a signal: SIGINT (Ctrl-C), SIGTERM (``timeout``, Slurm's scancel, a
Kubernetes pod's termination) and SIGHUP (the terminal or the ssh session went away).

preflight turns a stop into an incomplete run (exit 4): the command line listens for
one from its first lines (listen_early), cli/preflight.py again from its own;
whatever starts the ranks (run_dry, a virtual world's server) installs its own handler
and, when a stop was asked already, stops at once. The run is then incomplete, as a
stop later in the run makes it, instead of preflight dying of the signal or the launch
being called a failure.

doctor, probe and watch listen through ``STOP.listening()``: the first stop signal ends
the processes the command started (py-spy, a probe's torchrun and its ranks; never the
job watch started, which is spared: watch forwards the signal to it and gives it time)
and raises ``Stopped`` in the main thread, which abandons whatever it was doing (a
sleep, a wait, a py-spy dump) on its way to the cleanup. Stretches that must not be cut
in the middle, where a process or a temporary folder would be made and not yet known
(starting a process, making a folder, a cleanup), run under ``STOP.held()``: a stop
during one is raised at its end. A ``Stopped`` raised while Python runs a finalizer or
a weakref callback (the handler runs at the main thread's next bytecode, wherever that
is) is printed and dropped by Python: it is raised again, from the signal sent once more
to this process, so a stop is never lost. A signal ignored when the command started stays
ignored (``nohup``'s SIGHUP, SIGINT in a shell's background job): the caller asked for
a run that outlives it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import psutil

from ncclcheck.launch.proctree import kill_tree

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

STOP_ASKED = threading.Event()


def stopped_exit_code(signum: int) -> int:
    """The status a shell gives a process a signal ended: 130 SIGINT, 143 SIGTERM, 129 SIGHUP."""
    return 128 + signum


def _listened_to() -> list[signal.Signals]:
    return [stop for stop in STOP_SIGNALS if signal.getsignal(stop) is not signal.SIG_IGN]


def listen_for_a_stop() -> None:
    """From now on, Ctrl-C, SIGTERM and SIGHUP set STOP_ASKED instead of ending the process."""
    for stop in _listened_to():
        signal.signal(stop, lambda *_: STOP_ASKED.set())


def listen_early(argv: list[str]) -> None:
    """Listen from the interpreter's first lines when the command is preflight: typer,
    rich and the commands take a second or more to import on a loaded machine, and a
    CI job's SIGTERM in that second would otherwise end preflight by the signal."""
    command = next((arg for arg in argv[1:] if not arg.startswith("-")), None)
    if command == "preflight":
        listen_for_a_stop()


class Stopped(BaseException):
    """A stop signal, raised in the main thread as Ctrl-C raises KeyboardInterrupt: a
    BaseException, so that no ``except Exception`` on its way to the cleanup keeps it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def end_children(spared: frozenset[int] = frozenset()) -> None:
    """End every process this one started, with its whole tree, but ``spared``."""
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return
    for child in children:
        if child.pid not in spared:
            kill_tree(child.pid, timeout=2.0)


class SignalStop:
    """The stop signals of one command run (module docstring); one per process, ``STOP``."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.signum: int | None = None  # the first stop signal, once one came
        self.signals_seen = 0  # a second one cuts the grace a stopped job gets
        self._listening = False
        self._raised = False
        self._held = 0
        self._spared: set[int] = set()
        self._sent_again = False  # the signal this process sent itself: not a second stop
        self.raised_again = 0  # Stopped raised again after Python dropped it

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Stop signals raise ``Stopped`` inside the block; every process the command
        started and still running after a stop is ended when it is left."""
        if threading.current_thread() is not threading.main_thread():
            yield  # only the main thread has signal handlers
            return
        self._reset()  # a fresh run (tests invoke several commands in one process)
        previous = {stop: signal.signal(stop, self._on_signal) for stop in _listened_to()}
        previous_hook = sys.unraisablehook
        sys.unraisablehook = functools.partial(self._on_unraisable, previous_hook)
        self._listening = True
        try:
            yield
        finally:
            self._listening = False  # a stop from here on is only recorded
            if self.signum is not None:
                end_children()
            for stop, handler in previous.items():
                signal.signal(stop, handler)
            sys.unraisablehook = previous_hook

    def _on_unraisable(self, previous: Callable[[Any], object], unraisable: Any) -> None:
        """A ``Stopped`` Python dropped (raised inside a finalizer or a weakref callback,
        seen: watch's SIGINT at start-up, the job run on untouched) is raised again: the
        same signal, sent to this process from another thread 50 ms later, so that it
        arrives once this hook has returned (sent from here, or at once while the hook
        still waits for that thread to start, its handler runs inside the hook, which
        drops it too; should it land in a callback again, this comes again)."""
        stopped = unraisable.exc_value
        if isinstance(stopped, Stopped) and self._listening and self._raised:
            self._raised = False
            self._sent_again = True
            self.raised_again += 1
            resend = threading.Timer(0.05, os.kill, args=(os.getpid(), stopped.signum))
            resend.daemon = True
            resend.start()
            return
        previous(unraisable)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """A stop signal during the block is raised at its end, not in its middle."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
        if self.signum is not None and self._may_raise():
            self._raise()

    def spare(self, pid: int) -> None:
        """A process a stop does not end with the others (the job watch started)."""
        self._spared.add(pid)

    def _may_raise(self) -> bool:
        return self._listening and not self._raised and self._held == 0

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self._sent_again:
            self._sent_again = False
        else:
            self.signals_seen += 1
        if self.signum is None:
            self.signum = signum
        if self._may_raise():
            self._raise()

    def _raise(self) -> None:
        assert self.signum is not None
        self._raised = True  # once: the cleanup that follows runs to its end
        end_children(frozenset(self._spared))
        raise Stopped(self.signum)


STOP = SignalStop()
