"""What the command modules share: the global flags and the JSON/console switch."""

from __future__ import annotations

from dataclasses import dataclass

import typer

from ncclcheck.model import Report
from ncclcheck.render import console


@dataclass
class GlobalState:
    debug: bool = False


STATE = GlobalState()

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout, nothing else.")


def emit_report(report: Report, as_json: bool) -> None:
    """Print a report in the chosen form and exit with its code (0 clean, 1 errors found)."""
    if as_json:
        typer.echo(report.to_json())
    else:
        console.print_report(report)
    raise typer.Exit(report.exit_code)
