"""``ncclcheck probe``: can these ranks talk, all of them, correctly, and how fast."""

from __future__ import annotations

import typer

from ncclcheck.cli.common import JSON_OPTION
from ncclcheck.errors import NotBuiltYet


def probe_command(
    nproc_per_node: int = typer.Option(2, "--nproc-per-node", help="Ranks on this node."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check rendezvous, collective correctness and bandwidth across ranks."""
    raise NotBuiltYet("probe is not built in this version")


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
