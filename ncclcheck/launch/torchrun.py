"""Launching a dry run through torch.distributed.run, watching it, reaping it.

The ranks are torchrun's own (its rendezvous, its agent); each runs
``ncclcheck.record.bootstrap`` in front of the user's script. The watchdog
declares a hang when no rank has written anything for ``stall_timeout`` seconds
and either no process of the job has computed in that time (``activity``) or the
traces written so far already show ranks in different calls; or when nothing has
been written for 4x that, busy or not. It captures every rank's stack then, and
stops the job. Whatever the outcome, every process the dry run started is gone
when ``run_dry`` returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ncclcheck.evidence.activity import JobActivity
from ncclcheck.evidence.stacks import ProcessStack, dump_stacks
from ncclcheck.evidence.traces import TRACE_GLOB, RankEnding, load_traces
from ncclcheck.evidence.waits import OutsideWait, standoff, timeout_limit
from ncclcheck.launch.launchers import free_port, launcher_argv
from ncclcheck.launch.proctree import LaunchedJob, kill_tree
from ncclcheck.launch.replay import RANK_EXIT_LINE, WarmReplay
from ncclcheck.launch.stop import STOP_ASKED
from ncclcheck.record.bootstrap import ENV_PROBE_TIMEOUT, PROBE_FAILED_EXIT
from ncclcheck.record.cpu_map import ENV_CPU
from ncclcheck.record.fastforward import ENV_AGREE_WAIT, ENV_EVAL_BATCHES, ENV_READ_S, ENV_TRAIN_END
from ncclcheck.record.firing import ENV_DECISIONS, ENV_FIRE
from ncclcheck.record.launched import ENV_LAUNCHER, ENV_SLURM_PORT, launcher_tmpdir
from ncclcheck.record.lines import ENV_LINES
from ncclcheck.record.nccl_timing import ENV_NCCL_TIMING
from ncclcheck.record.perturb import ENV_PERTURB
from ncclcheck.record.recorder import (
    ENV_DRY_RUN,
    ENV_EVAL_PASSES,
    ENV_MAX_TRAIN_PASSES,
    ENV_PURE_PYTHON,
    ENV_TRACE_DIR,
    ENV_TRAIN_STEPS,
)
from ncclcheck.record.tracefile import data_end, seal
from ncclcheck.settings import NCCL_DEFAULT_TIMEOUT_S, DryRunSettings, Launcher
from ncclcheck.wording import who


@dataclass
class TorchrunOptions:
    """torchrun's launch options, with torchrun's names (docs/contract.md)."""

    nproc_per_node: int = 2
    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None

    def argv(self) -> list[str]:
        args = [f"--nproc-per-node={self.nproc_per_node}", f"--nnodes={self.nnodes}"]
        rendezvous = (self.rdzv_backend, self.rdzv_endpoint, self.master_addr, self.master_port)
        if not any(value is not None for value in rendezvous) and self.nnodes in ("1", "1:1"):
            args.append("--standalone")  # a free port on localhost, nothing shared
        for flag, value in (
            ("--node-rank", self.node_rank),
            ("--rdzv-backend", self.rdzv_backend),
            ("--rdzv-endpoint", self.rdzv_endpoint),
            ("--rdzv-id", self.rdzv_id),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
        ):
            if value is not None:
                args.append(f"{flag}={value}")
        return args


@dataclass
class Progress:
    ranks_up: int = 0
    records: int = 0  # bytes of trace written, all ranks
    elapsed: float = 0.0
    collectives: int = 0  # the most any rank has issued
    phase: str = ""  # rank 0's, or the first rank's that has one


@dataclass
class LaunchResult:
    trace_dir: Path
    log_path: Path
    returncode: int | None  # torchrun's; None when the dry run was stopped
    stalled: bool = False
    stall_seconds: float = 0.0
    stall_reason: str = ""  # why the quiet was taken for a hang, for the report
    interrupted: bool = False
    timed_out: bool = False
    elapsed: float = 0.0
    stacks: dict[int, ProcessStack] = field(default_factory=dict)  # by rank
    rank_exits: dict[int, int] = field(default_factory=dict)  # by rank, from torchrun's summary
    first_failure: int | None = None  # the rank torchrun names as the root cause
    probe_failed: bool = False
    launcher: Launcher = Launcher.TORCHRUN  # who started the ranks (DryRunSettings.launcher)
    # set when the ranks still running had all destroyed their process group and were
    # stopped after this many quiet seconds: the distributed part had ended
    after_distributed_s: float | None = None
    # quiet spells with ranks outside every collective, waited for (evidence/waits.py)
    outside_waits: list[OutsideWait] = field(default_factory=list)
    # the run was stopped at --outside-wait, short of the job's timeout: whether the ranks
    # outside would have come in time is not known (why, in words)
    undecided_wait: str | None = None

    def log_tail(self, lines: int = 20) -> str:
        """The end of what the ranks printed, without torchrun's own log lines.

        torchrun's failure summary follows the ranks' output, so everything from
        its first error line on is dropped; lines every rank printed alike appear once.
        """
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        # spawn's own report of a failed process (a script that starts its ranks) ends
        # the output, like torchrun's summary: what the processes printed comes before it
        spawn_report = text.rfind("Traceback", 0, max(0, text.find("ProcessExitedException")))
        if "ProcessExitedException" in text and spawn_report >= 0:
            text = text[:spawn_report]
        kept: list[str] = []
        for line in text.splitlines():
            if _TORCHRUN_ERROR.match(line):
                break
            if _TORCHRUN_LINE.match(line) or not line.strip() or line in kept:
                continue
            kept.append(line)
        return "\n".join(kept[-lines:])

    def error_lines(self, most: int = 3) -> list[str]:
        """The last distinct exception lines the job printed (``ValueError: ...``), from
        every process's output alike: what the ranks died of, where no trace says it."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        found: list[str] = []
        for line in text.splitlines():
            line = line.strip()
            if _EXCEPTION_LINE.match(line) and "ProcessExitedException" not in line:
                if line in found:
                    found.remove(line)
                found.append(line)
        return found[-most:]


def private_trace_dir(parent: str | None = None) -> Path:
    return Path(tempfile.mkdtemp(prefix="ncclcheck-", dir=parent))


def _trace_size(trace_dir: Path) -> tuple[int, int]:
    """(trace files, bytes of records in them): the records grow while a rank makes progress."""
    files = sizes = 0
    for path in trace_dir.glob(TRACE_GLOB):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            sizes += data_end(fd)  # not the file's size: it is grown ahead of the data
            files += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return files, sizes


_TORCHRUN_LINE = re.compile(r"^([WI]\d{4} \d\d:\d\d|\*{5}|Setting OMP_NUM_THREADS)")
_TORCHRUN_ERROR = re.compile(r"^E\d{4} \d\d:\d\d")
# "ValueError: ...", "torch.distributed.DistBackendError: ...": a traceback's last line
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Interrupt|Exit)(?::|$)")
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


# torch.multiprocessing.spawn's: the first process to fail ends the script with one of
# these (the rank is the spawn index), after SIGTERM to the others
_SPAWN_SIGNAL = re.compile(r"ProcessExitedException: process (\d+) terminated with signal (SIG\w+)")
_SPAWN_CODE = re.compile(r"ProcessExitedException: process (\d+) terminated with exit code (\d+)")
_WARM_EXIT = re.compile(
    re.escape(RANK_EXIT_LINE).replace(r"\{rank\}", r"(\d+)").replace(r"\{code\}", r"(-?\d+)")
)


def parse_torchrun_failures(log: str) -> tuple[dict[int, int], int | None]:
    """Exit codes per rank and the root-cause rank from torchrun's failure summary (or
    torch.multiprocessing.spawn's, for a script that starts its own ranks, or the warm
    server's lines, in the order its ranks ended)."""
    exits = {int(rank): int(code) for rank, code in _FAILURE.findall(log)}
    warm = [(int(rank), int(code)) for rank, code in _WARM_EXIT.findall(log)]  # ranks a warm server forked
    if warm:
        exits.update(warm)
        return exits, warm[0][0]
    spawned = [(int(r), -int(getattr(signal, name, 0))) for r, name in _SPAWN_SIGNAL.findall(log)]
    spawned += [(int(r), int(code)) for r, code in _SPAWN_CODE.findall(log)]
    if spawned:
        exits.update(spawned)
        return exits, spawned[0][0]
    first = None
    root = log.split("Root Cause (first observed failure):", 1)
    if len(root) == 2:
        match = _FAILURE.search(root[1])
        if match:
            first = int(match.group(1))
    return exits, first


def _tail_records(path: Path, size: int = 4096) -> list[dict[str, object]]:
    """The complete lines at the end of a trace file, parsed; cheap on big files."""
    import json

    try:
        with path.open("rb") as handle:
            end = data_end(handle.fileno())
            handle.seek(max(0, end - size))
            lines = handle.read(end - handle.tell()).splitlines()
    except OSError:
        return []
    records = []
    for line in lines[1:] if end > size else lines:  # the first may be cut
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def exits_written(trace_dir: Path) -> list[RankEnding]:
    """How the ranks ended, from the exit records that end the traces in ``trace_dir``,
    read from their tails only."""
    return [
        RankEnding.of(r)
        for path in trace_dir.glob(TRACE_GLOB)
        for r in _tail_records(path)[-1:]
        if r.get("t") == "exit"
    ]


def _last_record_kind(path: Path) -> str | None:
    records = _tail_records(path)
    return str(records[-1].get("t")) if records else None


def _progress_facts(trace_dir: Path) -> tuple[int, str]:
    """(most collectives issued by a rank, the lowest rank's phase) from the trace tails."""
    most, phase = 0, ""
    for path in sorted(trace_dir.glob(TRACE_GLOB)):
        records = _tail_records(path)
        calls = [int(r.get("n", 0)) for r in records if r.get("t") == "call"]  # type: ignore[call-overload]
        if calls:
            most = max(most, calls[-1])
            # the phase a rank is in: its last batch, phase or site line says it
            told = [str(r["phase"]) for r in records if "phase" in r and r.get("t") != "exit"]
            phase = phase or (told[-1] if told else "")
    return most, phase


# Reading traces costs about 1.5 s per 100k calls (12 MiB with loader positions, about
# 0.12 s per MiB) here, and the watcher waits for it: past this size the quiet is
# judged by the other rules alone.
_LIVE_READ_MAX_BYTES = 64 * 2**20


def _records_disagree(trace_dir: Path) -> bool:
    """Whether the traces written so far already show ranks in different calls at the
    same position of a group (not merely some rank behind the others)."""
    try:
        return bool(load_traces(trace_dir, live=True).divergences)
    except Exception:  # a file being written or removed: no verdict from it this time
        return False


def _all_quiet_ranks_finished(trace_dir: Path) -> bool:
    kinds = [_last_record_kind(path) for path in trace_dir.glob(TRACE_GLOB)]
    return bool(kinds) and all(kind in ("destroy", "exit") for kind in kinds)


def _ended_ranks(trace_dir: Path) -> set[int]:
    """The ranks whose trace ends with their script's end or their process group's."""
    ended = set()
    for rank, path in _trace_files(trace_dir).items():
        if _last_record_kind(path) in ("destroy", "exit"):
            ended.add(rank)
    return ended


def _job_timeout_s(trace_dir: Path) -> float | None:
    """How long the job's collectives wait for a peer (init_process_group's timeout, from
    the init records), the shortest over the ranks; None before any rank initialised."""
    import json

    found: list[float] = []
    for path in _trace_files(trace_dir).values():
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                head = handle.read(65536).splitlines()
        except OSError:
            continue
        for line in head:
            if '"init"' in line:
                try:
                    timeout = json.loads(line).get("timeout_s")
                except ValueError:
                    continue
                if isinstance(timeout, (int, float)):
                    found.append(float(timeout))
                break
    return min(found) if found else None


def _trace_files(trace_dir: Path) -> dict[int, Path]:
    """rank -> its trace file, from each trace's hello line."""
    import json

    files: dict[int, Path] = {}
    for path in trace_dir.glob(TRACE_GLOB):
        try:
            with path.open(encoding="utf-8") as handle:
                files[int(json.loads(handle.readline())["rank"])] = path
        except (OSError, ValueError, KeyError):
            continue
    return files


def _rank_pids(trace_dir: Path) -> dict[int, int]:
    """rank -> pid, from each trace's hello line."""
    import json

    pids: dict[int, int] = {}
    for path in trace_dir.glob(TRACE_GLOB):
        try:
            with path.open(encoding="utf-8") as handle:
                hello = json.loads(handle.readline())
            pids[int(hello["rank"])] = int(hello["pid"])
        except (OSError, ValueError, KeyError):
            continue
    return pids


# A spell this long with no record and no process running is the first sign of a hang
# (a step or a batch of the dry run writes several records a second): what may follow
# one is prepared then. A spell without records while the ranks compute (building a
# model: DDP imports torch._dynamo) is not, unless it lasts the second figure (a rank
# waiting on a GPU spins its CPU).
_QUIET_HINT_S = 0.5
_QUIET_HINT_BUSY_S = 5.0
_SAMPLE_EVERY_S = 0.25  # how often the job's processes are looked at (1 ms for 16 of them)


def start_torchrun(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """torchrun with its output in a private log, in a session of its own: Ctrl-C in the
    terminal reaches ncclcheck, which then stops the run itself, instead of racing
    torchrun's handlers."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


LAUNCHER_TMP = "launcher-tmp"  # the launcher's TMPDIR, inside the dry run's folder (launched.py)


def dry_run_environment(settings: DryRunSettings, trace_dir: Path) -> dict[str, str]:
    """What every dry-run rank reads (record/bootstrap.py), whoever starts it."""
    env = {
        ENV_TRACE_DIR: str(trace_dir),
        ENV_TRAIN_STEPS: str(settings.train_steps),
        ENV_EVAL_PASSES: str(settings.eval_passes),
        ENV_MAX_TRAIN_PASSES: str(settings.max_train_passes),
        ENV_PROBE_TIMEOUT: str(settings.probe_timeout),
        ENV_CPU: "1" if settings.cpu else "0",
        ENV_PERTURB: "1" if settings.perturb else "0",
        ENV_NCCL_TIMING: "1" if settings.nccl_timing else "0",
        ENV_DRY_RUN: "1",
        ENV_LINES: settings.lines_plan or "",
        ENV_EVAL_BATCHES: "all" if settings.eval_batches is None else str(settings.eval_batches),
        ENV_TRAIN_END: str(settings.train_end_batches),
        ENV_LAUNCHER: settings.launcher,
        # a rank that never starts the pass (only rank 0 evaluates) costs this, well inside
        # the stall timeout, so the wait itself is never taken for a hang
        ENV_AGREE_WAIT: str(settings.eval_agree_wait_s),
        # reading a stream ahead writes a record a second: forgiven like a busy rank's work
        ENV_READ_S: str(settings.eval_read_ahead_s),
        "PYTHONUNBUFFERED": "1",
    }
    if settings.fire_actions:
        env[ENV_FIRE] = json.dumps([list(action) for action in settings.fire_actions])
    if settings.watch_decisions or settings.watch_handlers_in:
        env[ENV_DECISIONS] = json.dumps(
            {
                "watch": [list(decision) for decision in settings.watch_decisions],
                "force": list(settings.forced_decision) if settings.forced_decision else None,
                "handlers_in": list(settings.watch_handlers_in),
            }
        )
    if settings.lines_plan:
        env[ENV_PURE_PYTHON] = "1"  # every call through Python, where the replay's stop is
    return env


def run_dry(
    script: str,
    script_args: list[str],
    torchrun: TorchrunOptions,
    settings: DryRunSettings,
    trace_dir: Path,
    on_progress: Callable[[Progress], None] | None = None,
    as_module: bool = False,
    warm: WarmReplay | None = None,
    on_quiet: Callable[[], None] | None = None,
) -> LaunchResult:
    """``warm``: a server that imported torch already forks the ranks (launch/replay.py),
    for the replay that gives line evidence; torchrun starts them otherwise.
    ``on_quiet``: called once, the first time no rank has written for a moment."""
    trace_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = trace_dir / "torchrun.log"
    env = {**os.environ, **dry_run_environment(settings, trace_dir)}
    target = [*(["-m"] if as_module else []), script, *script_args]  # -m: a module, as python -m
    if settings.launcher == Launcher.SLURM:
        env[ENV_SLURM_PORT] = str(free_port())
    start = time.monotonic()
    result = LaunchResult(trace_dir, log_path, None, launcher=settings.launcher)
    proc: LaunchedJob
    if warm is not None:
        ranks_env = dry_run_environment(settings, trace_dir)
        proc = warm.launch(target, ranks_env, torchrun.nproc_per_node, log_path)
    else:
        argv = launcher_argv(settings.launcher, torchrun.argv(), target, settings.accelerate_config)
        if settings.launcher != Launcher.SPAWN:  # the script itself, not an agent, starts the ranks
            launcher_tmp = trace_dir / LAUNCHER_TMP
            launcher_tmp.mkdir(mode=0o700, exist_ok=True)
            launcher_tmpdir(env, str(launcher_tmp))
        proc = start_torchrun(argv, env, log_path)
    interrupted = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # a signal ignored when preflight started (nohup's SIGHUP, SIGINT in a background job)
    # stays ignored: the user asked for the run to outlive it
    previous = {sig: handler for sig, handler in previous.items() if handler is not signal.SIG_IGN}
    on_main_thread = threading.current_thread() is threading.main_thread()
    if on_main_thread:
        for sig in previous:
            # set from another thread: the handler runs on the main thread, which may be
            # inside interrupted.wait() holding the Event's lock, and Event.set() taken there
            # waits for that lock forever (seen: preflight hung by a SIGTERM at that instant)
            signal.signal(sig, lambda *_: threading.Thread(target=interrupted.set, daemon=True).start())
    if STOP_ASKED.is_set():
        interrupted.set()
    ended_by_us_at: int | None = None  # the log's length when this run stopped the launcher
    try:
        _watch(proc, result, settings, trace_dir, start, interrupted, on_progress, on_quiet)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                ended_by_us_at = log_path.stat().st_size
            kill_tree(proc.pid)
        proc.wait(timeout=30)
        # torchrun's ranks may outlive it (own sessions): reap them by the pids they wrote.
        for pid in _rank_pids(trace_dir).values():
            kill_tree(pid)
        for path in trace_dir.glob(TRACE_GLOB):
            seal(str(path))  # a rank killed or aborted left its file grown past its records
        # the agent's scratch (its log folder), of no use once it ended: a kept --trace-dir
        # holds the traces and torchrun.log only
        shutil.rmtree(trace_dir / LAUNCHER_TMP, ignore_errors=True)
        if on_main_thread:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    result.elapsed = time.monotonic() - start
    try:
        log = log_path.read_bytes()
    except FileNotFoundError:  # a warm server gone before it opened the log: nothing was run
        log = b""
    # the exits of ranks this run ended (a warm server still alive prints them as they
    # die) are not the job's failures: only what the launcher said before the stop
    said = log if ended_by_us_at is None else log[:ended_by_us_at]
    result.rank_exits, result.first_failure = parse_torchrun_failures(said.decode("utf-8", errors="replace"))
    result.probe_failed = any(code == PROBE_FAILED_EXIT for code in result.rank_exits.values())
    return result


class _OutsideWaits:
    """The quiet spells in which ranks were outside every collective: in a sleep, a
    download, a subprocess, a disk read or their own compute, waiting on something that
    is not a rank (evidence/waits.py). Each is waited for, looked at again every stall
    timeout, and recorded; none is a hang until the ranks waiting on it near the job's
    collective timeout (or ``--outside-wait``, when set)."""

    def __init__(self, settings: DryRunSettings, trace_dir: Path, start: float, result: LaunchResult) -> None:
        self.settings, self.trace_dir, self.start, self.result = settings, trace_dir, start, result
        self.open: OutsideWait | None = None
        self.next_look = 0.0
        self.latest: dict[int, ProcessStack] = {}  # the stacks of the last look
        self._timeout: float | None = None  # the job's collective timeout, once a rank recorded it

    def job_timeout(self) -> float | None:
        """The job's collective timeout, read from the traces until a rank has recorded it
        (the limit is judged at every turn of the watch loop while a spell lasts)."""
        if self._timeout is None:
            self._timeout = _job_timeout_s(self.trace_dir)
        return self._timeout

    def due(self, now: float) -> bool:
        """Whether the ranks are to be looked at: once a stall timeout into a quiet spell,
        then every stall timeout while it lasts."""
        return now >= self.next_look

    def resumed(self, now: float) -> None:
        """A record came: the ranks outside went on."""
        if self.open is not None:
            self.open.seconds = now - self.start - self.open.began_s
            self.open.over = True
            self.result.outside_waits.append(self.open)
            self.open = None
        self.next_look = 0.0

    def close(self, now: float) -> None:
        """The run ended (or was stopped) during a spell: it lasted until now."""
        if self.open is not None:
            self.open.seconds = now - self.start - self.open.began_s
            self.result.outside_waits.append(self.open)
            self.open = None

    def wait_on(self, stacks: dict[int, ProcessStack], now: float, last_write: float) -> str:
        """What this look says: "waiting" (ranks are outside every collective, within the
        limit), "expired" (past it: the run ends, see ``expired``), or "" (no rank is
        outside: the quiet is judged as any other)."""
        self.next_look = now + self.settings.stall_timeout
        found = standoff(stacks, _ended_ranks(self.trace_dir))
        if found is None:
            # the ranks outside went into a wait on a peer (or ended): that spell is over
            self.resumed(now)
            self.next_look = now + self.settings.stall_timeout
            return ""
        if self.open is None:
            self.open = OutsideWait(found.outside, found.waiting, last_write - self.start, stacks=stacks)
        self.open.outside, self.open.waiting = found.outside, found.waiting
        self.latest = stacks
        # the limit is judged on time, with the stacks of the last look (a look takes seconds)
        self.next_look = min(self.next_look, last_write + self.limit())
        return "expired" if self.expired(now, last_write) else "waiting"

    def limit(self) -> float:
        """How long ranks outside may keep the others waiting: --outside-wait, else the
        job's collective timeout (less a margin), else NCCL's default."""
        if self.settings.outside_wait is not None:
            return self.settings.outside_wait
        return timeout_limit(self.job_timeout() or NCCL_DEFAULT_TIMEOUT_S)

    def expired(self, now: float, last_write: float) -> bool:
        """Past the limit, the spell ends the run, and the result says how: a hang where
        ranks waited in a collective up to the job's timeout (the real job fails there),
        undecided where only --outside-wait was reached."""
        waited = now - last_write
        if self.open is None or waited < self.limit():
            return False
        waiting, late = self.open.waiting, self.open.outside
        self.close(now)
        timeout = self.job_timeout()
        if waiting and (timeout is None or waited < timeout_limit(timeout)):
            asked = self.settings.outside_wait
            self.result.undecided_wait = (
                f"the dry run stopped after {who(waiting)} had waited {waited:.0f} s in a collective "
                f"for {who(late)}, outside every collective"
                + (f" (--outside-wait {asked:.0f} s)" if asked is not None else "")
                + (
                    f", short of the job's {timeout:.0f} s collective timeout"
                    if timeout is not None
                    else " (the job's collective timeout is not known: no process group was set up)"
                )
            )
        return True


def _stop_outside(
    result: LaunchResult, stacks: dict[int, ProcessStack], seconds: float, trace_dir: Path
) -> None:
    """The run ends with ranks outside every collective past the limit: a hang where the
    others waited in a collective up to the job's timeout (or where none waited: the
    quiet is judged as such), else undecided (--outside-wait reached first)."""
    result.stacks, result.stall_seconds = stacks, seconds
    if result.undecided_wait is not None:
        return  # no hang seen, nothing decided: said as an incomplete run
    late = result.outside_waits[-1]
    timeout = _job_timeout_s(trace_dir)
    result.stalled = True
    result.stall_reason = f"{who(late.outside)} stayed outside every collective for {seconds:.0f} s" + (
        f", near the job's {timeout:.0f} s collective timeout" if timeout and late.waiting else ""
    )


def _watch(
    proc: LaunchedJob,
    result: LaunchResult,
    settings: DryRunSettings,
    trace_dir: Path,
    start: float,
    interrupted: threading.Event,
    on_progress: Callable[[Progress], None] | None,
    on_quiet: Callable[[], None] | None = None,
) -> None:
    outside = _OutsideWaits(settings, trace_dir, start, result)
    try:
        _watch_until_done(
            proc, result, settings, trace_dir, start, interrupted, on_progress, on_quiet, outside
        )
    finally:
        outside.close(time.monotonic())  # a spell still open when the run ended lasted until now


def _watch_until_done(
    proc: LaunchedJob,
    result: LaunchResult,
    settings: DryRunSettings,
    trace_dir: Path,
    start: float,
    interrupted: threading.Event,
    on_progress: Callable[[Progress], None] | None,
    on_quiet: Callable[[], None] | None,
    outside: _OutsideWaits,
) -> None:
    last_size = (-1, -1)
    # the last time a trace grew / the job wrote or worked / one of its processes was running
    last_write = last_activity = last_running = time.monotonic()
    activity = JobActivity(proc.pid)
    last_report = last_sample = 0.0
    disagreement_read_at, disagreement = -1.0, False
    while True:
        returncode = proc.poll()
        if returncode is not None:
            result.returncode = returncode
            return
        now = time.monotonic()
        size = _trace_size(trace_dir)
        if size != last_size:
            last_size, last_write, last_activity, last_running = size, now, now, now
            outside.resumed(now)
        if now - last_sample >= _SAMPLE_EVERY_S:
            last_sample = now
            if size[0] != len(activity.extra_pids):
                activity.extra_pids = set(_rank_pids(trace_dir).values())
            if activity.sample(now).working:
                last_running = now
            if activity.busy():
                last_activity = now
        if on_progress is not None and now - last_report >= 1.0:
            last_report = now
            collectives, phase = _progress_facts(trace_dir)
            on_progress(
                Progress(
                    ranks_up=size[0],
                    records=size[1],
                    elapsed=now - start,
                    collectives=collectives,
                    phase=phase,
                )
            )
        if interrupted.is_set():
            result.interrupted = True
            return
        if now - start > settings.total_timeout:
            result.timed_out = True
            return
        # Quiet: nothing written and nothing computed. Busy without writing is forgiven
        # up to 4x the stall timeout, so a rank computing forever while the others wait
        # in a collective (a straggler) is still caught; unless the records already
        # show the ranks in different calls: nothing a busy rank computes mends that,
        # and a rank waiting on a GPU spins its CPU (CUDA's default sync), which
        # would otherwise pass for work.
        # Records that already disagree are read after a short quiet spell, not the full
        # stall timeout: the live alignment holds back every pairing that could still
        # come right (barriers or rooted calls from different lines wait for the calls
        # after them), so what it reports is a divergence no later record can mend.
        if (
            on_quiet is not None
            and size[1] > 0
            # no record and no process running (a rank building its model writes nothing
            # but runs), or no record for long (a rank waiting on a GPU spins its CPU)
            and (now - last_running > _QUIET_HINT_S or now - last_write > _QUIET_HINT_BUSY_S)
            and not _all_quiet_ranks_finished(trace_dir)  # ranks at their end, not waiting
        ):
            on_quiet()  # the first sign of a hang: once
            on_quiet = None
        quiet = now - last_write > settings.disagree_quiet_s
        if quiet and disagreement_read_at != last_write:
            disagreement_read_at = last_write  # once per quiet spell: the files are still
            disagreement = size[1] <= _LIVE_READ_MAX_BYTES and _records_disagree(trace_dir)
        idle = now - last_activity > settings.stall_timeout
        # before any rank wrote a record, no rank waits in a collective: a busy process is
        # still starting (importing torch on a loaded machine), never a straggler that holds
        # others, so only quiet, or the dry run's time limit, ends that wait
        busy_too_long = size[1] > 0 and now - last_write > settings.busy_limit_s
        disagree = quiet and disagreement  # read above for this quiet spell
        if (idle or busy_too_long) and _all_quiet_ranks_finished(trace_dir):
            # every rank that is still running has left distributed work behind
            # (destroyed its process group): slow, perhaps (a final upload, a checkpoint
            # writer joined), but it cannot hang on a peer, and nothing the dry run checks
            # is left: stopped now rather than at the dry run's time limit
            result.after_distributed_s = now - last_write
            return
        # no record for the stall timeout, busy or not: time to look at where the ranks are
        quiet_long = size[1] > 0 and now - last_write > settings.stall_timeout
        if disagree and _all_quiet_ranks_finished(trace_dir):
            last_write = last_activity = now
        elif outside.open is not None and outside.expired(now, last_write):
            _stop_outside(result, outside.latest, now - last_write, trace_dir)
            return
        elif disagree or ((idle or busy_too_long or quiet_long) and outside.due(now)):
            pids = _rank_pids(trace_dir)
            by_pid = dump_stacks(list(pids.values()), timeout=10.0)
            stacks = {rank: by_pid[pid] for rank, pid in pids.items() if pid in by_pid}
            # a rank outside every collective waits on something that is not a rank (a
            # download, a disk, a subprocess, its own compute): waited for, not a hang,
            # unless the records already disagree (nothing it does mends that)
            looked = "" if disagree else outside.wait_on(stacks, now, last_write)
            if looked == "waiting":
                interrupted.wait(0.2)
                continue
            if looked == "expired":
                _stop_outside(result, stacks, now - last_write, trace_dir)
                return
            if not (disagree or idle or busy_too_long):
                # every running rank waits on a peer, and some CPU is busy (a rank waiting on
                # a GPU spins): judged again at the next look, a hang at the busy limit
                interrupted.wait(0.2)
                continue
            result.stacks = stacks
            result.stalled = True
            result.stall_seconds = now - last_write
            seconds = f"{result.stall_seconds:.0f} s"
            if idle:
                result.stall_reason = f"no rank wrote a record or used a CPU for {seconds}"
            elif disagree:
                result.stall_reason = f"no rank wrote a record for {seconds}, and their records disagree"
            else:
                result.stall_reason = f"no rank wrote a record for {seconds}, though some kept a CPU busy"
            return
        interrupted.wait(0.2)
