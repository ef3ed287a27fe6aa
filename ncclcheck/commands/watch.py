"""watch: supervise a job while it runs and diagnose its hang the moment it happens.

Cheap while the job is healthy: every ``every`` seconds one look at each rank, a
py-spy dump that does not pause it (``--nonblocking``) and its CPU time; nothing in
the ranks, no change to the user's code. The hang is decided with doctor's picture of
the ranks (evidence/movement.py): a rank moved when its frames or its local values
changed between two looks, or, with no GPU library loaded, when it used the CPU (a
gloo wait sleeps). No rank moved for ``after`` seconds while one or more waits in a
collective: watch then captures every rank's stacks (paused, with locals) into a
folder of its own, runs doctor on the ranks as they are (two looks, its rules), and
writes the report beside the dumps, with the tail of the job's output when watch
started it. Where doctor finds the job progressing after all, watch goes on.

Several nodes: one watch per node, each with ``shared`` (a folder on the cluster's
file system). The first to see a hang opens a request there (one file, created
exclusively: one opener); every node's watch, at its next look, writes its ranks'
stacks and how long ago it last saw them move into the request's folder. The opener
waits until the captures cover every rank or ``merge_wait`` has passed, and
diagnoses them as one job, the nodes that did not answer named. A rank whose node
saw it move within ``after`` seconds counts as working: ranks waiting on it wait on
a straggler, not a hang.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from ncclcheck.causes import Cause
from ncclcheck.commands.doctor import collect, diagnose_ranks, dump_to, run_doctor
from ncclcheck.errors import InputError
from ncclcheck.evidence import gpus, movement
from ncclcheck.evidence.logs import read_leftovers
from ncclcheck.evidence.movement import Movement
from ncclcheck.evidence.processes import RankProcess, launcher_among
from ncclcheck.evidence.stacks import ProcessStack, blocking
from ncclcheck.evidence.waits import Standoff, standoff, timeout_limit, waits_on, where_outside
from ncclcheck.launch.proctree import descendants, kill_processes, kill_tree
from ncclcheck.launch.stop import STOP, Stopped, stopped_exit_code
from ncclcheck.launch.torchrun import TorchrunOptions
from ncclcheck.model import Report, Severity, Verdict, format_ranks
from ncclcheck.settings import NCCL_DEFAULT_TIMEOUT_S
from ncclcheck.wording import relative, who

# The job ended with an error and no hang was seen (docs/contract.md).
JOB_FAILED_EXIT = 6
TAIL_LINES = 200  # of the job's output, kept for the capture folder
# Once watch is stopped by a signal, the job it started gets this long to end of the
# signal forwarded to it before its whole tree is killed: torchrun passes the signal on
# to its ranks and waits for them, and a rank may use it to save a checkpoint or flush
# its logs; a scheduler kills everything 30 s after its SIGTERM by default (Slurm's
# KillWait, Kubernetes' terminationGracePeriodSeconds), and watch needs the rest of
# that to end the tree and write what it has. A second stop signal ends the wait.
JOB_STOP_GRACE_S = 5.0
STOP_NOTE = "watch-stopped.txt"  # in the capture folder of a watch stopped by a signal
FR_FOLDER_PREFIX = "ncclcheck-flight-recorder-"  # the private temporary folder of start_job's pipes


@dataclass(frozen=True)
class WatchSettings:
    after: float = 120.0  # no rank moved for this long, one in a collective: a hang
    every: float = 10.0  # seconds between two looks
    # the job's collective timeout: ranks waiting for a rank outside every collective (a
    # download, a disk) are no hang until their wait nears it (evidence/waits.py)
    collective_timeout: float = NCCL_DEFAULT_TIMEOUT_S
    folder: Path = Path("ncclcheck-watch")  # one sub-folder per hang captured
    # what to do once a hang is written down: "report" (leave the job to its own timeout),
    # "kill" (end the job watch started), or a command, run with the report's path
    on_hang: str = "report"
    native: bool = False  # native frames in the capture (py-spy --native)
    look_timeout: float = 10.0  # one py-spy dump's bound
    shared: Path | None = None  # every node's watch reads and writes here (module docstring)
    merge_wait: float = 60.0  # how long the node that saw the hang waits for the others' captures
    # --pid of a launcher whose ranks are not up yet: how long to wait for them (torch's
    # import and the rendezvous take seconds to minutes on a busy node)
    start_wait: float = 300.0
    # where the job watch started keeps its Flight Recorder pipes and dumps (start_job)
    flight_recorder: Path | None = None


@dataclass
class WatchOutcome:
    report: Report | None = None  # the hang's diagnosis; None when no hang was seen
    capture: Path | None = None  # its folder
    job_exit: int | None = None  # the job's exit code, when watch saw it end
    looks: int = 0
    doing: str = "watching the job"  # what watch is at, for the note of a stop
    capturing: Path | None = None  # the folder of the capture under way
    stopped_by: int | None = None  # the stop signal that ended watch
    stop_exit: int | None = None  # watch's exit code after that stop (stop_status)
    job_pid: int | None = None  # the job watch started, or the first pid watched
    job_started: bool = False  # watch started the job (not --pid)
    job_ran_on: bool = False  # the job was still running when the signal came
    job_killed: bool = False  # it outlived the grace and watch killed its tree
    job_tail: list[str] = field(default_factory=list)  # its last lines, once it ended

    @property
    def exit_code(self) -> int:
        if self.stop_exit is not None:
            return self.stop_exit
        if self.report is not None:
            return 1
        if self.job_exit not in (None, 0):
            return JOB_FAILED_EXIT
        return 0

    def stop_note(self) -> str:
        """What a stop signal did to watch and the job, in words: "stopped by SIGTERM while ..."."""
        if self.stopped_by is None:
            return ""
        name = signal.Signals(self.stopped_by).name
        said = f"stopped by {name} while {self.doing}"
        if not self.job_started:
            return (
                f"{said}; the job it watched (pid {self.job_pid}) was left running: watch never "
                "signals a job it did not start"
            )
        if self.job_pid is None:
            return f"{said}, before the job was started"
        if not self.job_ran_on:
            return f"{said}; the job had ended already (exit {self.job_exit})"
        ended = (
            f"did not end within {JOB_STOP_GRACE_S:.0f} s: watch killed its whole process tree"
            if self.job_killed
            else f"ended (torchrun's exit code {self.job_exit})"
        )
        return (
            f"{said}; it forwarded {name} to the job it started (torchrun, pid {self.job_pid}), "
            f"which {ended}; exit status {self.stop_exit}"
        )


class JobOutput:
    """The job's output, copied to watch's own as it comes, its last lines kept."""

    def __init__(self, stream: IO[str], sink: Callable[[str], None]) -> None:
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._thread = threading.Thread(target=self._copy, args=(stream, sink), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[str], sink: Callable[[str], None]) -> None:
        for line in stream:
            self.tail.append(line)
            sink(line)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# The Flight Recorder's dump on request (NCCL's watchdog, torch 2.3+): each rank's
# watchdog makes a named pipe ``<stem><rank>.pipe`` and, when anything is written into
# it, dumps its ring buffer to ``<prefix><rank>``. Both names are torch's variables;
# newer torch reads the TORCH_FR_ ones, older the TORCH_NCCL_ ones: watch sets both.
_PIPE_VARS = ("TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
_DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_PIPE_STEM = "pipe-rank-"
FR_DUMP_PREFIX = "nccl_trace_rank_"  # torch's default name, which doctor --from reads
FR_DUMP_WAIT_S = 10.0  # how long a capture waits for the ranks' dumps once asked


def start_job(
    torchrun: TorchrunOptions, script: str, script_args: list[str], fr_folder: Path | None = None
) -> subprocess.Popen[str]:
    """The job as torchrun would run it, its output piped to watch. The Flight Recorder
    is switched on (its ring buffer costs little) unless the user set its size, and,
    with ``fr_folder``, its dump on request through a pipe per rank (NCCL only; gloo
    makes no pipe), unless the user named the pipe or the dump."""
    if not Path(script).is_file():
        raise InputError(f"{script}: no such file")
    env = dict(os.environ)
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if fr_folder is not None and not any(v in env for v in (*_PIPE_VARS, *_DUMP_VARS)):
        fr_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        env.update({v: str(fr_folder / FR_PIPE_STEM) for v in _PIPE_VARS})
        env.update({v: str(fr_folder / FR_DUMP_PREFIX) for v in _DUMP_VARS})
    argv = [sys.executable, "-m", "torch.distributed.run", *torchrun.argv(), script, *script_args]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # its whole tree can be ended at once
    )


def watch_job(
    torchrun: TorchrunOptions,
    script: str,
    script_args: list[str],
    settings: WatchSettings,
    copy_output: Callable[[str], None],
    say: Callable[[str], None] = lambda _line: None,
    captured: Callable[[Report, Path], None] = lambda _report, _folder: None,
) -> WatchOutcome:
    """Start the job (start_job, its Flight Recorder pipes in a private temporary folder),
    watch it (watch) and leave nothing behind: the job ended, the folder removed. Its
    output goes to ``copy_output`` line by line. Under ``STOP.listening()``, a stop
    signal at any moment, the start included, is forwarded to the job (stop_job)."""
    outcome = WatchOutcome(doing="starting the job", job_started=True)
    job: subprocess.Popen[str] | None = None
    output: JobOutput | None = None
    pipes: Path | None = None
    try:
        try:
            with STOP.held():  # what is made here is known before a stop is raised
                pipes = Path(tempfile.mkdtemp(prefix=FR_FOLDER_PREFIX))
                job = start_job(torchrun, script, script_args, pipes)
                STOP.spare(job.pid)  # a stop forwards the signal to it and gives it time
                outcome.job_pid = job.pid
                assert job.stdout is not None
                output = JobOutput(job.stdout, copy_output)
            watched = replace(settings, flight_recorder=pipes)
            _watch_until_done([job.pid], watched, job, output, say, captured, outcome)
        except Stopped as stop:
            _stopped(outcome, stop.signum, job, output)
    finally:
        with STOP.held():
            if job is not None and job.poll() is None:
                end_job(job)
            if output is not None:
                output.join(5)
            if pipes is not None:
                shutil.rmtree(pipes, ignore_errors=True)
    return outcome


def watch(
    pids: list[int],
    settings: WatchSettings,
    job: subprocess.Popen[str] | None = None,
    output: JobOutput | None = None,
    say: Callable[[str], None] = lambda _line: None,
    captured: Callable[[Report, Path], None] = lambda _report, _folder: None,
) -> WatchOutcome:
    """Watch the ranks reachable from ``pids`` until the job ends (with ``on_hang`` "kill",
    or a job watch did not start, until its hang is written down). ``job``: the job watch
    started. ``captured``: called with the report and its folder as soon as both exist.
    Under ``STOP.listening()``, a stop signal ends the watch, a capture under way
    included: the job watch started gets the signal (stop_job); a job it did not start is
    never signalled."""
    outcome = WatchOutcome(job_started=job is not None, job_pid=job.pid if job is not None else pids[0])
    try:
        _watch_until_done(pids, settings, job, output, say, captured, outcome)
    except Stopped as stop:
        _stopped(outcome, stop.signum, job, output)
    return outcome


def _watch_until_done(
    pids: list[int],
    settings: WatchSettings,
    job: subprocess.Popen[str] | None,
    output: JobOutput | None,
    say: Callable[[str], None],
    captured: Callable[[Report, Path], None],
    outcome: WatchOutcome,
) -> None:
    previous: tuple[dict[int, ProcessStack], dict[int, movement.Usage], float] | None = None
    last_moved = time.monotonic()
    asked_until = 0.0  # with --shared: another node is capturing a hang until then
    cwd = os.getcwd()
    started, told_waiting = time.monotonic(), False
    told_held = False  # said once per spell: the ranks wait for a rank outside every collective
    while True:
        outcome.doing = "watching the job" if outcome.looks else "waiting for the job's ranks to start"
        if job is not None and job.poll() is not None:
            outcome.job_exit = job.returncode
            return
        try:
            ranks, stacks = collect(pids, nonblocking=True, timeout=settings.look_timeout)
        except InputError:
            if job is None and outcome.looks == 0:
                if told_waiting and not _alive(pids):
                    return  # the launcher ended before its ranks ran: no hang to see
                launcher = launcher_among(pids)
                if launcher is None or time.monotonic() - started > settings.start_wait:
                    raise  # --pid of no process, or of one that is not a job: say so at once
                if not told_waiting:
                    say(f"ncclcheck watch: {launcher} has not started its ranks yet: waiting for them")
                    told_waiting = True
                _pause(job, settings.every)
                continue
            if job is None and not _alive(pids):
                return  # the job watched by --pid ended
            previous = None  # the ranks are starting, or restarting: look again
            last_moved = time.monotonic()
            _pause(job, settings.every)
            continue
        now = time.monotonic()
        pid_of = {r.rank: r.pid for r in ranks}
        used = movement.usage(pid_of)
        outcome.looks += 1
        if settings.shared is not None:
            answered = _answer_requests(settings.shared, pids, ranks, now - last_moved, settings)
            if answered is not None:
                # the node that opened it merges and reports: this one asks again only if the
                # job is still stuck once that node had its time
                asked_until = now + settings.merge_wait + settings.after
                say(
                    f"ncclcheck watch: this node's ranks captured into {answered}, "
                    "for the node that saw a hang"
                )
        if previous is not None and set(previous[0]) == set(stacks):
            without_gpu = frozenset(rank for rank, pid in pid_of.items() if not gpus.maps_cuda(pid))
            moved = movement.compare(
                previous[0], stacks, now - previous[2], previous[1], used, cwd, without_gpu
            )
            if moved.working:
                last_moved = now
        else:
            last_moved = now  # other ranks than at the last look: a (re)start
        waiting = any(blocking(stack).waits_for_peers for stack in stacks.values())
        # ranks outside every collective, which the waiting ones wait for, wait on something
        # that is not a rank (a download, a disk, a subprocess): no hang until near the timeout
        held = standoff(stacks, set()) if waiting else None
        near = timeout_limit(settings.collective_timeout)
        if held is not None and now - last_moved < near:
            if now - last_moved >= settings.after and not told_held:
                say(f"ncclcheck watch: {_held_by(held, stacks, settings)}; watching on")
                told_held = True
            previous = (stacks, used, now)
            _pause(job, settings.every)
            continue
        told_held = False
        if waiting and now - last_moved >= settings.after and now >= asked_until:
            if settings.shared is None:
                # the folder exists before the line says so: a stop from then on writes its
                # note there (_stopped)
                outcome.capturing = settings.folder / time.strftime("hang-%Y%m%d-%H%M%S")
                with contextlib.suppress(OSError):  # _capture's dump_to says why it cannot write
                    outcome.capturing.mkdir(mode=0o700, parents=True, exist_ok=True)
            outcome.doing = "capturing a hang (the capture is incomplete)"
            say(f"ncclcheck watch: no rank moved for {now - last_moved:.0f} s: capturing every rank")
            if settings.shared is not None:
                merged = _capture_every_node(
                    settings.shared, pids, ranks, now - last_moved, settings, output, outcome
                )
                outcome.capturing = None
                if merged is None:  # another node opened the request: it merges
                    asked_until = time.monotonic() + settings.merge_wait + settings.after
                    say(
                        "ncclcheck watch: another node saw the hang first; "
                        "this node's capture is in its folder"
                    )
                    previous = (stacks, used, now)
                    _pause(job, settings.every)
                    continue
                report, capture = merged
            else:
                assert outcome.capturing is not None
                report, capture = _capture(outcome.capturing, pids, settings, output)
                outcome.capturing = None
            if report.verdict == Verdict.WAITING and now - last_moved >= near:
                _past_its_time(report, now - last_moved, settings.collective_timeout)
            if report.verdict not in (Verdict.PROGRESSING, Verdict.WAITING):
                outcome.report, outcome.capture = report, capture
                captured(report, capture)
                if settings.on_hang == "kill" or job is None:
                    return
                outcome.doing = "waiting for the job to end after its hang was captured"
                outcome.job_exit = job.wait()  # the job's own timeout ends it
                return
            say("ncclcheck watch: doctor saw the ranks progress after all: watching on")
            last_moved = time.monotonic()
        previous = (stacks, used, now)
        _pause(job, settings.every)


def _held_by(held: Standoff, stacks: dict[int, ProcessStack], settings: WatchSettings) -> str:
    """'rank 1 waits in a collective for rank 0, outside every collective in a subprocess at
    prep.py:45: no hang unless the wait nears the 600 s collective timeout'."""
    late = stacks[held.outside[0]]
    frame = where_outside(late)
    at = f" at {relative(frame.file, os.getcwd())}:{frame.line}" if frame else ""
    waits = "waits" if len(held.waiting) == 1 else "wait"
    return (
        f"{who(held.waiting)} {waits} in a collective for {who(held.outside)}, outside every collective "
        f"in {waits_on(late)}{at}: no hang unless the wait nears the {settings.collective_timeout:.0f} s "
        "collective timeout (--collective-timeout)"
    )


def _past_its_time(report: Report, seconds: float, timeout: float) -> None:
    """doctor's `waiting`, after watch timed the wait to near the collective timeout: the
    job fails there unless the rank outside comes now, so it is the hang."""
    report.verdict = Verdict.HANG
    for finding in report.findings:
        if finding.cause == Cause.STRAGGLER:
            finding.severity = Severity.ERROR
            finding.message = (
                f"no rank moved for {seconds:.0f} s, near the {timeout:.0f} s collective timeout: "
                + finding.message
            )


def _capture(
    folder: Path, pids: list[int], settings: WatchSettings, output: JobOutput | None
) -> tuple[Report, Path]:
    """Every rank's stacks (paused, with locals) into a new ``folder``, doctor's diagnosis
    of the ranks as they are now, and the job's last lines; the folder is doctor --from's."""
    with contextlib.suppress(OSError):  # dump_to says why it cannot write there
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # where a stop's note goes from now on
    dump_to(folder, pids, native=settings.native, timeout=settings.look_timeout)
    _ras_report(folder)
    if settings.flight_recorder is not None:
        flight_recorder_dumps(settings.flight_recorder, folder, FR_DUMP_WAIT_S)
    report = run_doctor(pids, native=settings.native, timeout=settings.look_timeout, interval=1.0)
    (folder / "report.json").write_text(report.to_json() + "\n", encoding="utf-8")
    if output is not None:
        (folder / "job-output.log").write_text("".join(output.tail), encoding="utf-8")
    return report, folder


def flight_recorder_dumps(pipes: Path, folder: Path, wait_s: float) -> list[int]:
    """Ask every rank with a Flight Recorder pipe in ``pipes`` for its dump and copy the
    dumps that come within ``wait_s`` into ``folder`` (``nccl_trace_rank_<r>``, where
    doctor --from reads them); the ranks that answered. A pipe nobody reads (its rank
    gone) is skipped; a job on gloo made none."""
    asked: dict[int, float] = {}
    for pipe in sorted(pipes.glob(f"{FR_PIPE_STEM}*.pipe")) if pipes.is_dir() else []:
        rank_text = pipe.name[len(FR_PIPE_STEM) : -len(".pipe")]
        if not rank_text.isdigit() or not stat.S_ISFIFO(pipe.stat().st_mode):
            continue
        dump = pipes / f"{FR_DUMP_PREFIX}{rank_text}"
        before = dump.stat().st_mtime if dump.exists() else 0.0
        try:
            handle = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader, the rank is gone
        except OSError:
            continue
        try:
            os.write(handle, b"1\n")
        except OSError:
            continue
        finally:
            os.close(handle)
        asked[int(rank_text)] = before
    answered: list[int] = []
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        for rank, before in list(asked.items()):
            dump = pipes / f"{FR_DUMP_PREFIX}{rank}"
            with contextlib.suppress(OSError):
                written = dump.stat()
                # written since the request, and no longer growing
                if written.st_mtime > before and time.time() - written.st_mtime > 0.5:
                    folder.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(dump, folder / dump.name)
                    answered.append(rank)
                    del asked[rank]
        time.sleep(0.2)
    return sorted(answered)


RAS_TIMEOUT_S = 20.0


def _ras_report(folder: Path) -> None:
    """NCCL's RAS report of the whole job (``ncclras``, NCCL 2.24+, where the command
    exists): its launch counts per communicator, which doctor --from reads beside the
    stacks. A job on gloo, or a RAS that does not answer in time, leaves no file."""
    command = shutil.which("ncclras")
    if command is None:
        return
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run(
            [command],
            capture_output=True,
            text=True,
            timeout=RAS_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode == 0 and done.stdout.strip():
            (folder / "ncclras.txt").write_text(done.stdout, encoding="utf-8")


# -- several nodes: one capture folder under the shared one, merged by the node that opened it --

_OPEN_REQUEST = ".open-request"  # names the folder of the hang being captured, while it is


def _node(ranks: list[RankProcess]) -> str:
    return f"{socket.gethostname()}-node{min(r.group_rank for r in ranks)}"


def _write_node(
    folder: Path, pids: list[int], ranks: list[RankProcess], still_s: float, settings: WatchSettings
) -> None:
    """This node's ranks' stacks (doctor's dump) and, beside them, how long its ranks had
    not moved: hidden, so that doctor --from on the folder reads the dumps alone."""
    dump_to(folder, pids, native=settings.native, timeout=settings.look_timeout)
    status = {
        "node": _node(ranks),
        "ranks": sorted(r.rank for r in ranks),
        "world_size": max(r.world_size for r in ranks),
        "still_s": round(still_s, 1),
    }
    (folder / f".watch-{_node(ranks)}.json").write_text(json.dumps(status), encoding="utf-8")


def _answer_requests(
    shared: Path, pids: list[int], ranks: list[RankProcess], still_s: float, settings: WatchSettings
) -> Path | None:
    """A hang another node opened and this one has not answered: capture into it."""
    try:
        name = (shared / _OPEN_REQUEST).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    folder = shared / name
    if not name or not folder.is_dir() or (folder / f".watch-{_node(ranks)}.json").exists():
        return None
    try:
        _write_node(folder, pids, ranks, still_s, settings)
    except InputError:
        return None  # the ranks ended meanwhile: nothing to capture
    return folder


def _capture_every_node(
    shared: Path,
    pids: list[int],
    ranks: list[RankProcess],
    still_s: float,
    settings: WatchSettings,
    output: JobOutput | None,
    outcome: WatchOutcome,
) -> tuple[Report, Path] | None:
    """Open a request (or, where another node opened one, answer it and return None), wait
    for the other nodes' captures, and diagnose them as one job."""
    shared.mkdir(parents=True, exist_ok=True)
    name = time.strftime("hang-%Y%m%d-%H%M%S-") + _node(ranks)
    request = shared / _OPEN_REQUEST
    with contextlib.suppress(OSError):
        if time.time() - request.stat().st_mtime > settings.merge_wait + 60:
            request.unlink()  # left by a watch that died while merging: no one merges it
    folder = shared / name
    opened = False
    try:
        with STOP.held():  # a request opened is known, and removed below, before a stop is raised
            try:
                fd = os.open(request, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                opened = True
                folder.mkdir(mode=0o700)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(name)
        if not opened:
            _answer_requests(shared, pids, ranks, still_s, settings)
            return None
        outcome.capturing = folder
        _write_node(folder, pids, ranks, still_s, settings)
        _ras_report(folder)
        world = max(r.world_size for r in ranks)
        deadline = time.monotonic() + settings.merge_wait
        while _ranks_captured(folder) < set(range(world)) and time.monotonic() < deadline:
            time.sleep(min(1.0, settings.every))
        report = merged_report(folder, settings.after)
    finally:
        if opened:
            with contextlib.suppress(OSError):
                request.unlink()
    (folder / "report.json").write_text(report.to_json() + "\n", encoding="utf-8")
    if output is not None:
        (folder / "job-output.log").write_text("".join(output.tail), encoding="utf-8")
    return report, folder


def _statuses(folder: Path) -> list[dict]:  # type: ignore[type-arg]
    found = []
    for path in sorted(folder.glob(".watch-*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def _ranks_captured(folder: Path) -> set[int]:
    return {rank for status in _statuses(folder) for rank in status.get("ranks", [])}


def merged_report(folder: Path, after: float) -> Report:
    """The nodes' captures in ``folder`` diagnosed as one job: each rank moved if its
    node's watch saw it move within ``after`` seconds (a straggler's node works while
    the others wait); the ranks no node captured are named."""
    job = read_leftovers([folder])
    ranks = [RankProcess(**entry) for _, entry in sorted(job.doctor_ranks.items())]
    stacks = {r: rec.stack for r, rec in job.ranks.items() if rec.stack is not None}
    statuses = _statuses(folder)
    moved = Movement(after)
    for status in statuses:
        for rank in status["ranks"]:
            if rank not in stacks:
                continue
            if status["still_s"] < after:
                moved.moved[rank] = (
                    f"its node's watch ({status['node']}) saw it move "
                    f"{status['still_s']:.0f} s before the capture"
                )
            else:
                moved.still.append(rank)
    moved.still.sort()
    report = diagnose_ranks(ranks, stacks, moved)
    world = max((status["world_size"] for status in statuses), default=0)
    missing = sorted(set(range(world)) - set(stacks))
    report.summary["nodes"] = [
        f"{status['node']}: ranks {format_ranks(status['ranks'])}, still for {status['still_s']:.0f} s"
        for status in statuses
    ] + ([f"ranks {format_ranks(missing)}: no node's capture arrived in time"] if missing else [])
    return report


def _pause(job: subprocess.Popen[str] | None, seconds: float) -> None:
    """Wait until the next look, or until the job ends."""
    if job is None:
        time.sleep(seconds)
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.wait(timeout=seconds)


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
        return True
    return False


def end_job(job: subprocess.Popen[str]) -> None:
    """End the job watch started, its whole tree (torchrun's ranks are in it)."""
    stop_job(job, signal.SIGTERM)


def stop_job(job: subprocess.Popen[str], signum: int, grace_s: float = JOB_STOP_GRACE_S) -> tuple[bool, bool]:
    """Forward ``signum`` to the job watch started, to its session (torchrun, which passes
    it on to its ranks), wait up to ``grace_s`` for it to end (less where another stop
    signal comes), then kill its whole tree: the ranks torchrun started in sessions of
    their own, found from it while it ran. Whether the job was still running when the
    signal came, and whether it had to be killed."""
    if job.poll() is not None:
        return False, False
    # listed first and while torchrun lives: a rank whose torchrun died is found no more
    tree = {proc.pid: proc for proc in descendants(job.pid)}
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signum)
    signals_then = STOP.signals_seen
    deadline = time.monotonic() + grace_s
    while job.poll() is None and time.monotonic() < deadline and STOP.signals_seen == signals_then:
        tree.update((proc.pid, proc) for proc in descendants(job.pid))
        time.sleep(0.05)
    killed = job.poll() is None
    kill_tree(job.pid)
    kill_processes(list(tree.values()))  # whatever outlived torchrun
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.wait(timeout=10)
    return True, killed


def stop_status(returncode: int | None, signum: int, ran_on: bool) -> int:
    """watch's exit code after a stop signal, the job's status: the conventional 128 +
    the signal where the job ended because of it (torchrun itself exits 1 when a signal
    stops it; a job killed after the grace was stopped by it too), its own exit code
    where it ended by itself, 0 included."""
    if returncode is None or (ran_on and returncode != 0):
        return stopped_exit_code(signum)
    return stopped_exit_code(-returncode) if returncode < 0 else returncode


def _stopped(
    outcome: WatchOutcome, signum: int, job: subprocess.Popen[str] | None, output: JobOutput | None
) -> None:
    """After a stop signal: the job watch started stopped (stop_job), a job it did not
    start left alone, and what watch has written down, the capture folder's included."""
    outcome.stopped_by = signum
    if job is None:
        outcome.stop_exit = stopped_exit_code(signum)
    else:
        outcome.job_ran_on, outcome.job_killed = stop_job(job, signum)
        outcome.job_exit = job.returncode
        outcome.stop_exit = stop_status(job.returncode, signum, outcome.job_ran_on)
    if output is not None:
        output.join(5)  # to the job's end: torchrun's last lines say how it stopped
        outcome.job_tail = list(output.tail)
    folder = outcome.capture or outcome.capturing
    if folder is not None and folder.is_dir():
        with contextlib.suppress(OSError):
            (folder / STOP_NOTE).write_text(f"ncclcheck watch was {outcome.stop_note()}\n", encoding="utf-8")
            if output is not None:
                (folder / "job-output.log").write_text("".join(outcome.job_tail), encoding="utf-8")
