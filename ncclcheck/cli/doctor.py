"""``ncclcheck doctor --pid PID``: diagnose a job that is stuck right now."""

from __future__ import annotations

import typer

from ncclcheck.cli.common import JSON_OPTION
from ncclcheck.errors import NotBuiltYet


def doctor_command(
    pid: list[int] = typer.Option(..., "--pid", help="A rank, torchrun agent or launcher pid (repeatable)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Dump and merge the stacks of every rank of a stuck job and name the cause."""
    raise NotBuiltYet("doctor is not built in this version")


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)
