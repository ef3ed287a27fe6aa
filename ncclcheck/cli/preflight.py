"""``ncclcheck preflight [torchrun options] SCRIPT [ARGS]``: the dry run."""

from __future__ import annotations

import typer

from ncclcheck.errors import NotBuiltYet


def preflight_command(
    script: str = typer.Argument(
        ..., help="The training script, as you would pass it to torchrun."
    ),
    script_args: list[str] = typer.Argument(None, help="The script's own arguments, unchanged."),
) -> None:
    """Dry-run the train and eval loops on every rank and report the first misaligned collective."""
    raise NotBuiltYet("preflight is not built in this version")


def register(app: typer.Typer) -> None:
    app.command("preflight", context_settings={"allow_interspersed_args": False})(preflight_command)
