"""``ncclcheck probe``: can these ranks talk, all of them, correctly, and how fast."""

from __future__ import annotations

import typer

from ncclcheck.cli.common import (
    JSON_OPTION,
    MASTER_ADDR_OPTION,
    MASTER_PORT_OPTION,
    NNODES_OPTION,
    NODE_RANK_OPTION,
    NPROC_OPTION,
    RDZV_BACKEND_OPTION,
    RDZV_ENDPOINT_OPTION,
    RDZV_ID_OPTION,
    emit_report,
    torchrun_options,
)
from ncclcheck.commands.probe import ProbeSettings, choose_backend, parse_layout, run_probe
from ncclcheck.launch.stop import STOP


def probe_command(
    nproc_per_node: int = NPROC_OPTION,
    nnodes: str = NNODES_OPTION,
    node_rank: int = NODE_RANK_OPTION,
    rdzv_backend: str = RDZV_BACKEND_OPTION,
    rdzv_endpoint: str = RDZV_ENDPOINT_OPTION,
    rdzv_id: str = RDZV_ID_OPTION,
    master_addr: str = MASTER_ADDR_OPTION,
    master_port: int = MASTER_PORT_OPTION,
    backend: str = typer.Option(
        "auto", "--backend", help="nccl, gloo, or auto (nccl where GPUs are visible)."
    ),
    max_bytes: int = typer.Option(
        None,
        "--max-bytes",
        min=8,
        help="Largest message of the bandwidth sweep (default: 1 MiB on CPU, 1 GiB on GPU).",
    ),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Timed repeats per size (the median counts)."),
    layout: str = typer.Option(
        "", "--layout", help="Check a parallel layout's subgroups too, e.g. tp=2,dp=2."
    ),
    checkin_timeout: float = typer.Option(
        20.0, "--checkin-timeout", min=1.0, help="Seconds the ranks wait for each other to check in."
    ),
    op_timeout: float = typer.Option(
        60.0, "--op-timeout", min=1.0, help="The process group's timeout: no collective waits longer."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check rendezvous, collective correctness and bandwidth across ranks (exit 1 on a failed
    check or a missing rank)."""
    # a stop signal ends the probe's torchrun and ranks, and its temporary folder goes
    with STOP.listening():
        torchrun = torchrun_options(
            nproc_per_node, nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id, master_addr, master_port
        )
        nodes = int(nnodes.split(":")[-1]) if nnodes.split(":")[-1].isdigit() else 1
        world = torchrun.nproc_per_node * nodes
        chosen = choose_backend(backend)
        settings = ProbeSettings(
            backend=chosen,
            max_bytes=max_bytes or ((1 << 30) if chosen == "nccl" else (1 << 20)),
            repeats=repeats,
            checkin_timeout=checkin_timeout,
            op_timeout=op_timeout,
            layout=parse_layout(layout, world),
        )
        emit_report(run_probe(torchrun, settings, world), as_json)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_command)
