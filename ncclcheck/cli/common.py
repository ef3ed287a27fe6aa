"""What the command modules share: the global flags and the JSON/console switch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ncclcheck.errors import InputError
from ncclcheck.model import Report
from ncclcheck.render import console
from ncclcheck.render.lanes import Lanes

if TYPE_CHECKING:
    from ncclcheck.launch.torchrun import TorchrunOptions


@dataclass
class GlobalState:
    debug: bool = False


STATE = GlobalState()

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout, nothing else.")

# torchrun's launch options, with torchrun's names (docs/contract.md): preflight and probe
NPROC_OPTION = typer.Option(
    None, "--nproc-per-node", "--nproc_per_node", help="Ranks on this node (default: visible GPUs, or 2)."
)
NNODES_OPTION = typer.Option("1", "--nnodes", help="Nodes (torchrun's MIN:MAX form works).")
NODE_RANK_OPTION = typer.Option(None, "--node-rank", "--node_rank", help="This node's rank.")
RDZV_BACKEND_OPTION = typer.Option(None, "--rdzv-backend", "--rdzv_backend")
RDZV_ENDPOINT_OPTION = typer.Option(None, "--rdzv-endpoint", "--rdzv_endpoint")
RDZV_ID_OPTION = typer.Option(None, "--rdzv-id", "--rdzv_id")
MASTER_ADDR_OPTION = typer.Option(None, "--master-addr", "--master_addr")
MASTER_PORT_OPTION = typer.Option(None, "--master-port", "--master_port")


def torchrun_options(
    nproc_per_node: int | None,
    nnodes: str,
    node_rank: int | None,
    rdzv_backend: str | None,
    rdzv_endpoint: str | None,
    rdzv_id: str | None,
    master_addr: str | None,
    master_port: int | None,
) -> TorchrunOptions:
    # here, not at the top: doctor, lint and playbooks, which share this module, launch nothing
    from ncclcheck.commands.preflight import default_nproc
    from ncclcheck.launch.torchrun import TorchrunOptions

    return TorchrunOptions(
        nproc_per_node=default_nproc() if nproc_per_node is None else nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_id=rdzv_id,
        master_addr=master_addr,
        master_port=master_port,
    )


@contextlib.contextmanager
def reader_may_leave() -> Iterator[None]:
    """Output to a reader that may stop early (``| head``): a broken pipe ends the
    printing, not the command, which still exits with its verdict's code."""
    try:
        yield
    except BrokenPipeError:
        console.silence_stdout()


REPORT_OPTION = typer.Option(
    None,
    "--report",
    help="Also write the report as one self-contained HTML file (lanes per rank, the divergence marked).",
)


def emit_report(
    report: Report, as_json: bool, html_path: Path | None = None, lanes: Lanes | None = None
) -> None:
    """Print a report in the chosen form and exit with its code (0 clean, 1 errors found);
    with ``html_path``, write the HTML report there first."""
    if html_path is not None:
        from ncclcheck.render.html import report_html

        try:
            html_path.write_text(report_html(report, lanes), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{html_path}: cannot write the HTML report ({exc.strerror})") from None
    with reader_may_leave():
        if as_json:
            typer.echo(report.to_json())
        else:
            console.print_report(report)
    raise typer.Exit(report.exit_code)
