"""What a dry run that never reached a collective says, in one line and exit 2:
torchrun's own start-up failures, ranks that died before their recorder started or
before init_process_group (which ranks, their exit codes, the last error they printed),
scripts that start their own ranks under --launcher torchrun, and CUDA calls --cpu did
not map. Never "torchrun failed" when the script ran."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ncclcheck.errors import InputError
from ncclcheck.evidence.traces import RankTrace, load_traces
from ncclcheck.launch.torchrun import LaunchResult
from ncclcheck.model import Report
from ncclcheck.record.tracefile import End
from ncclcheck.settings import Launcher
from ncclcheck.wording import relative, signal_name, who


def no_rank_recorded(launch: LaunchResult) -> InputError:
    """No rank wrote a trace: say what the launch shows of why, never "torchrun failed"
    when the script ran (its ranks may have died before their recorder started)."""
    tail = launch.log_tail(8)
    hint = f"Its last output:\n{tail}" if tail else None
    starter = "the script" if launch.launcher == Launcher.SPAWN else launch.launcher
    if launch.stalled:
        return InputError(
            f"no rank started within the dry run: {launch.stall_reason or 'nothing ran'} while "
            f"{starter} was still starting, and it was stopped",
            hint=hint,
        )
    if launch.rank_exits:
        exits = ", ".join(
            f"rank {rank} {_exit_words(code)}" for rank, code in sorted(launch.rank_exits.items())
        )
        errors = launch.error_lines()
        plural = "s" if len(errors) > 1 else ""
        died_of = f"; the last error{plural} printed: {' | '.join(errors)}" if errors else ""
        return InputError(
            f"the ranks {starter} started ended before ncclcheck's recorder ran in them "
            f"(before their first collective): {exits}{died_of}",
            hint=hint,
        )
    code = launch.returncode
    ended = f"exited with code {code}" if code is not None and code >= 0 else "was killed"
    if launch.launcher == Launcher.SPAWN:
        return InputError(f"the script {ended} before it started any rank", hint=hint)
    return InputError(f"no rank started: {launch.launcher} {ended} before running the script", hint=hint)


def _exit_words(code: int) -> str:
    if code < 0:
        return f"was killed by {signal_name(code) or f'signal {-code}'}"
    return f"exited with code {code}"


_PORT_IN_USE = re.compile(r"port: (\d+).*EADDRINUSE")
_RENDEZVOUS_UNREACHABLE = re.compile(
    r"(RendezvousConnectionError|RendezvousTimeoutError|DistNetworkError)[^\n]*?:\s*(.*)"
)


def launch_failure(launch: LaunchResult) -> InputError | None:
    """torchrun's own start-up failures, said in one line with what to do."""
    try:
        log = launch.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    port = _PORT_IN_USE.search(log)
    if port:
        return InputError(
            f"no rank started: the rendezvous port {port.group(1)} is already in use",
            hint="Another job or a leftover torchrun holds it: pick a free --master-port, or give "
            "none and let ncclcheck run torchrun --standalone on a free port.",
        )
    unreachable = _RENDEZVOUS_UNREACHABLE.search(log)
    if unreachable:
        return InputError(
            f"no rank started: torchrun's rendezvous failed ({unreachable.group(1)}: "
            f"{unreachable.group(2).strip()[:200]})",
            hint="Check --rdzv-endpoint / --master-addr and --master-port: the first node must "
            "be reachable from every node, with the same --nnodes and --rdzv-id everywhere.",
        )
    return None


# Read in the error without its " at file:line" (RankEnding.message): a path of the
# user's (~/cuda_experiments/train.py) says nothing about the error.
_CUDA_ERROR = re.compile(r"cuda|nvidia|nccl|cudnn", re.IGNORECASE)


def refuse_what_cpu_could_not_map(folder: Path, report: Report) -> None:
    """A rank that failed on a CUDA call --cpu does not map: say so (exit 2), not a crash."""
    for trace in load_traces(folder).values():
        ending = trace.exit
        if ending is not None and ending.how is End.EXCEPTION and _CUDA_ERROR.search(ending.message):
            error = ending.error or ""
            mapped = report.summary.get("cpu") or []
            raise InputError(
                f"--cpu could not run this script on CPU: rank {trace.rank} failed with {error}",
                hint=(
                    "--cpu maps the backend, .cuda()/.to('cuda'), device='cuda', torch.cuda's "
                    "device queries, DDP device_ids and autocast; not streams, events or custom "
                    "kernels. Mapped before the failure: " + ("; ".join(map(str, mapped)) or "nothing")
                ),
            )


def refuse_what_cannot_be_checked(traces: dict[int, RankTrace], launch: LaunchResult | None) -> None:
    """Scripts that never got as far as a process group, or that start their own ranks:
    exit 2, with what they said."""
    exits = [t.exit for t in traces.values() if t.exit is not None]
    refused = next((e for e in exits if e.how is End.VIRTUAL_REFUSED), None)
    if refused is not None:
        raise InputError(
            f"--world-size: {refused.error}",
            hint="Or run it without --world-size, on real ranks.",
        )
    own = next((e for e in exits if e.how is End.OWN_LAUNCHER), None)
    if own is not None:
        site = own.site
        where = f" at {relative(site.file, os.getcwd())}:{site.line}" if site is not None else ""
        launcher = own.error or "a launcher of its own"
        raise InputError(
            f"the script starts its own ranks with {launcher}{where}, and --launcher torchrun runs "
            "each rank through torchrun: the processes the script starts would run unrecorded",
            hint="Run it with --launcher spawn (or without --launcher torchrun): preflight runs the "
            "script once and records every rank it starts.",
        )
    if any(t.initialised for t in traces.values()) or any(
        t.probe and not t.probe.get("ok") for t in traces.values()
    ):
        return
    if launch is not None and (launch.stalled or launch.interrupted or launch.timed_out):
        return
    tail = launch.log_tail(6) if launch else ""
    failing = [
        t
        for t in sorted(traces.values(), key=lambda t: t.rank)
        if t.exit is not None and t.exit.how in (End.EXCEPTION, End.SYS_EXIT) and t.exit.code
    ]
    if failing:
        first = failing[0].exit
        assert first is not None
        error = first.error or f"exit code {first.code}"
        world = max(t.world_size for t in traces.values())
        if len(failing) < max(world, len(traces)):  # not every rank: say which did what
            raise InputError(
                _ended_before_init(failing, traces, launch),
                hint=("Its last output:\n" + tail) if tail else None,
            )
        hint = (
            ("Its last output:\n" + tail)
            if tail
            else "Does it need arguments? Pass them after the script name."
        )
        if _CUDA_ERROR.search(first.message):
            hint = (
                "A script written for NCCL/CUDA, on a machine without them: rerun with --cpu "
                "(gloo and CPU tensors, mapped for you), or on a GPU node. " + hint
            )
        raise InputError(f"the script failed on every rank before init_process_group: {error}", hint=hint)
    raise InputError(
        "the script never called torch.distributed.init_process_group: no collective to check",
        hint="preflight checks distributed training scripts; run this one with python directly.",
    )


def _ended_before_init(
    failing: list[RankTrace], traces: dict[int, RankTrace], launch: LaunchResult | None
) -> str:
    """Some ranks failed before init_process_group, the others were stopped or never
    started: each rank's part, from its trace and the launcher's exit codes."""
    codes = launch.rank_exits if launch else {}
    parts = []
    for trace in failing:
        ending = trace.exit
        assert ending is not None  # failing: ranks that wrote how they ended
        parts.append(f"rank {trace.rank} exited with code {ending.code} ({ending.error})")
    failed_ranks = {t.rank for t in failing}
    for rank in sorted(set(traces) - failed_ranks):
        code = codes.get(rank)
        how = f", {_exit_words(code)}" if code is not None else ""
        parts.append(f"rank {rank} had not reached a collective and was stopped with the job{how}")
    world = max(t.world_size for t in traces.values())
    unseen = sorted(set(range(world)) - set(traces))
    if unseen:
        parts.append(f"{who(unseen)} never started ncclcheck's recorder")
    return (
        f"{who(sorted(failed_ranks))} failed before init_process_group, before any collective: "
        + "; ".join(parts)
    )
