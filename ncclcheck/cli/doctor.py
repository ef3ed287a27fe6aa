"""``ncclcheck doctor --pid PID``: diagnose a job that is stuck right now."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ncclcheck.cli.common import JSON_OPTION, REPORT_OPTION, emit_report
from ncclcheck.commands.doctor import dump_to, run_doctor, run_doctor_from
from ncclcheck.errors import UsageError
from ncclcheck.launch.stop import STOP
from ncclcheck.model import format_ranks


def doctor_command(
    pid: list[int] = typer.Option(
        [], "--pid", help="A rank, torchrun agent or launcher pid on this host (repeatable)."
    ),
    dump_dir: Path | None = typer.Option(
        None,
        "--dump-to",
        help="Write this host's ranks and stacks to DIR/<host>-node<N>.json instead of diagnosing "
        "(run on every host, then --from DIR once).",
    ),
    from_paths: list[Path] = typer.Option(
        [],
        "--from",
        help="Diagnose what a job left behind (repeatable; files or folders): the dumps --dump-to "
        "wrote on every host, job logs (NCCL watchdog lines, torchelastic's summary, tracebacks), "
        "py-spy or faulthandler stack dumps, Flight Recorder JSON.",
    ),
    trust_pickle: bool = typer.Option(
        False,
        "--trust-pickle",
        help="Read pickled Flight Recorder dumps with torch's loader (unpickling runs code: only "
        "files you trust).",
    ),
    all_ranks: bool = typer.Option(False, "--all-ranks", help="With --from: a row per rank, however many."),
    native: bool = typer.Option(False, "--native", help="Include native (C/C++) frames."),
    nonblocking: bool = typer.Option(
        False,
        "--nonblocking",
        help="Do not pause the ranks while reading their stacks (faster, may be inconsistent).",
    ),
    interval: float = typer.Option(
        1.0,
        "--interval",
        min=0.0,
        help="Seconds between the two looks at every rank: a job whose every rank moved is "
        "progressing, not hung (0: one look).",
    ),
    as_json: bool = JSON_OPTION,
    html_path: Path = REPORT_OPTION,
    more_paths: list[Path] | None = typer.Argument(
        None,
        help="More paths for --from (a shell glob after it: --from logs/*.txt).",
        show_default=False,
    ),
) -> None:
    """Dump and merge the stacks of every rank of a stuck job and name the cause."""
    # a stop signal ends the py-spy dumps under way: doctor leaves no process behind
    with STOP.listening():
        if more_paths and not from_paths:
            raise UsageError(f"{more_paths[0]}: paths go after --from (doctor --from PATH...)")
        from_paths = [*from_paths, *(more_paths or [])]
        if from_paths:
            if pid or dump_dir is not None:
                raise UsageError("--from reads what a job left: give it without --pid and --dump-to")
            emit_report(run_doctor_from(from_paths, trust_pickle, all_ranks), as_json, html_path)
        if not pid:
            raise UsageError("give --pid PID (a rank, torchrun or its launcher), or --from PATH")
        if dump_dir is not None:
            path, ranks = dump_to(dump_dir, pid, native=native, nonblocking=nonblocking)
            world = max(r.world_size for r in ranks)
            described = f"ranks {format_ranks([r.rank for r in ranks])} of {world}"
            if as_json:
                typer.echo(
                    json.dumps({"dump": str(path), "host": ranks[0].host, "ranks": [r.rank for r in ranks]})
                )
            typer.echo(f"ncclcheck doctor: wrote {path} ({described})", err=True)
            raise typer.Exit(0)
        emit_report(
            run_doctor(pid, native=native, nonblocking=nonblocking, interval=interval), as_json, html_path
        )


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
