"""launch/stop.py's STOP and watch's exit after a stop, without ranks. Each scenario runs
in a Python process of its own: a stop ends every process the one stopped started,
and a test's pytest process has others to keep."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from ncclcheck.commands.watch import stop_status

from ..conftest import REPO

# The scenarios start as from a terminal: under nohup (SIGHUP ignored) or a shell's
# background job (SIGINT ignored), STOP keeps an ignored signal ignored, as it should.
_AS_FROM_A_TERMINAL = (
    "import signal\n"
    "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
)


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def test_a_stop_in_a_held_stretch_is_raised_at_its_end_and_only_once() -> None:
    done = run_python(
        """
        import os, signal
        from ncclcheck.launch.stop import STOP, Stopped
        seen = []
        try:
            with STOP.listening():
                with STOP.held():
                    os.kill(os.getpid(), signal.SIGTERM)
                    seen.append("held to its end")
                seen.append("never")
        except Stopped as stop:
            seen.append(f"raised {stop} {stop.signum}")
        try:
            with STOP.listening():
                try:
                    os.kill(os.getpid(), signal.SIGHUP)
                    seen.append("never")
                except Stopped:
                    seen.append("raised at once")
                os.kill(os.getpid(), signal.SIGINT)  # a second stop: recorded, not raised
                seen.append(f"then recorded: {STOP.signals_seen} signals")
        except Stopped:
            seen.append("never")
        print(seen)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        ["held to its end", "raised SIGTERM 15", "raised at once", "then recorded: 2 signals"]
    )


def test_a_signal_ignored_when_listening_starts_stays_ignored_and_handlers_come_back() -> None:
    done = run_python(
        """
        import os, signal
        from ncclcheck.launch.stop import STOP
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
        before = signal.getsignal(signal.SIGTERM)
        with STOP.listening():
            os.kill(os.getpid(), signal.SIGHUP)
        print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is before)
        """
    )
    assert (done.returncode, done.stdout.strip()) == (0, "True True"), done.stderr


def test_a_stop_ends_the_processes_started_but_the_one_spared() -> None:
    done = run_python(
        """
        import os, signal, subprocess, sys, time
        from ncclcheck.launch.stop import STOP, Stopped
        sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
        with STOP.listening():
            spared, helper = subprocess.Popen(sleep), subprocess.Popen(sleep)
            STOP.spare(spared.pid)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except Stopped:
                pass
            print(helper.wait(timeout=10), spared.poll())
            spared.kill()
            spared.wait()
        """
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"{-signal.SIGKILL} None"), done.stderr


@pytest.mark.parametrize(
    ("returncode", "ran_on", "status"),
    [
        (1, True, 143),  # torchrun's own exit when a signal stops it
        (-15, True, 143),  # died of the signal passed on
        (-9, True, 143),  # killed after the grace: stopped by the signal all the same
        (0, True, 0),  # ended well within the grace
        (0, False, 0),  # had ended by itself before the signal
        (3, False, 3),
        (-6, False, 134),  # had died of a signal of its own
        (None, True, 143),
    ],
)
def test_watch_exits_with_the_jobs_status_after_a_sigterm(
    returncode: int | None, ran_on: bool, status: int
) -> None:
    assert stop_status(returncode, signal.SIGTERM, ran_on) == status


def test_a_stop_python_drops_in_a_weakref_callback_is_raised_again() -> None:
    """The signal's handler runs at the next bytecode, there inside a weakref callback,
    whose exceptions Python prints and drops (seen: watch stopped at start-up ran its job
    to the end): the stop comes again, once, and is not counted as a second signal."""
    done = run_python(
        """
        import os, signal, time, weakref
        from ncclcheck.launch.stop import STOP, Stopped

        class Job:
            pass

        def collected(_ref):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100000):  # the handler runs here, inside the callback
                pass

        seen = []
        try:
            with STOP.listening():
                job = Job()
                ref = weakref.ref(job, collected)
                del job
                time.sleep(5)
                seen.append("never")
        except Stopped as stop:
            seen.append(f"raised {stop} after {STOP.signals_seen} signal, {STOP.raised_again} time again")
        print(seen)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(["raised SIGINT after 1 signal, 1 time again"]), done.stderr
    assert "Exception ignored" not in done.stderr  # the drop is handled, not reported
