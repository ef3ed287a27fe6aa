"""``ncclcheck lint PATH...``: collectives that not every rank will reach, from source."""

from __future__ import annotations

from pathlib import Path

import typer

from ncclcheck.cli.common import JSON_OPTION
from ncclcheck.errors import NotBuiltYet


def lint_command(
    paths: list[Path] = typer.Argument(..., help="Python files or folders to check."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Flag collectives under rank-dependent conditions, without running anything."""
    raise NotBuiltYet("lint is not built in this version")


def register(app: typer.Typer) -> None:
    app.command("lint")(lint_command)
