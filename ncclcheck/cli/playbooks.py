"""``ncclcheck playbooks [ID]``: list the catalogue, or show one playbook."""

from __future__ import annotations

import json
from typing import Any

import typer

from ncclcheck.catalogue import Playbook, load_catalogue
from ncclcheck.cli.common import JSON_OPTION, reader_may_leave
from ncclcheck.render import console


def _as_dict(playbook: Playbook) -> dict[str, Any]:
    return {
        "id": playbook.id,
        "title": playbook.title,
        "summary": playbook.summary,
        "why": playbook.why,
        "signals": {
            "preflight": playbook.signals.preflight,
            "doctor": playbook.signals.doctor,
            "lint": playbook.signals.lint,
        },
        "fix": {
            "direct": playbook.fix.direct,
            "structural": playbook.fix.structural,
            "ci_guard": playbook.fix.ci_guard,
            "frameworks": playbook.fix.frameworks,
        },
        "references": playbook.references,
        "repro": str(playbook.repro_path),
        "fixed": str(playbook.fixed_path),
    }


def playbooks_command(
    cause: str | None = typer.Argument(None, metavar="[ID]", help="A cause id; omit to list all."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List the catalogue of causes, or show one playbook with its fix."""
    catalogue = load_catalogue()
    if cause is None:
        with reader_may_leave():
            if as_json:
                typer.echo(json.dumps([_as_dict(p) for p in catalogue], indent=2))
            else:
                console.print_catalogue(list(catalogue))
        return
    playbook = catalogue.get(cause)
    with reader_may_leave():
        if as_json:
            typer.echo(json.dumps(_as_dict(playbook), indent=2))
        else:
            console.print_playbook(playbook)


def register(app: typer.Typer) -> None:
    app.command("playbooks")(playbooks_command)
