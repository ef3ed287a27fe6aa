"""``ncclcheck preflight [torchrun options] SCRIPT [ARGS]``: the dry run."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

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
    REPORT_OPTION,
    emit_report,
    torchrun_options,
)
from ncclcheck.commands.preflight import MAX_FORCED_DECISIONS, report_from, run_preflight
from ncclcheck.evidence.traces import load_traces
from ncclcheck.launch.stop import listen_for_a_stop
from ncclcheck.launch.torchrun import Progress
from ncclcheck.launch.virtual import VirtualLayout, VirtualWorld
from ncclcheck.render.lanes import build_lanes
from ncclcheck.settings import (
    DEFAULT_EVAL_BATCHES,
    DEFAULT_TRAIN_END_BATCHES,
    STALL_TIMEOUT_S,
    TOTAL_TIMEOUT_S,
    WARM_START_ENV,
    DryRunSettings,
    Launcher,
)


class _ProgressLine:
    """One line on stderr, rewritten in place on a terminal; silent otherwise."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.enabled = sys.stderr.isatty()
        self.shown = False

    def __call__(self, progress: Progress) -> None:
        if not self.enabled:
            return
        sys.stderr.write(
            f"\r  ranks up {progress.ranks_up}/{self.world}  phase {progress.phase or '-':<5}"
            f"  collectives {progress.collectives:<6}  {progress.elapsed:5.1f} s "
        )
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


def preflight_command(
    script: str = typer.Argument(
        None, help="The training script, as you would pass it to torchrun (a module name with -m)."
    ),
    script_args: list[str] = typer.Argument(None, help="The script's own arguments, unchanged."),
    nproc_per_node: int = NPROC_OPTION,
    nnodes: str = NNODES_OPTION,
    node_rank: int = NODE_RANK_OPTION,
    rdzv_backend: str = RDZV_BACKEND_OPTION,
    rdzv_endpoint: str = RDZV_ENDPOINT_OPTION,
    rdzv_id: str = RDZV_ID_OPTION,
    master_addr: str = MASTER_ADDR_OPTION,
    master_port: int = MASTER_PORT_OPTION,
    train_steps: int = typer.Option(5, "--train-steps", min=1, help="Batches per pass over a train loader."),
    eval_passes: int = typer.Option(
        1, "--eval-passes", min=0, help="Complete eval passes before the dry run stops."
    ),
    launcher: str = typer.Option(
        Launcher.AUTO,
        "--launcher",
        help="Who starts the ranks: torchrun; spawn for a script that starts its own with "
        "torch.multiprocessing.spawn (run once, every rank it starts recorded); slurm for a script "
        "that reads SLURM_PROCID/SLURM_NTASKS as under srun; accelerate (accelerate launch with "
        "--accelerate-config); torch.distributed.launch (the legacy launcher: --local-rank=N); deepspeed "
        "(deepspeed's own launcher: --local_rank=N); auto: "
        "accelerate when --accelerate-config is given, spawn where the script calls it outside any test "
        "of its options, else torchrun (and spawn after all if a rank starts ranks of its own).",
    ),
    accelerate_config: Path = typer.Option(
        None,
        "--accelerate-config",
        help="The config file you give accelerate launch --config_file: the ranks are started "
        "through accelerate launch with it (its mixed precision, FSDP or DeepSpeed plugin settings), "
        "--nproc-per-node of them.",
    ),
    eval_batches: str = typer.Option(
        str(DEFAULT_EVAL_BATCHES),
        "--eval-batches",
        help="Batches of each eval pass run for real: the last K of the shortest rank (and every "
        "batch the others have beyond it); the leading ones are skipped alike on every rank, "
        "unloaded. 'all' runs every batch.",
    ),
    train_end_batches: int = typer.Option(
        DEFAULT_TRAIN_END_BATCHES,
        "--train-end-batches",
        min=0,
        help="Batches run at the end of each train loader's first pass, after --train-steps: the "
        "last T of the shortest rank (and every batch the others have beyond it), the ones between "
        "skipped alike on every rank, unloaded, so the epoch's end (its last, uneven batch, what the "
        "script does there) runs. 0: the pass is cut after --train-steps, its end not run.",
    ),
    stall_timeout: float = typer.Option(
        STALL_TIMEOUT_S,
        "--stall-timeout",
        min=1.0,
        help="Seconds without progress on any rank (and no CPU use): a hang.",
    ),
    outside_wait: float | None = typer.Option(
        None,
        "--outside-wait",
        min=1.0,
        help="Seconds ranks outside every collective (rank 0 downloading, reading a slow disk, "
        "waiting on a subprocess) may keep the others waiting before the dry run stops: no hang, "
        "a warning. Default: the job's collective timeout (init_process_group's timeout, else the "
        "backend's: 10 min for NCCL, 30 for gloo), within --total-timeout.",
    ),
    total_timeout: float = typer.Option(
        TOTAL_TIMEOUT_S, "--total-timeout", min=10.0, help="Seconds the whole dry run may take."
    ),
    no_probe: bool = typer.Option(False, "--no-probe", help="Skip the rendezvous check-in."),
    cpu: bool = typer.Option(
        False,
        "--cpu",
        help="Run a script written for NCCL/CUDA on CPU ranks with gloo (backend, .cuda(), "
        "device='cuda' and the like are mapped; the report lists what was).",
    ),
    nccl_timing: bool = typer.Option(
        False,
        "--nccl-timing",
        help="Give gloo NCCL's timing: collectives return at once and a rank blocks at the next "
        ".item(), .cpu(), synchronize() or barrier, where a CUDA rank would hang.",
    ),
    warm_start: bool = typer.Option(
        False,
        "--warm-start/--no-warm-start",
        envvar=WARM_START_ENV,
        help="Fork the ranks from one interpreter that imported torch once, with the environment and "
        "store torchrun gives them, instead of torchrun starting an interpreter per rank: about half "
        "the CPU of a dry run, for many dry runs in CI. One node under torchrun only; any other launch "
        "is started as usual.",
    ),
    probe_timeout: float = typer.Option(
        30.0, "--probe-timeout", min=1.0, help="Seconds the ranks wait for each other to check in."
    ),
    perturb: bool = typer.Option(
        False,
        "--perturb",
        help="Make rank-local values differ on purpose (.item() during eval, the clock), so "
        "decisions on unsynchronised values show as a divergence.",
    ),
    line_evidence: bool = typer.Option(
        True,
        "--line-evidence/--no-line-evidence",
        help="When ranks part and the source alone does not say why for certain, replay the dry run "
        "up to there and trace the functions on the call chains: the exit, handler or loop that "
        "decided, with the value or exception (costs one more short run).",
    ),
    fire_periodic: bool = typer.Option(
        True,
        "--fire-periodic/--no-fire-periodic",
        help="Make each periodic action (`if step % N == 0:` whose body reaches a collective: a "
        "save, an evaluation) fire once at its first test, so that it runs within the budget; "
        "the rest of its test (a rank test) is left as written.",
    ),
    force_decisions: bool = typer.Option(
        True,
        "--force-decisions/--no-force-decisions",
        help="Where a test that decides on a rank's own value (its loss, its clock, its batch: "
        "lint's reading) ran without parting the ranks, run again with rank 1 made to take its "
        "other side once: the run the real job has the day that value differs. One more short run "
        f"per such decision, at most {MAX_FORCED_DECISIONS}; the report says what was forced and "
        "what followed.",
    ),
    world_size: int = typer.Option(
        None,
        "--world-size",
        min=1,
        help="Run ranks of a job this large on one machine, on torch's fake process group "
        "(--nproc-per-node: ranks per virtual node, default 8): rank 0, the last rank, node "
        "boundaries and where eval splits change their count, or --all-ranks.",
    ),
    ranks: str = typer.Option(None, "--ranks", help="With --world-size: more ranks to run, as 5,17,100-103."),
    all_ranks: bool = typer.Option(False, "--all-ranks", help="With --world-size: run every rank."),
    trace_dir: Path = typer.Option(
        None,
        "--trace-dir",
        help="Keep the per-rank traces here (default: a private temporary folder, removed afterwards).",
    ),
    from_dir: Path = typer.Option(
        None, "--from", help="Diagnose traces gathered from several nodes; runs nothing."
    ),
    as_module: bool = typer.Option(
        False,
        "-m",
        "--module",
        help="The script is a module name (package.train), run as python -m and torchrun -m run it.",
    ),
    as_json: bool = JSON_OPTION,
    html_path: Path = REPORT_OPTION,
) -> None:
    """Dry-run the train and eval loops on every rank and report the first misaligned collective."""
    listen_for_a_stop()  # a stop from here on: an incomplete run (exit 4), not a death by signal
    if from_dir is not None:
        report = report_from(from_dir, None)
        lanes = build_lanes(load_traces(from_dir)) if html_path is not None else None
        emit_report(report, as_json, html_path, lanes)
        return
    if script is None:
        raise typer.BadParameter("give the training script (or --from DIR)", param_hint="SCRIPT")
    torchrun = torchrun_options(
        nproc_per_node, nnodes, node_rank, rdzv_backend, rdzv_endpoint, rdzv_id, master_addr, master_port
    )
    settings = DryRunSettings(
        train_steps=train_steps,
        eval_passes=eval_passes,
        stall_timeout=stall_timeout,
        outside_wait=outside_wait,
        total_timeout=total_timeout,
        probe_timeout=0.0 if no_probe else probe_timeout,
        cpu=cpu,
        nccl_timing=nccl_timing,
        warm_start=warm_start,
        perturb=perturb,
        line_evidence=line_evidence,
        fire_periodic=fire_periodic,
        force_decisions=force_decisions,
        eval_batches=_eval_batches(eval_batches),
        train_end_batches=train_end_batches,
        launcher=Launcher.ACCELERATE
        if launcher == Launcher.AUTO and accelerate_config
        else _launcher(launcher),
        accelerate_config=str(accelerate_config) if accelerate_config else None,
    )
    virtual = None
    if world_size is not None:
        per_node = nproc_per_node if nproc_per_node is not None else min(8, world_size)
        virtual = VirtualWorld(VirtualLayout(world_size, per_node), _rank_list(ranks), all_ranks)
        settings = replace(settings, line_evidence=False)
    elif ranks is not None or all_ranks:
        raise typer.BadParameter("--ranks and --all-ranks go with --world-size", param_hint="--ranks")
    progress = _ProgressLine(world_size or torchrun.nproc_per_node)
    try:
        outcome = run_preflight(
            script,
            list(script_args or []),
            torchrun,
            settings,
            trace_dir=trace_dir,
            keep_traces=trace_dir is not None,
            on_progress=progress,
            want_lanes=html_path is not None,
            as_module=as_module,
            virtual=virtual,
        )
    finally:
        progress.close()
    emit_report(outcome.report, as_json, html_path, outcome.lanes)


def _launcher(text: str) -> Launcher:
    if text not in tuple(Launcher):
        raise typer.BadParameter(
            f"{text!r} is not one of {', '.join(tuple(Launcher))}", param_hint="--launcher"
        )
    return Launcher(text)


def _eval_batches(text: str) -> int | None:
    """'all' -> None (every batch), else a count of at least 1."""
    if text.strip().lower() == "all":
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise typer.BadParameter(
            f"{text!r} is neither a count of batches (1 or more) nor 'all'", param_hint="--eval-batches"
        )
    return count


def _rank_list(text: str | None) -> tuple[int, ...]:
    """'5,17,100-103' -> (5, 17, 100, 101, 102, 103)."""
    ranks: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            low, _, high = part.partition("-")
            ranks += range(int(low), int(high or low) + 1)
        except ValueError:
            raise typer.BadParameter(
                f"{part!r} is not a rank or a range of ranks", param_hint="--ranks"
            ) from None
    return tuple(ranks)


def register(app: typer.Typer) -> None:
    app.command("preflight", context_settings={"allow_interspersed_args": False})(preflight_command)
