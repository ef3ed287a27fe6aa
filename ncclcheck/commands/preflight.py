"""preflight: check inputs, launch the dry run, diagnose, hand a Report back."""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ncclcheck.catalogue import load_catalogue
from ncclcheck.causes import Cause
from ncclcheck.commands.startup import (
    launch_failure,
    no_rank_recorded,
    refuse_what_cannot_be_checked,
    refuse_what_cpu_could_not_map,
)
from ncclcheck.errors import InputError, UsageError
from ncclcheck.evidence.replayed import load_replay
from ncclcheck.evidence.traces import TRACE_GLOB, RankTrace, load_traces
from ncclcheck.explain.context import Evidence
from ncclcheck.explain.coverage import Gap
from ncclcheck.explain.diagnose import diagnose
from ncclcheck.launch.launchers import check_accelerate, check_deepspeed, guard_of, own_starter
from ncclcheck.launch.replay import WarmReplay, uses_torch_dynamo
from ncclcheck.launch.torchrun import (
    LaunchResult,
    Progress,
    TorchrunOptions,
    dry_run_environment,
    exits_written,
    private_trace_dir,
    run_dry,
)
from ncclcheck.launch.virtual import (
    LOG_NAME,
    MAX_WORLD_SIZE,
    VirtualServer,
    VirtualWorld,
    chosen_ranks,
    reference_of,
)
from ncclcheck.lint.decisions import decisions_to_watch
from ncclcheck.lint.periodic import actions_to_fire
from ncclcheck.model import Finding, Report, Severity, Verdict, format_ranks
from ncclcheck.record.bootstrap import find_module_file
from ncclcheck.record.tracefile import End
from ncclcheck.record.virtual import ENV_VIRTUAL, REFERENCE_FILE
from ncclcheck.render.lanes import Lanes, build_lanes
from ncclcheck.settings import DryRunSettings, Launcher
from ncclcheck.source import reading
from ncclcheck.source.origins import first_iteration_of_a_set
from ncclcheck.wording import relative, signal_name, who


@dataclass
class PreflightOutcome:
    report: Report
    trace_dir: Path
    launch: LaunchResult | None
    lanes: Lanes | None = None  # for the HTML report, read before the traces are removed


def check_script(script: str) -> Path:
    path = Path(script)
    if not path.exists():
        raise InputError(f"{script}: no such file")
    if path.is_dir():
        raise InputError(f"{script}: is a directory, not a Python script")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{script}: cannot read it ({exc})") from None
    try:
        compile(text, str(path), "exec")
    except SyntaxError as exc:
        raise InputError(
            f"{script}:{exc.lineno}: syntax error: {exc.msg}",
            hint="Nothing was launched; fix the script first.",
        ) from None
    return path


def run_preflight(
    script: str,
    script_args: list[str],
    torchrun: TorchrunOptions,
    settings: DryRunSettings,
    trace_dir: Path | None = None,
    keep_traces: bool = False,
    on_progress: Callable[[Progress], None] | None = None,
    want_lanes: bool = False,
    as_module: bool = False,
    virtual: VirtualWorld | None = None,
) -> PreflightOutcome:
    if virtual is not None:
        _check_virtual(virtual)
    if torchrun.nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {torchrun.nproc_per_node}")
    if as_module:
        module_file = find_module_file(script, os.getcwd())
        if module_file is None:
            raise InputError(
                f"{script}: no module of that name",
                hint="-m takes a dotted module name (package.train), found from the current folder "
                "or PYTHONPATH as python -m finds it; give a path without -m.",
            )
        path = check_script(str(module_file))
    else:
        path = check_script(script)
    asked = settings.launcher
    settings, spawn_site = _resolve_launcher(settings, torchrun, path, virtual)
    if settings.fire_periodic:
        settings = replace(settings, fire_actions=tuple(actions_to_fire(Path(path))))
    # watched in every run (which side each rank took); forced below where they did not part
    decisions, files = decisions_to_watch(Path(path))
    settings = replace(settings, watch_decisions=tuple(decisions), watch_handlers_in=tuple(files))
    if settings.launcher == Launcher.SLURM:
        _check_allocation(torchrun)
    own_dir = trace_dir is None
    folder = private_trace_dir() if trace_dir is None else trace_dir
    if not own_dir:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = folder / ".ncclcheck-write-test"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise InputError(f"{folder}: trace directory is not writable ({exc.strerror})") from None
    try:
        if virtual is not None:
            launch, ranks_run = _run_virtual_world(
                script, script_args, virtual, settings, folder, on_progress, as_module
            )
            report = Diagnosis.of(folder, launch, ranks_run).report
        else:
            again = _Again(script, script_args, torchrun, as_module)
            # under --warm-start one server forks every run: the first, its replay, each forcing run
            first_server, not_warm = _first_run_server(torchrun, settings, files)
            try:
                # the replay's server without --warm-start: started once the run goes quiet
                warm = _WarmUp(torchrun, settings, folder, first_server)
                try:
                    launch = run_dry(
                        script,
                        script_args,
                        torchrun,
                        settings,
                        folder,
                        on_progress,
                        as_module,
                        first_server,
                        warm.start,
                    )
                    spawned_elsewhere = _own_launcher_exit(folder)
                    if asked == Launcher.AUTO and spawned_elsewhere is not None:  # mp.spawn in another module
                        for stale in [*folder.glob(TRACE_GLOB), folder / "torchrun.log"]:
                            stale.unlink(missing_ok=True)
                        settings, spawn_site = settings.started_by(Launcher.SPAWN), spawned_elsewhere
                        launch = run_dry(
                            script, script_args, torchrun, settings, folder, on_progress, as_module
                        )
                    if launch.stalled or launch.returncode:  # where ranks part, almost always
                        warm.start()
                    if first_server is not None:  # what its rank 0 imported beyond the server: once, there
                        first_server.imports_noted_in = folder
                    first = Diagnosis.of(folder, launch)
                    diagnosis = _with_line_evidence(first, again, settings, warm.for_replay)
                finally:
                    warm.close()
                diagnosis = _with_forced_decisions(diagnosis, again, settings, first_server)
            finally:
                if first_server is not None:
                    first_server.close()
            report = diagnosis.report
            if first_server is not None:
                report.summary["launcher"] = (
                    "--warm-start: the ranks were forked from one interpreter that imported torch once, "
                    "with the environment and store torchrun gives them on one node"
                )
            elif not_warm:
                report.summary["launcher"] = not_warm
        if settings.launcher == Launcher.ACCELERATE:
            report.summary["launcher"] = (
                f"accelerate launch --config_file {settings.accelerate_config} started the ranks"
            )
        elif settings.launcher == Launcher.LEGACY_LAUNCH:
            report.summary["launcher"] = (
                "python -m torch.distributed.launch started the ranks, each given --local-rank=N"
            )
        elif settings.launcher == Launcher.DEEPSPEED:
            report.summary["launcher"] = "deepspeed's launcher started the ranks, each given --local_rank=N"
        elif settings.launcher == Launcher.SPAWN:
            report.summary["launcher"] = (
                f"the script starts its own ranks ({spawn_site or 'torch.multiprocessing'}): it ran once, "
                "as a plain process, and each rank it started was recorded"
            )
        if settings.cpu:
            refuse_what_cpu_could_not_map(folder, report)
        lanes = build_lanes(load_traces(folder)) if want_lanes else None
    finally:
        if own_dir and not keep_traces:
            shutil.rmtree(folder, ignore_errors=True)
    return PreflightOutcome(report, folder, launch, lanes)


def _resolve_launcher(
    settings: DryRunSettings, torchrun: TorchrunOptions, path: Path, virtual: VirtualWorld | None
) -> tuple[DryRunSettings, str | None]:
    """The launcher to run the script with (launch/launchers.py) and, for a script that
    starts its own ranks, where it does."""
    found = own_starter(path)
    site = f"{found[0]} at {relative(str(path), os.getcwd())}:{found[1]}" if found else None
    launcher = settings.launcher
    if launcher == Launcher.AUTO:
        # spawn only where the script starts its ranks whatever its options: under a test
        # of them (`if args.multiprocessing_distributed:`), torchrun first; a rank that
        # turns out to start ranks of its own makes preflight run it again with spawn
        certain = found is not None and guard_of(path, found[1]) is None
        launcher = Launcher.SPAWN if certain and virtual is None else Launcher.TORCHRUN
    if launcher != Launcher.TORCHRUN and virtual is not None:
        raise UsageError(
            f"--launcher {launcher} and --world-size: a virtual world's ranks are started by ncclcheck"
        )
    if settings.accelerate_config and launcher != Launcher.ACCELERATE:
        raise UsageError(f"--accelerate-config goes with --launcher accelerate, not --launcher {launcher}")
    wrong = ""
    if launcher == Launcher.ACCELERATE:
        wrong = check_accelerate(settings.accelerate_config, torchrun.nnodes)
    elif launcher == Launcher.DEEPSPEED:
        wrong = check_deepspeed(torchrun.nnodes)
    if wrong:
        raise UsageError(wrong)
    return settings.started_by(launcher), site if launcher is Launcher.SPAWN else None


def _check_allocation(torchrun: TorchrunOptions) -> None:
    """Inside a Slurm allocation, the tasks asked for must be ones it can give."""
    granted = os.environ.get("SLURM_NTASKS")
    nodes = int(str(torchrun.nnodes).split(":")[-1] or 1)
    asked = torchrun.nproc_per_node * nodes
    if granted and granted.isdigit() and asked > int(granted):
        raise UsageError(
            f"--launcher slurm: {asked} ranks asked ({torchrun.nproc_per_node} per node x {nodes}), "
            f"the allocation gives {granted} tasks (SLURM_NTASKS)"
        )


def _own_launcher_exit(folder: Path) -> str | None:
    """A rank that tried to start ranks of its own: the launcher and where, or None. From
    the traces' last lines: the whole traces are read once, by the diagnosis."""
    for ending in exits_written(folder):
        if ending.how is End.OWN_LAUNCHER:
            site = ending.site
            where = f" at {relative(site.file, os.getcwd())}:{site.line}" if site is not None else ""
            return f"{ending.error}{where}"
    return None


def report_from(folder: Path, launch: LaunchResult | None) -> Report:
    return Diagnosis.of(folder, launch).report


@dataclass
class Diagnosis:
    """A run's evidence, its report, and the replay that would decide its first finding
    where the source alone did not (explain/lines.py's plan), if any."""

    evidence: Evidence
    report: Report
    launch: LaunchResult | None
    replay_plan: dict[str, Any] | None
    not_run: list[Gap]

    @classmethod
    def of(
        cls, folder: Path, launch: LaunchResult | None, ranks_run: dict[int, str] | None = None
    ) -> Diagnosis:
        evidence = _evidence_from(folder, launch)
        evidence.ranks_run = ranks_run
        return cls.read(evidence, launch)

    @classmethod
    def read(cls, evidence: Evidence, launch: LaunchResult | None) -> Diagnosis:
        report, replay_plan, not_run = diagnose(evidence)
        if launch is not None and launch.probe_failed:
            report.findings.insert(0, _probe_finding(evidence.traces, evidence.world_size))
            report.verdict = Verdict.CRASH
        replay = evidence.lines
        if replay is not None:
            report.summary["line_evidence"] = (
                f"the dry run was replayed up to the divergence ({replay.seconds:.1f} s) with the functions "
                "on its call chains traced"
                + (f"; it did not run as the first run did: {replay.mismatch}" if replay.mismatch else "")
            )
        return cls(evidence, report, launch, replay_plan, not_run)


SMALL_WORLD = 16  # worlds up to this size run every rank


def _check_virtual(virtual: VirtualWorld) -> None:
    world, per_node = virtual.layout.world_size, virtual.layout.per_node
    if world > MAX_WORLD_SIZE:
        raise UsageError(f"--world-size {world} is above the most a virtual world takes ({MAX_WORLD_SIZE})")
    if per_node < 1 or world < per_node:
        raise UsageError(
            f"--world-size {world} is below --nproc-per-node {per_node}: the world is at least one node"
        )
    outside = [rank for rank in virtual.named if not 0 <= rank < world]
    if outside:
        raise UsageError(f"--ranks {outside[0]} is not a rank of a world of {world}")


def _run_virtual_world(
    script: str,
    script_args: list[str],
    virtual: VirtualWorld,
    settings: DryRunSettings,
    folder: Path,
    on_progress: Callable[[Progress], None] | None,
    as_module: bool,
) -> tuple[LaunchResult, dict[int, str]]:
    """Rank 0 (the reference) alone, then the chosen ranks (or all), through the fork
    server; the result as a launch's, and the ranks that ran with why."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    env = {
        **dry_run_environment(settings.without_probe(), folder),
        ENV_VIRTUAL: str(folder / REFERENCE_FILE),
    }
    command = [*(["-m"] if as_module else []), script, *script_args]
    jobs = max(1, os.cpu_count() or 1)
    world = virtual.layout.world_size
    done: list[int] = []

    def finished(rank: int) -> None:
        done.append(rank)
        if on_progress is not None:
            on_progress(Progress(ranks_up=len(done), elapsed=0.0))

    # No rank waits on another: a rank quiet this long is busy on its own (a slow write,
    # a wait outside torch.distributed), where the others would wait for it.
    quiet = settings.lone_rank_quiet_s
    with VirtualServer(env, folder) as server:
        first = server.run(command, env, virtual.layout, [0], quiet, jobs, finished)
        if virtual.all_ranks or world <= SMALL_WORLD:
            why = "--all-ranks" if virtual.all_ranks else "every rank of a small world"
            ranks_run = {rank: why for rank in range(world)}
        else:
            reference = reference_of(folder)
            ranks_run = chosen_ranks(
                virtual.layout, reference.dataset_sizes, list(virtual.named), reference.subgroups
            )
        runs = [first]
        others = [rank for rank in ranks_run if rank != 0]
        if others and not first.interrupted:
            runs.append(server.run(command, env, virtual.layout, others, quiet, jobs, finished))
    exits = {rank: code for run in runs for rank, code in run.exits.items()}
    late = sorted(rank for run in runs for rank in run.timed_out)
    launch = LaunchResult(
        folder,
        folder / LOG_NAME,
        0,
        interrupted=any(run.interrupted for run in runs),
        stalled=bool(late),
        stall_seconds=quiet,
        stall_reason=f"rank {late[0]} was still busy on its own after {quiet:.0f} s and was stopped"
        if late
        else "",
        elapsed=sum(run.elapsed for run in runs),
        rank_exits={rank: code for rank, code in exits.items() if code != 0 and rank not in late},
    )
    return launch, ranks_run


def _evidence_from(folder: Path, launch: LaunchResult | None) -> Evidence:
    traces = load_traces(folder)
    if not traces and launch is None:
        empty = len(list(folder.rglob(TRACE_GLOB)))
        raise InputError(
            f"{folder}: its {empty} trace file(s) are empty (the ranks never started their bootstrap)"
            if empty
            else f"{folder}: no trace files (rank-*.jsonl) in it",
            hint="Give --from the folder(s) preflight --trace-dir wrote on each node.",
        )
    if not traces and launch is not None:
        if launch.interrupted or launch.timed_out:
            # stopped from outside before any rank wrote: nothing checked, which is not an
            # error in the script (incomplete, exit 4, like a stop later in the run)
            return Evidence(
                traces={},
                world_size=0,
                stopped=_why_it_stopped(folder, traces, launch),
                incomplete=_why_unfinished(launch, traces),
            )
        raise launch_failure(launch) or no_rank_recorded(launch)
    world = max(t.world_size for t in traces.values())
    refuse_what_cannot_be_checked(traces, launch)
    return Evidence(
        traces=traces,
        world_size=world,
        # From traces alone, a rank whose trace ends without an exit line was stopped
        # while it ran: the node's preflight saw it hang.
        stalled=bool(launch.stalled) if launch else any(t.exit is None for t in traces.values()),
        stall_seconds=launch.stall_seconds if launch else 0.0,
        stacks=launch.stacks if launch else {},
        rank_exits=launch.rank_exits if launch else {},
        first_failure=launch.first_failure if launch else None,
        stopped=_why_it_stopped(folder, traces, launch),
        incomplete=_why_unfinished(launch, traces),
        outside_waits=launch.outside_waits if launch else [],
    )


def _why_unfinished(launch: LaunchResult | None, traces: dict[int, RankTrace]) -> str | None:
    """A dry run stopped from outside before its budget was spent (never a hang: a hang
    is a finding, and the stall watchdog's stop is how it is found)."""
    if launch is None or launch.stalled:
        return None
    if launch.undecided_wait is not None:
        return launch.undecided_wait
    if launch.interrupted:
        return "the dry run was stopped by a signal to preflight (Ctrl-C, SIGTERM)"
    if launch.timed_out:
        return "the dry run reached ncclcheck's time limit for a dry run"
    # the launcher ended ranks mid-script, before their distributed work ended, because
    # another rank's process failed after its script had returned (torch 2.13's gloo
    # teardown aborts now and then at exit): no rank crashed in the script, but what the
    # ended ranks had left to run was not checked. A rank that died in its script is a
    # crash (a finding), not this.
    codes = launch.rank_exits
    failed_at_exit = [
        r
        for r, t in sorted(traces.items())
        if t.exit is not None and t.exit.how is End.RETURNED and codes.get(r, 0) != 0
    ]
    cut = sorted(r for r, t in traces.items() if t.exit is None and not t.destroyed)
    if cut and failed_at_exit and launch.after_distributed_s is None:
        first = failed_at_exit[0]
        return (
            f"the launcher ended {who(cut)} before the script's end after {who(failed_at_exit)}'s "
            f"process failed at its exit (exit code {codes[first]}), its script having returned"
        )
    return None


def _may_replay(torchrun: TorchrunOptions, settings: DryRunSettings) -> bool:
    """Whether a replay for line evidence may follow the dry run: one node only (the
    other nodes' ranks are not this preflight's to replay), ranks started by a launcher
    (torchrun, or accelerate, deepspeed, torch.distributed.launch again), not by the
    script itself."""
    return settings.line_evidence and settings.launcher != Launcher.SPAWN and torchrun.nnodes in ("1", "1:1")


def _first_run_server(
    torchrun: TorchrunOptions, settings: DryRunSettings, files: list[str]
) -> tuple[WarmReplay | None, str | None]:
    """The server that forks the first run's ranks under --warm-start, where torchrun
    would start them on this node alone (--standalone), and why there is none where the
    source (``files``: the script and its local modules) takes a set's items in their
    order: forked ranks share their server's string-hash seed, so they would all meet
    the items in one order where torchrun's ranks each meet them in their own."""
    alone = "--standalone" in torchrun.argv()
    if not (settings.warm_start and settings.launcher == Launcher.TORCHRUN and alone):
        return None, None
    seeded = os.environ.get("PYTHONHASHSEED", "random") != "random"  # every interpreter alike anyway
    over_a_set = None if seeded else first_iteration_of_a_set(files)
    if over_a_set is not None:
        path, line, text = over_a_set
        return None, (
            f"--warm-start not used: {relative(path, os.getcwd())}:{line} takes the items of a set "
            f"(`{text}`) in its order, which each interpreter's string hashing decides; ranks forked from "
            "one interpreter would all share it, so torchrun started them"
        )
    return WarmReplay.start(
        torchrun.nproc_per_node, for_the_first_run=True, with_dynamo=uses_torch_dynamo(files)
    ), None


class _WarmUp:
    """The replay's server (launch/replay.py), started at the first sign of a hang (a
    quiet spell, or a run that failed) so that its torch import overlaps the wait for
    the verdict and the diagnosis; closed whatever happens. Under --warm-start (many dry
    runs on one machine, where CPU is what is short) the first run's server forks the
    replay too, torch imported once for every run."""

    def __init__(
        self,
        torchrun: TorchrunOptions,
        settings: DryRunSettings,
        folder: Path,
        first_server: WarmReplay | None = None,
    ) -> None:
        self.torchrun, self.settings, self.folder = torchrun, settings, folder
        self.first_server = first_server
        self.server: WarmReplay | None = None

    def _fits(self) -> bool:
        # ranks as torchrun starts them (the server gives its environment): an accelerate,
        # deepspeed or torch.distributed.launch run's replay goes through that launcher again
        fits = self.settings.launcher in (Launcher.TORCHRUN, Launcher.SLURM)
        return self.server is None and fits and _may_replay(self.torchrun, self.settings)

    def start(self) -> None:
        """At the first sign of a hang: the server, ahead of a replay that may follow."""
        if self.first_server is None and self._fits():
            self.server = WarmReplay.start(self.torchrun.nproc_per_node, self.folder)

    def for_replay(self) -> WarmReplay | None:
        """The server for a replay now decided: the first run's, or the one started ahead."""
        return self.first_server if self.first_server is not None else self.server

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@dataclass(frozen=True)
class _Again:
    """What a second run of the script takes besides its settings: a replay, a forcing run."""

    script: str
    script_args: list[str]
    torchrun: TorchrunOptions
    as_module: bool

    def run(self, settings: DryRunSettings, folder: Path, warm: WarmReplay | None = None) -> LaunchResult:
        return run_dry(
            self.script, self.script_args, self.torchrun, settings, folder, None, self.as_module, warm
        )


def _with_line_evidence(
    first: Diagnosis,
    again: _Again,
    settings: DryRunSettings,
    warm_server: Callable[[], WarmReplay | None] | None = None,
) -> Diagnosis:
    """Replay the dry run up to the first divergence with the functions on its call
    chains traced (explain/lines.py), when the source alone was not certain why the
    ranks parted: anything but a rank test around the call itself. ``warm_server``: the
    server with torch imported that forks the replay's ranks (launch/replay.py), if any."""
    launch = first.launch
    if launch is None or launch.interrupted or not _may_replay(again.torchrun, settings):
        return first
    plan = first.replay_plan
    if plan is None:
        return first
    warm = warm_server() if warm_server is not None else None
    stops = {int(rank): int(n) for rank, n in plan["stop"].items()}
    folder = private_trace_dir()
    try:
        plan_path = folder / "lines-plan.json"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        replay_settings = settings.for_replay(str(plan_path))
        started = time.monotonic()
        replayed = again.run(replay_settings, folder / "replay", warm)
        if warm is not None and not replayed.interrupted and not any((folder / "replay").glob(TRACE_GLOB)):
            # the warm server ended before it forked a rank (seen once on a loaded machine,
            # its output unread): the replay through torchrun, as without it
            again.run(replay_settings, folder / "replay")
        replay = load_replay(folder / "replay", first.evidence.traces, stops)
        replay.seconds = time.monotonic() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    first.evidence.lines = replay
    return Diagnosis.read(first.evidence, first.launch)


# Each forced decision is a dry run of its own: the first few the run reached are forced,
# the rest stay listed as not checked (a script with more is rare, and each costs a run).
MAX_FORCED_DECISIONS = 3
FORCED_RANK = 1  # not rank 0, which scripts often set apart by design (logging, saving)


def _with_forced_decisions(
    first: Diagnosis,
    again: _Again,
    settings: DryRunSettings,
    warm: WarmReplay | None = None,
) -> Diagnosis:
    """Run again with one rank made to take the other side of each decision on a rank's own
    value that the dry run reached without the ranks parting (lint/decisions.py,
    record/firing.py): what the real run does the day one rank's loss, clock or batch goes
    its own way. Where the ranks then part, that run's report is the answer, said as forced;
    where they stay aligned, the decision is checked and no longer listed as not run.
    ``warm``: the server that forks a forcing run's ranks (--warm-start), else torchrun
    starts them."""
    report, launch = first.report, first.launch
    world = first.evidence.world_size
    if (
        not settings.force_decisions
        or launch is None
        or launch.interrupted
        or report.has_errors
        or report.verdict not in (Verdict.ALIGNED, Verdict.PARTIAL)
        or world <= FORCED_RANK
        or again.torchrun.nnodes not in ("1", "1:1")  # the other nodes' ranks are not this preflight's
        or settings.launcher == Launcher.SPAWN
    ):
        return first
    # a test whose values were alike on every rank is not turned on one: a state the real
    # run reaches only if those values can differ, which the dry run says nothing of
    reached = [gap for gap in first.not_run if gap.decision is not None and gap.reached and not gap.alike]
    if not reached:
        return first
    said: list[str] = []
    checked: list[Gap] = []
    for gap in reached[:MAX_FORCED_DECISIONS]:
        assert gap.decision is not None
        path, line = gap.decision.path, gap.decision.line
        where = f"{relative(path, first.evidence.cwd)}:{line}"
        folder = private_trace_dir()
        started = time.monotonic()
        try:
            forced_launch = again.run(settings.forcing(path, line, FORCED_RANK), folder, warm)
            forced = Diagnosis.of(folder, forced_launch)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        seconds = time.monotonic() - started
        if forced_launch.interrupted:
            break  # stopped by a signal: what was forced so far is said
        outcome = _what_forcing_did(forced, path, line)
        if outcome.parted:
            _say_forced(forced.report, gap, where, outcome.text)
            forced.report.summary["forced"] = [*said, f"{where}: {outcome.text} ({seconds:.1f} s)"]
            return forced
        said.append(f"{where}: {outcome.text} ({seconds:.1f} s)")
        if outcome.checked:
            checked.append(gap)
    left = len(reached) - MAX_FORCED_DECISIONS
    if left > 0:
        said.append(f"{left} more decision(s) of this kind not forced: at most {MAX_FORCED_DECISIONS} runs")
    if said:
        report.summary["forced"] = said
    remaining = [gap for gap in first.not_run if gap not in checked]
    if remaining:
        report.summary["not_run"] = [gap.text for gap in remaining]
    else:
        report.summary.pop("not_run", None)
    if report.verdict is Verdict.PARTIAL and not any(gap.communicates for gap in remaining):
        report.verdict = Verdict.ALIGNED
    first.not_run = remaining
    return first


@dataclass(frozen=True)
class _Forced:
    text: str
    parted: bool = False  # the ranks parted after it: the forced run's report is the answer
    checked: bool = False  # they went on together past it, through collectives


def _what_forcing_did(forced: Diagnosis, path: str, line: int) -> _Forced:
    """Read the forcing run: whether the forced side was taken, and what followed."""
    traces = forced.evidence.traces
    trace = traces.get(FORCED_RANK)
    turned = next(
        (
            d
            for d in (trace.decided if trace else [])
            if d.forced and os.path.realpath(d.site.file) == os.path.realpath(path) and d.site.line == line
        ),
        None,
    )
    if turned is None:
        return _Forced(
            f"forced on rank {FORCED_RANK}, its test was not reached there in that run: not checked"
        )
    side = "true" if turned.taken else "false"
    head = (
        f"its test made {side} on rank {FORCED_RANK} alone, from its first test in "
        f"{turned.site.function}() on"
    )
    if _is_a_handler(path, line):
        head = (
            f"an error it catches raised on rank {FORCED_RANK} alone at the start of its try, the first "
            f"time {turned.site.function}() ran it"
        )
    report = forced.report
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    own = trace.exit if trace else None
    if own is not None and own.how is End.EXCEPTION:
        # a forced side can be one the script's state never allows (an `if x is None` turned
        # with x set): what it raised says nothing of the real run
        return _Forced(f"{head}: rank {FORCED_RANK} then raised {own.message or 'an exception'}; not checked")
    if errors:
        return _Forced(head, parted=True)
    if not all(max((call.time for call in t.calls), default=0.0) > turned.time for t in traces.values()):
        return _Forced(f"{head}: no collective ran after it before the dry run ended; not checked")
    return _Forced(f"{head}: the ranks stayed aligned through the collectives after it", checked=True)


def _is_a_handler(path: str, line: int) -> bool:
    """Whether ``path:line`` is an except clause (a forced handler), not an if's test."""
    return any(
        isinstance(node, ast.ExceptHandler) and node.lineno == line
        for node in ast.walk(reading.parse(path) or ast.Module([], []))
    )


def _say_forced(report: Report, gap: Gap, where: str, what: str) -> None:
    """The forcing run's first error, said as what follows when one rank takes the decision:
    the decision is the cause (lint's reading of it) and its test the site; where the
    ranks then parted is the evidence."""
    decision = gap.decision
    assert decision is not None
    finding = next(f for f in report.findings if f.severity is Severity.ERROR)
    # what each rank did where they parted stays; the forcing run's own reading of why (a
    # test watched apart, or none found on the way) does not: the forced test is the reason
    finding.evidence = [line for line in finding.evidence if line.startswith(("rank ", "call chain"))]
    finding.evidence[:0] = [
        f"the ranks then parted at {finding.site}" if finding.site else "the ranks then parted",
        (
            "no rank caught an error there in the first dry run; this is the run in which rank "
            f"{FORCED_RANK} alone caught one, as the real run does the day a record, a file or a "
            "batch fails on one rank"
        )
        if decision.cause is Cause.RANK_EXCEPTION
        else "the first dry run's ranks had all taken it alike; this is the run in which rank "
        f"{FORCED_RANK} alone took the other side, as the real run does the day its own value differs",
    ]
    finding.message = (
        f"an error one rank catches and swallows, as lint reads it: {decision.reading}; {what}: the "
        "ranks parted"
        if decision.cause is Cause.RANK_EXCEPTION
        else f"a decision each rank takes on a value of its own, as lint reads it: {decision.reading}; "
        f"{what}: the ranks parted"
    )
    if finding.cause is not decision.cause:
        finding.cause = decision.cause
        entry = load_catalogue().get(decision.cause)
        finding.fix, finding.playbook = entry.fix.direct, decision.cause.value
    finding.site = where
    # the forced decision is checked: it parted the ranks
    listed = report.summary.get("not_run")
    if isinstance(listed, list):
        kept = [text for text in listed if not str(text).startswith(f"{where}:")]
        if kept:
            report.summary["not_run"] = kept
        else:
            report.summary.pop("not_run")


def _why_it_stopped(folder: Path, traces: dict[int, RankTrace], launch: LaunchResult | None) -> str:
    if launch is None:
        return f"diagnosed from the traces in {folder}"
    if launch.interrupted:
        return "interrupted: preflight got a signal (Ctrl-C, SIGTERM) and stopped the dry run"
    if launch.stalled:
        why = launch.stall_reason or f"no rank made progress for {launch.stall_seconds:.0f} s"
        return f"stalled: {why}; " + ("stacks captured, job stopped" if launch.stacks else "job stopped")
    if launch.timed_out:
        return "stopped: the dry run reached its total time limit"
    if launch.undecided_wait is not None:
        return f"stopped: {launch.undecided_wait}"
    if launch.after_distributed_s is not None:
        running = sorted(r for r, t in traces.items() if t.exit is None)
        return (
            f"every rank had ended its distributed work (destroy_process_group); "
            f"{who(running)} still ran {launch.after_distributed_s:.0f} s later, outside "
            "torch.distributed, and was stopped: nothing it does then can wait on a peer"
        )
    cut_after_destroy = sorted(r for r, t in traces.items() if t.exit is None and t.destroyed)
    if cut_after_destroy and all(t.exit is not None or t.destroyed for t in traces.values()):
        codes = ", ".join(
            f"exit code {launch.rank_exits[r]}" for r in cut_after_destroy if r in launch.rank_exits
        )
        return (
            f"every rank had ended its distributed work (destroy_process_group); "
            f"{who(cut_after_destroy)} was then ended by the launcher{f' ({codes})' if codes else ''}, "
            "outside torch.distributed: nothing it did then could wait on a peer"
        )
    stops = {t.exit.stop for t in traces.values() if t.exit is not None and t.exit.stop}
    if stops:
        return "; ".join(sorted(stops))
    hows = {t.exit.how.value for t in traces.values() if t.exit is not None}
    # a rank with no exit line did not run to its end: a signal (torchrun's SIGTERM after
    # another rank failed; its own SIGABRT, as gloo aborts a rank that receives a buffer of
    # another size), a kill, whatever the others did
    unended = sorted(r for r, t in traces.items() if t.exit is None)
    if hows == {End.RETURNED.value} and not unended:
        return "the script ran to its end on every rank"
    said = sorted(hows)
    if unended:
        exits = launch.rank_exits
        ends = ", ".join(f"rank {r}: {_exit_said(exits[r])}" if r in exits else f"rank {r}" for r in unended)
        said.append(f"ended before its script's end with no exit of its own ({ends})")
    return "the job ended: " + ", ".join(said or ["no exit recorded"])


def _exit_said(code: int) -> str:
    """An exit code as a reader wants it: a signal by its name (-6: SIGABRT, the process
    aborted itself; gloo does so on a buffer of another size), else the code."""
    name = signal_name(code)
    if name == "SIGABRT":
        return (
            "SIGABRT (it aborted itself: gloo does on a buffer of another size, NCCL's watchdog on a timeout)"
        )
    return f"{name}" if name else f"exit code {code}"


def _probe_finding(traces: dict[int, RankTrace], world: int) -> Finding:
    failed = [t.probe for t in traces.values() if t.probe and not t.probe.get("ok")]
    missing = sorted({int(r) for p in failed for r in p.get("missing", [])})
    present = {int(r): str(v) for p in failed for r, v in p.get("present", {}).items()}
    hosts = {v.split("|")[1]: v.split("|")[0] for v in present.values() if v.count("|") == 2}
    evidence = []
    for rank in missing:
        trace = traces.get(rank)
        if trace is not None:
            evidence.append(f"rank {rank} started on {trace.host} (pid {trace.pid}) but did not check in")
        else:
            evidence.append(f"rank {rank} never started its bootstrap")
    if hosts:
        evidence.append(
            "hosts that checked in, by node: " + ", ".join(f"node {g}: {h}" for g, h in sorted(hosts.items()))
        )
    return Finding(
        cause=Cause.RANK_CRASHED,
        severity=Severity.ERROR,
        message=(
            f"rendezvous probe: ranks {format_ranks(missing)} of {world} never checked in "
            f"before the training script started"
        ),
        ranks=sorted(present),
        absent_ranks=missing,
        evidence=evidence,
        fix="Check that every node runs the same command with the same rendezvous options, "
        "and that the missing ranks' processes start (their log shows why not).",
    )


# what a GPU torch can count needs on Linux: NVIDIA's driver (CUDA), AMD's (ROCm's HIP)
_GPU_DRIVERS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/kfd")


def default_nproc() -> int:
    """The number of visible GPUs, or 2 where there are none (docs/contract.md)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 2
    if sys.platform == "linux" and not any(os.path.exists(path) for path in _GPU_DRIVERS):
        return 2  # no GPU driver: torch would count none (its import alone is 1.5 s of CPU)
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:
        count = 0
    return count if count > 0 else 2
