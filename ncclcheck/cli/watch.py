"""``ncclcheck watch [torchrun options] SCRIPT [ARGS]`` or ``ncclcheck watch --pid PID``:
the whole run supervised, its hang diagnosed when it happens."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import typer
from rich.console import Console

from ncclcheck.cli.common import (
    JSON_OPTION,
    MASTER_ADDR_OPTION,
    MASTER_PORT_OPTION,
    NNODES_OPTION,
    NODE_RANK_OPTION,
    NPROC_OPTION,
    RDZV_BACKEND_OPTION,
    RDZV_ENDPOINT_OPTION,
    RDZV_ID_OPTION,
    reader_may_leave,
    torchrun_options,
)
from ncclcheck.commands.watch import WatchOutcome, WatchSettings, watch, watch_job
from ncclcheck.errors import UsageError
from ncclcheck.launch.stop import STOP
from ncclcheck.model import Report
from ncclcheck.render import console
from ncclcheck.settings import NCCL_DEFAULT_TIMEOUT_S

STOP_TAIL_LINES = 20  # of the job's output, said again on stderr when a signal stops watch


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def watch_command(
    script: str = typer.Argument(None, help="The training script, as you would pass it to torchrun."),
    script_args: list[str] = typer.Argument(None, help="The script's own arguments, unchanged."),
    pid: list[int] = typer.Option(
        [], "--pid", help="Watch a job already running: a rank, torchrun agent or launcher pid on this host."
    ),
    nproc_per_node: int = NPROC_OPTION,
    nnodes: str = NNODES_OPTION,
    node_rank: int = NODE_RANK_OPTION,
    rdzv_backend: str = RDZV_BACKEND_OPTION,
    rdzv_endpoint: str = RDZV_ENDPOINT_OPTION,
    rdzv_id: str = RDZV_ID_OPTION,
    master_addr: str = MASTER_ADDR_OPTION,
    master_port: int = MASTER_PORT_OPTION,
    after: float = typer.Option(
        120.0,
        "--after",
        min=1.0,
        help="Seconds in which no rank moved (stack, local values, CPU with no GPU library) while one "
        "waits in a collective: a hang. Keep it well under the process group's timeout (NCCL: 600 s).",
    ),
    every: float = typer.Option(10.0, "--every", min=0.2, help="Seconds between two looks at the ranks."),
    collective_timeout: float = typer.Option(
        NCCL_DEFAULT_TIMEOUT_S,
        "--collective-timeout",
        min=1.0,
        help="The job's collective timeout (init_process_group's timeout; NCCL's default 600 s). "
        "Ranks waiting in a collective for a rank that waits outside every collective (a download, "
        "a disk, a subprocess) are no hang until their wait nears it.",
    ),
    out: Path = typer.Option(
        Path("ncclcheck-watch"), "--out", help="Where each hang's folder is written (hang-<time>/)."
    ),
    on_hang: str = typer.Option(
        "report",
        "--on-hang",
        help="Once a hang is written down: report (leave the job to its process group's timeout), "
        "kill (end the job watch started, its whole tree), or a command, run with the report's path "
        "as its last argument (a notification, a requeue).",
    ),
    native: bool = typer.Option(False, "--native", help="Native (C/C++) frames in the captured stacks."),
    shared: Path = typer.Option(
        None,
        "--shared",
        help="Several nodes: a folder every node's watch can read and write (the cluster's file "
        "system). The first to see a hang asks the others for their ranks' stacks there and "
        "diagnoses them as one job.",
    ),
    merge_wait: float = typer.Option(
        60.0, "--merge-wait", min=1.0, help="With --shared: seconds to wait for the other nodes' captures."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run (or attach to) a job and diagnose its hang the moment no rank moves."""
    settings = WatchSettings(
        after=after,
        every=every,
        collective_timeout=collective_timeout,
        folder=out,
        on_hang=on_hang,
        native=native,
        shared=shared,
        merge_wait=merge_wait,
    )
    if pid and script:
        raise UsageError("give a script to start, or --pid of a running job, not both")
    if not pid and not script:
        raise UsageError("give the training script (watch [torchrun options] train.py) or --pid PID")
    if pid and on_hang == "kill":
        raise UsageError("--on-hang kill ends a job watch started: not one given by --pid")
    command = [] if on_hang in ("report", "kill") else shlex.split(on_hang)
    if on_hang not in ("report", "kill") and (not command or shutil.which(command[0]) is None):
        raise UsageError(f"--on-hang {on_hang}: not report, kill, or a command found on PATH")

    def captured(report: Report, folder: Path) -> None:
        _write_beside(report, folder)
        if command:
            ran = subprocess.run([*command, str(folder / "report.json")], check=False, timeout=300)
            _say(f"ncclcheck watch: {' '.join(command)} ran on the report, exit {ran.returncode}")

    torchrun = torchrun_options(
        nproc_per_node, nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id, master_addr, master_port
    )
    # the job's output goes on where it would, stderr under --json (stdout is the report's)
    sink = sys.stderr if as_json else sys.stdout

    def copy(line: str) -> None:
        sink.write(line)
        sink.flush()

    # a stop signal (SIGTERM, Ctrl-C, SIGHUP) at any moment: the job watch started gets it
    # and a grace period, everything else watch started ends, and what it has is said
    with STOP.listening():
        if pid:
            outcome = watch(pid, settings, say=_say, captured=captured)
        else:
            outcome = watch_job(torchrun, script, script_args or [], settings, copy, _say, captured)
        with reader_may_leave():
            _tell(outcome, as_json)
    raise typer.Exit(outcome.exit_code)


def _tell(outcome: WatchOutcome, as_json: bool) -> None:
    if outcome.stopped_by is not None:
        _say(f"ncclcheck watch: {outcome.stop_note()}")
        if outcome.job_tail:
            _say("ncclcheck watch: the job's last lines:")
            for line in outcome.job_tail[-STOP_TAIL_LINES:]:
                _say(f"  {line.rstrip()}")
        capture = outcome.capture or outcome.capturing
        if capture is not None and capture.is_dir():
            _say(f"ncclcheck watch: what it captured is in {capture}")
    if outcome.report is not None:
        if outcome.stopped_by is None:
            _say(f"ncclcheck watch: the hang's stacks, report and job output are in {outcome.capture}")
        if as_json:
            typer.echo(outcome.report.to_json())
        else:
            console.print_report(outcome.report)
    elif outcome.stopped_by is not None:
        return
    elif outcome.job_exit not in (None, 0):
        _say(f"ncclcheck watch: the job failed (exit {outcome.job_exit}) and no hang was seen")
    else:
        _say(f"ncclcheck watch: the job ended, no hang seen in {outcome.looks} looks")


def _write_beside(report: Report, folder: Path) -> None:
    """The report as the console shows it and as one HTML page, beside its evidence."""
    from ncclcheck.render.html import report_html

    with (folder / "report.txt").open("w", encoding="utf-8") as handle:
        console.print_report(report, Console(file=handle, width=160, color_system=None))
    (folder / "report.html").write_text(report_html(report), encoding="utf-8")


def register(app: typer.Typer) -> None:
    app.command("watch", context_settings={"allow_interspersed_args": False})(watch_command)
