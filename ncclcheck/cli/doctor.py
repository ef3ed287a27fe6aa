"""``ncclcheck doctor --pid PID``: diagnose a job that is stuck right now."""

from __future__ import annotations

import typer

from ncclcheck.cli.common import JSON_OPTION, emit_report
from ncclcheck.doctor import run_doctor


def doctor_command(
    pid: list[int] = typer.Option(..., "--pid", help="A rank, torchrun agent or launcher pid (repeatable)."),
    native: bool = typer.Option(False, "--native", help="Include native (C/C++) frames."),
    nonblocking: bool = typer.Option(
        False,
        "--nonblocking",
        help="Do not pause the ranks while reading their stacks (faster, may be inconsistent).",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Dump and merge the stacks of every rank of a stuck job and name the cause."""
    emit_report(run_doctor(pid, native=native, nonblocking=nonblocking), as_json)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
