"""Every command stopped by SIGTERM, SIGINT or SIGHUP, on real torchrun ranks (gloo) and
real py-spy: the job watch started gets the signal and ends with watch's exit being its
status; a job watch or doctor only looked at is left running, unpaused; and whatever
the command started, and every temporary file it made, is gone.

Each signal goes to the command's own pid alone (as Kubernetes sends it to a container's
first process, as ``kill`` does), the harder case: torchrun and the ranks run in
sessions of their own and see nothing of it unless the command passes it on. The
moment is picked by what can be seen (a process started, a line printed, a file
written), never by a fixed sleep; every wait is bounded, and every process a test
starts is reaped even when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from ncclcheck.launch.proctree import descendants, kill_tree

from ..conftest import PREFLIGHT_BOUND_S, REPO, SCRIPTS, TEST_MARK, processes_marked

# every command here runs as from a terminal (conftest.signals_not_ignored)
pytestmark = [pytest.mark.ranks, pytest.mark.usefixtures("signals_not_ignored")]

JOB = SCRIPTS / "steady_or_stuck.py"
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
BOUND_S = PREFLIGHT_BOUND_S  # a whole command run, start to end: at least preflight's own limit
GONE_S = 30.0  # for the processes of a stopped command to go
QUICK = ["--after", "1", "--every", "0.5"]  # watch: a hang captured a second after it starts


def _name(stop: signal.Signals) -> str:
    return stop.name


def wait_until(condition: Callable[[], object], what: str, bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {bound_s:.0f} s: {what}")
        time.sleep(0.02)


class Command:
    """``python -m ncclcheck ARGS`` in a session of its own, its stdout and stderr read
    together as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ncclcheck", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        """Until ``condition`` holds; the command ending first fails the test with its output."""
        try:
            wait_until(lambda: condition() or self.proc.poll() is not None, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output[-3000:]}") from None
        ended = self.proc.poll()
        assert ended is None, f"ended ({ended}) before {what}:\n{self.output[-3000:]}"

    def children(self, fragment: str) -> list[psutil.Process]:
        found = []
        for proc in descendants(self.proc.pid):
            try:
                if fragment in " ".join(proc.cmdline()):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def stop(self, stop: signal.Signals) -> int:
        """Send ``stop`` to the command alone and wait for its end: its exit code."""
        self.proc.send_signal(stop)
        self.proc.wait(timeout=BOUND_S)
        self._reader.join(30)
        return self.proc.returncode

    def reap(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait(timeout=30)


@pytest.fixture
def user_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The TMPDIR every process of the test sees: what a command leaves there is seen."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def left_in(folder: Path, allowed: tuple[str, ...] = ()) -> list[str]:
    """What is in ``folder`` but the names starting with one of ``allowed``."""
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith(allowed))


# torchrun's agent leaves a log folder (torchelastic_*) in TMPDIR at each start, stopped
# or not, as it does for anyone who runs it: the job's, not watch's
TORCHRUNS_OWN = ("torchelastic_",)


def no_process_left(mark: str) -> None:
    """Every process carrying ``mark`` ends within GONE_S (a rank killed with its torchrun
    is reaped by init, seconds later in a container)."""
    me = os.getpid()
    wait_until(
        lambda: not [pid for pid in processes_marked(mark) if pid != me], f"processes of {mark} gone", GONE_S
    )


@pytest.fixture
def job_mark(mark_processes: str) -> str:
    """The mark of a job the test starts for a command to look at: the command's own
    processes carry the test's mark, the job's this one."""
    return f"{mark_processes}-job"


@pytest.fixture
def running_job(job_mark: str, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A hung 2-rank job (rank 0 in an all_reduce, rank 1 in a barrier) under torchrun,
    started by the test, its output in a pipe, its TMPDIR apart from the command's;
    reaped at the end whatever happens."""
    job_tmp = tmp_path / "job-tmp"
    job_tmp.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(JOB)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env={**os.environ, "MODE": "stuck", TEST_MARK: job_mark, "TMPDIR": str(job_tmp)},
        start_new_session=True,
    )
    try:
        yield job
    finally:
        kill_tree(job.pid)
        job.wait(timeout=30)
        wait_until(lambda: not processes_marked(job_mark), "the job's processes gone", GONE_S)


def job_intact(job: subprocess.Popen[str], job_mark: str, ranks: int | None = 2) -> None:
    """torchrun and its ``ranks`` all running (None: those it started so far), none left
    stopped by a py-spy cut short."""
    assert job.poll() is None, "the job ended"
    processes = [psutil.Process(pid) for pid in processes_marked(job_mark)]
    if ranks is not None:
        assert len(processes) == 1 + ranks, processes
    states = {proc.pid: proc.status() for proc in processes}
    assert not [s for s in states.values() if s in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)], (
        states
    )


def wait_for_ranks(job: subprocess.Popen[str], ranks: int = 2) -> None:
    """Until each rank printed that its process group is made."""
    seen: list[str] = []

    def read() -> None:
        assert job.stdout is not None
        for line in job.stdout:
            seen.append(line)  # two ranks' lines may come run together: the text is searched
            if all(f"rank {rank} up" in "".join(seen) for rank in range(ranks)):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(BOUND_S)
    assert not reader.is_alive(), "the job's ranks did not come up: " + "".join(seen)[-2000:]


@pytest.fixture
def dumps_seen(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The real py-spy behind a script that leaves a file as each dump begins: a moment
    a test can wait for, where a dump's tens of milliseconds are easily missed by
    polling. The environment that sets it up, and the folder of those files."""
    from ncclcheck.evidence.stacks import ENV_PY_SPY, find_py_spy

    begun = tmp_path / "dumps-begun"
    begun.mkdir()
    marking = tmp_path / "py-spy"
    marking.write_text(f'#!/bin/sh\ntouch "{begun}/dump-$$"\nexec "{find_py_spy()}" "$@"\n')
    marking.chmod(0o755)
    return {ENV_PY_SPY: str(marking)}, begun


# -- watch, the job it started ------------------------------------------------------------


@pytest.mark.parametrize("stop", SIGNALS, ids=_name)
@pytest.mark.parametrize("moment", ["start-up", "running", "capture"])
def test_a_signal_to_watch_reaches_the_job_it_started_and_leaves_nothing(
    stop: signal.Signals, moment: str, tmp_path: Path, user_tmp: Path, mark_processes: str
) -> None:
    out = tmp_path / "watch"
    mode = "stuck" if moment == "capture" else "steady"
    watch = Command("watch", *QUICK, "--out", str(out), "--nproc-per-node", "2", str(JOB), env={"MODE": mode})
    try:
        if moment == "start-up":  # torchrun started, its ranks not yet
            watch.wait_for(lambda: watch.children("torch.distributed.run"), "torchrun started")
        elif moment == "running":  # a healthy job, well into its steps
            watch.wait_for(lambda: "step 20" in watch.output, "the job's steps")
        else:  # a hang seen, its stacks being dumped and diagnosed
            watch.wait_for(lambda: "capturing every rank" in watch.output, "a capture")
        code = watch.stop(stop)
        # the job's status: it was running, and it ended of the signal watch passed on
        assert code == 128 + stop, watch.output[-3000:]
        assert f"ncclcheck watch: stopped by {stop.name} while" in watch.output, watch.output[-3000:]
        assert f"forwarded {stop.name} to the job it started" in watch.output
        no_process_left(mark_processes)
        assert left_in(user_tmp, TORCHRUNS_OWN) == []
        if moment == "capture":  # what it had of the hang, and why it stopped, in the folder
            (capture,) = out.iterdir()
            note = (capture / "watch-stopped.txt").read_text()
            assert note.startswith(f"ncclcheck watch was stopped by {stop.name} while capturing a hang"), note
            assert "rank 0 up" in (capture / "job-output.log").read_text()
    finally:
        watch.reap()


# -- watch --pid: the job is never signalled -------------------------------------------------


@pytest.mark.parametrize("stop", SIGNALS, ids=_name)
def test_a_signal_to_watch_by_pid_leaves_the_job_running_and_nothing_of_its_own(
    stop: signal.Signals,
    tmp_path: Path,
    user_tmp: Path,
    mark_processes: str,
    job_mark: str,
    running_job: subprocess.Popen[str],
    dumps_seen: tuple[dict[str, str], Path],
) -> None:
    """One job, three watches on it, each stopped at another moment: while it waits for
    the ranks to start (or at its first look, where they started first), while it
    watches, while it captures the hang."""
    env, begun = dumps_seen
    pid = str(running_job.pid)
    for moment in ("start-up", "watching", "capture"):
        if moment == "watching":
            wait_for_ranks(running_job)
            for old in begun.iterdir():
                old.unlink()
        out = tmp_path / moment
        after = QUICK if moment == "capture" else ["--after", "100", "--every", "0.5"]
        watch = Command("watch", *after, "--out", str(out), "--pid", pid, env=env)
        try:
            if moment == "start-up":  # where the ranks came first, at its first look
                watch.wait_for(
                    lambda: "waiting for them" in watch.output or any(begun.iterdir()),  # noqa: B023
                    "watch waiting for the ranks, or looking at them",
                )
            elif moment == "watching":
                watch.wait_for(lambda: any(begun.iterdir()), "a look at the ranks")
            else:
                watch.wait_for(lambda: "capturing every rank" in watch.output, "a capture")  # noqa: B023
            code = watch.stop(stop)
            assert code == 128 + stop, watch.output[-3000:]
            assert "was left running: watch never signals a job it did not start" in watch.output
            no_process_left(mark_processes)  # watch and its py-spy dumps
            job_intact(running_job, job_mark, None if moment == "start-up" else 2)
            assert left_in(user_tmp) == []
            if moment == "capture":
                (capture,) = out.iterdir()
                assert (
                    (capture / "watch-stopped.txt")
                    .read_text()
                    .startswith(f"ncclcheck watch was stopped by {stop.name} while capturing a hang")
                )
        finally:
            watch.reap()


# -- doctor --pid ------------------------------------------------------------------------


@pytest.mark.parametrize("stop", SIGNALS, ids=_name)
def test_a_signal_to_doctor_ends_its_dumps_and_leaves_the_job_as_it_was(
    stop: signal.Signals,
    user_tmp: Path,
    mark_processes: str,
    job_mark: str,
    running_job: subprocess.Popen[str],
    dumps_seen: tuple[dict[str, str], Path],
) -> None:
    env, begun = dumps_seen
    wait_for_ranks(running_job)
    for moment in ("dumping", "between its looks"):
        for old in begun.iterdir():
            old.unlink()
        doctor = Command("doctor", "--interval", "60", "--pid", str(running_job.pid), env=env)
        try:
            doctor.wait_for(lambda: any(begun.iterdir()), "a dump begun")
            if moment == "between its looks":  # in the sleep before the second look
                doctor.wait_for(lambda: not doctor.children("py-spy"), "the first look done")  # noqa: B023
            code = doctor.stop(stop)
            assert code == 128 + stop, doctor.output[-3000:]
            assert f"ncclcheck: stopped by {stop.name}" in doctor.output
            no_process_left(mark_processes)
            job_intact(running_job, job_mark)
            assert left_in(user_tmp) == []
        finally:
            doctor.reap()


# -- probe and preflight: they start torchrun themselves -----------------------------------


@pytest.mark.parametrize("stop", SIGNALS, ids=_name)
@pytest.mark.parametrize("moment", ["start-up", "running"])
def test_a_signal_to_probe_ends_its_ranks_and_removes_its_folder(
    stop: signal.Signals, moment: str, user_tmp: Path, mark_processes: str
) -> None:
    probe = Command("probe", "--nproc-per-node", "2")
    try:
        if moment == "start-up":
            probe.wait_for(lambda: probe.children("torch.distributed.run"), "torchrun started")
        else:  # the ranks checked in and are at their checks
            probe.wait_for(lambda: list(user_tmp.glob("ncclcheck-probe-*/rank-*.json")), "a rank's record")
        code = probe.stop(stop)
        assert code == 128 + stop, probe.output[-3000:]
        assert f"ncclcheck: stopped by {stop.name}" in probe.output
        no_process_left(mark_processes)
        assert left_in(user_tmp) == []
    finally:
        probe.reap()


@pytest.mark.parametrize("stop", SIGNALS, ids=_name)
@pytest.mark.parametrize("moment", ["start-up", "running"])
def test_a_signal_to_preflight_makes_an_incomplete_run_and_leaves_nothing(
    stop: signal.Signals, moment: str, user_tmp: Path, mark_processes: str
) -> None:
    preflight = Command("preflight", "--nproc-per-node", "2", str(JOB), env={"MODE": "steady"})
    try:
        if moment == "start-up":
            preflight.wait_for(lambda: preflight.children("torch.distributed.run"), "torchrun started")
        else:  # the ranks recording their collectives
            preflight.wait_for(lambda: list(user_tmp.glob("ncclcheck-*/rank-*.jsonl")), "a rank's trace")
        code = preflight.stop(stop)
        # stopped before its budget was spent, nothing found: incomplete (docs/contract.md)
        assert code == 4, preflight.output[-3000:]
        no_process_left(mark_processes)
        assert left_in(user_tmp) == []
    finally:
        preflight.reap()


def test_a_signal_to_a_virtual_world_stops_its_fork_server_and_leaves_nothing(
    user_tmp: Path, mark_processes: str
) -> None:
    """preflight --world-size: one fork server runs rank 0, then the rest; stopped while
    a rank records, the server and every rank it forked go with preflight."""
    preflight = Command("preflight", "--world-size", "8", str(JOB), env={"MODE": "steady"})
    try:
        preflight.wait_for(lambda: list(user_tmp.glob("ncclcheck-*/rank-*.jsonl")), "a rank's trace")
        code = preflight.stop(signal.SIGTERM)
        assert code == 4, preflight.output[-3000:]
        no_process_left(mark_processes)
        assert left_in(user_tmp) == []
    finally:
        preflight.reap()
