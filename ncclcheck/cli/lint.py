"""``ncclcheck lint PATH...``: collectives that not every rank will reach, from source."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import typer

from ncclcheck.catalogue import load_catalogue
from ncclcheck.cli.common import JSON_OPTION, reader_may_leave
from ncclcheck.lint import run_lint
from ncclcheck.render import lint as render


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    sarif = "sarif"


def lint_command(
    paths: list[Path] = typer.Argument(..., help="Python files or folders (recursed) to check."),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text, "--format", help="text (path:line:col: cause: message), json, or sarif."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Flag collectives under rank-dependent conditions, without running anything.

    Exit 0: no error-severity finding (warnings may be printed); 1: at least one;
    2: a path is missing, not Python, or does not parse.
    """
    findings, linter = run_lint(paths)
    catalogue = load_catalogue()
    chosen = OutputFormat.json if as_json else output_format
    errors = sum(f.severity == "error" for f in findings)
    with reader_may_leave():
        if chosen is OutputFormat.json:
            typer.echo(render.report(findings, catalogue).to_json())
        elif chosen is OutputFormat.sarif:
            typer.echo(json.dumps(render.sarif(findings, catalogue), indent=2))
        else:
            for line in render.text_lines(findings):
                typer.echo(line)
    warnings = len(findings) - errors
    typer.echo(
        f"ncclcheck lint: {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)} "
        f"in {linter.files_checked} file{'s' * (linter.files_checked != 1)} "
        f"({linter.lines_checked} lines read, imports followed)",
        err=True,
    )
    raise typer.Exit(1 if errors else 0)


def register(app: typer.Typer) -> None:
    app.command("lint")(lint_command)
