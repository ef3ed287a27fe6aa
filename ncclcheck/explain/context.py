"""What every rule reads: the evidence (a dry run's traces, the stacks of a stalled or
hung job), the catalogue, the questions rules ask of them (``Context``), and ``Fork``:
ranks at different calls at one point of their histories, which the source reading
(rules/branch.py) and the replay's line evidence (lines.py) both explain."""

from __future__ import annotations

import ast
import os
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from ncclcheck.catalogue import Catalogue, load_catalogue
from ncclcheck.causes import Cause
from ncclcheck.communicates import shards_parameters
from ncclcheck.evidence.replayed import Replay
from ncclcheck.evidence.stacks import ProcessStack
from ncclcheck.evidence.traces import RankTrace
from ncclcheck.evidence.waits import OutsideWait, timeout_limit
from ncclcheck.explain.engine import Explanation, Reason, framework_fixes
from ncclcheck.model import CollectiveCall, Frame
from ncclcheck.record.tracefile import End
from ncclcheck.source import reading
from ncclcheck.wording import first_line, is_user, op_text, relative, shapes_text

# What a process raises on itself (abort(), a fault): never how preflight, torchrun or a
# scheduler stop ranks (SIGTERM, SIGINT, SIGKILL)
_SELF_RAISED_SIGNALS = frozenset(
    {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
)

# A rank that died of its device, its memory or the runtime under it: nothing in the code
# decided it (rank-crashed). Any other exception is the code's or its data's (a corrupt
# record, a missing file, a bad value), raised on that rank alone: rank-exception, caught
# or not, sited where it was raised.
_FAILURE_BENEATH_THE_CODE = re.compile(
    r"out of memory|OutOfMemoryError|MemoryError|CUDA error|CUDNN_STATUS|CUBLAS_STATUS|NCCL error"
    r"|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|HIP error|Segmentation fault"
    r"|illegal memory access|ECC error|\bXid\b"
    # an exit asked for (sys.exit(7), a stand-in for a kill) or a signal: no error raised
    r"|SystemExit|KeyboardInterrupt",
    re.I,
)


def death_cause(error: str | None) -> Cause:
    """What a rank that ended of ``error`` (an exception's last line; None: a signal or an
    exit code with no exception) counts as."""
    if not error or _FAILURE_BENEATH_THE_CODE.search(error):
        return Cause.RANK_CRASHED
    return Cause.RANK_EXCEPTION


def uncaught_fix(raised_at: str | None, error: str) -> str:
    """The fix for an exception of the code's own that ended one rank (the playbook's is
    about one caught around a collective)."""
    where = f" at {raised_at}" if raised_at else ""
    return (
        f"Handle the error{where} where it is raised, around the local work only (skip or replace "
        "the bad record with a neutral one, zero weight), so that this rank still makes every "
        "collective; or make skipping a decision every rank takes (all_reduce an ok flag, skip or "
        f"stop together). And fix what raised it ({first_line(error, 120)})."
    )


@dataclass
class Evidence:
    """What the rules may read of a job of ``world_size`` ranks, all of it optional: a dry
    run's traces and how its ranks ended (preflight), the stacks of ranks that wait
    (preflight's stall, doctor's live job), a replay's line evidence."""

    world_size: int
    traces: dict[int, RankTrace] = field(default_factory=dict)
    stalled: bool = False
    stall_seconds: float = 0.0
    stacks: dict[int, ProcessStack] = field(default_factory=dict)
    # ranks of the job that run on other hosts than the stacks' (doctor --pid on one node of
    # several): nothing here says where they are, so no rule sets them apart
    on_other_hosts: list[int] = field(default_factory=list)
    rank_exits: dict[int, int] = field(default_factory=dict)  # from the launcher, by rank
    first_failure: int | None = None
    stopped: str | None = None  # why the run ended, in words
    cwd: str = field(default_factory=os.getcwd)
    lines: Replay | None = None  # what a replay up to the divergence saw (explain/lines.py)
    ranks_run: dict[int, str] | None = None  # a virtual world's ranks that ran, with why
    # why the run ended before its budget was spent (a signal, the time limit), if it did
    incomplete: str | None = None
    # quiet spells of a dry run with ranks outside every collective, waited for (evidence/waits.py)
    outside_waits: list[OutsideWait] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    """The evidence and the catalogue every rule reads, with the questions rules ask of
    them (how a rank ended, where it is, how a call is said). A rule returns what it
    found and changes nothing here."""

    ev: Evidence
    catalogue: Catalogue = field(default_factory=load_catalogue)

    # -- small helpers -----------------------------------------------------------------

    def site(self, frame: Frame | None) -> str | None:
        return f"{relative(frame.file, self.ev.cwd)}:{frame.line}" if frame else None

    def model_call_site(self, call: CollectiveCall) -> str | None:
        """Where a loop's step called the model, for a collective a sharded model issues for
        its modules (FSDP's unshard, ZeRO-3's gather) inside the user's ``forward`` methods:
        the frame past that run of ``forward`` frames, as the loop's line (``logits =
        model(x)``) rather than a layer's inside the model. Any other call: its own site."""
        stack = call.user_stack
        if not shards_parameters(call.issuer, call.op) or not stack:
            return self.site(call.site)
        outer = len(stack)
        while outer > 0 and stack[outer - 1].function == "forward":
            outer -= 1
        return self.site(stack[outer - 1] if 0 < outer < len(stack) else call.site)

    def caught_by(self, ranks: Sequence[int], path: str, swallowing: ast.Try) -> list[str]:
        """What each of ``ranks`` caught in the handlers of ``swallowing`` (a try in ``path``),
        as the run noted it (record/firing.py): the error, where it was raised, the except
        that swallowed it. The measured reason of a skipped call, where the source can only
        say that a handler could have."""
        lines = {handler.lineno: handler for handler in swallowing.handlers}
        said: list[str] = []
        for rank in ranks:
            trace = self.ev.traces.get(rank)
            for caught in trace.caught if trace else []:
                handler = lines.get(caught.site.line)
                if handler is None or os.path.realpath(caught.site.file) != os.path.realpath(path):
                    continue
                raised = (
                    f", raised at {self.site(caught.raised)} in {caught.raised.function}()"
                    if caught.raised
                    else ""
                )
                kinds = f" {ast.unparse(handler.type)}" if handler.type is not None else ""
                where = self.site(caught.site)
                said.append(f"rank {rank} caught {caught.error}{raised}, in `except{kinds}` at {where}")
        return said

    def describe_call(self, call: CollectiveCall | None) -> str:
        if call is None:
            return "no call"
        dtype = call.dtypes[0] if call.dtypes else ""
        shapes = shapes_text(call.shapes)
        where = self.site(call.site) or "?"
        function = call.site.function if call.site else "?"
        step = ""
        if call.position:
            step = f", {call.position.get('loader')} batch {call.position.get('batch')}"
        via = " (DDP gradient bucket)" if call.source == "ddp" else ""
        if call.shadow:
            via += " (a stand-in DDP's Join makes for a rank out of batches)"
        tensors = f" {dtype}{shapes}" if shapes else ""
        later = ""
        if call.later is not None:
            ran_in = call.later.ran_in
            inside = f", inside {ran_in.function}() at {self.site(ran_in)}" if ran_in else ""
            later = f"; {call.later.by} ran it later for {call.later.request}{inside}"
        return f"{op_text(call)}{via}{tensors} at {where} in {function}() ({call.phase}{step}{later})"

    def exit_of(self, rank: int) -> tuple[End, int | None]:
        """How a rank ended and its exit code: its trace's exit record, else what the
        launcher saw (KILLED for a non-zero code, RUNNING for none)."""
        trace = self.ev.traces.get(rank)
        if trace is not None and trace.exit is not None:
            return trace.exit.how, trace.exit.code
        code = self.ev.rank_exits.get(rank)
        if code is not None and code != 0:
            return End.KILLED, code
        return End.RUNNING, None

    def died(self, rank: int) -> bool:
        how, code = self.exit_of(rank)
        if how is End.EXCEPTION:
            return True
        if how is End.SYS_EXIT and code not in (None, 0):
            # sys.exit(7): a failed worker to torchrun, which stops the job (a crash); only a
            # clean exit leaves the others waiting (rank-early-exit)
            return True
        if how is End.KILLED and code is not None:
            # torchrun's own SIGTERM to the survivors of a failure is not a death of its own
            return not (code == -15 and self.ev.first_failure not in (None, rank))
        return False

    def aborted_on_its_own(self, rank: int) -> bool:
        """Ended by a signal a process raises on itself (abort(), a fault), never one a
        launcher or preflight stops ranks with: gloo's abort on a buffer of another size."""
        how, code = self.exit_of(rank)
        return how is End.KILLED and code is not None and -code in _SELF_RAISED_SIGNALS

    def stopped_by_launcher(self, rank: int) -> bool:
        """torchrun's SIGTERM to the other ranks after one failed, before this rank went on."""
        how, code = self.exit_of(rank)
        return how is End.KILLED and code == -15 and self.ev.first_failure not in (None, rank)

    @property
    def job_timeout_s(self) -> float | None:
        """How long the job's collectives wait for a peer (init_process_group's timeout,
        the shortest the ranks recorded), where a trace says it."""
        found = [t.timeout_s for t in self.ev.traces.values() if t.timeout_s is not None]
        return min(found) if found else None

    def stall_against_timeout(self) -> str:
        """'9 s without progress', or where the stall reached the job's collective timeout
        '15 s of the job's 20 s collective timeout: the real job fails there'."""
        seconds = self.ev.stall_seconds
        timeout = self.job_timeout_s
        if timeout is not None and seconds >= timeout_limit(timeout):
            return (
                f"{seconds:.0f} s of the job's {timeout:.0f} s collective timeout: the real job fails there"
            )
        return f"{seconds:.0f} s without progress"

    def fix(self, cause: Cause) -> str:
        return self.catalogue.get(cause).fix.direct if cause in self.catalogue else ""

    def explanation(
        self,
        cause: Cause,
        message: str,
        *,
        ranks: list[int],
        absent_ranks: list[int],
        op: str | None,
        site: str | None,
        evidence: list[str],
        libraries: Sequence[str] = (),
        reason: Reason | None = None,
    ) -> Explanation:
        """``libraries``: the packages on the call's stack; where the playbook gives its fix
        in one's own terms (Lightning's self.log, accelerate's gather), that is said too."""
        return Explanation(
            cause,
            message,
            ranks=ranks,
            absent_ranks=absent_ranks,
            op=op,
            site=site,
            evidence=[*evidence, *framework_fixes(self.catalogue, cause, libraries)],
            reason=reason,
        )

    def frames_text(self, rank: int, depth: int = 6) -> str:
        """'sleep (x.py:3) <- main (x.py:9)': where a rank's main thread is, innermost first."""
        stack = self.ev.stacks.get(rank)
        frames = stack.main.frames[:depth] if stack is not None and stack.main else []
        return " <- ".join(f"{f.function} ({self.site(f)})" for f in frames)

    # -- how ranks ended, where they are ----------------------------------------------

    def exit_text(self, rank: int) -> str:
        trace = self.ev.traces.get(rank)
        how, code = self.exit_of(rank)
        error = trace.exit.error if trace and trace.exit else None
        return error or f"{how.value}, exit code {code}"

    def exit_error(self, rank: int) -> tuple[str | None, Frame | None]:
        """The first line of the error a rank's script ended with (CUDA's run to five
        lines), and the frame of the user's code it left from."""
        trace = self.ev.traces.get(rank)
        if trace is None or trace.exit is None:
            return None, None
        return (first_line(trace.exit.message, 200) or None), trace.exit.site

    def empty_eval_pass(self, rank: int) -> tuple[str, dict[int, int]] | None:
        """(loader, batches per other rank) when ``rank``'s last loader pass was an eval pass
        that yielded nothing while the same loader gave the other ranks batches
        (Lightning-AI/litgpt#2319: more ranks than validation samples)."""
        trace = self.ev.traces.get(rank)
        if trace is None or not trace.passes:
            return None
        last = trace.passes[-1]
        if last.role != "eval" or last.batches != 0 or not last.exhausted:
            return None
        others: dict[int, int] = {}
        for other, other_trace in self.ev.traces.items():
            same = [p for p in other_trace.eval_passes if p.loader == last.loader]
            if other != rank and same:
                others[other] = same[-1].batches
        return (last.loader, others) if any(others.values()) else None

    def eval_samples_overlap(self) -> bool:
        """Do two ranks evaluate the same samples? A sample id is a position in the rank's
        own dataset: ranks whose eval sets have other lengths read other datasets (shards
        sliced by hand, each numbered from 0), whatever ids they share. The whole set's
        length (a Subset's parent's) where the trace has it, else the loader's."""
        lengths = {
            tuple(
                p.dataset_len if p.dataset_len is not None else ("loader", p.length)
                for p in trace.eval_passes
            )
            for trace in self.ev.traces.values()
        }
        if len(lengths) > 1:
            return False
        seen: dict[int, set[int]] = {}
        for rank, trace in self.ev.traces.items():
            ids = set()
            for loader_pass in trace.eval_passes:
                ids |= set(loader_pass.sample_ids or [])
            seen[rank] = ids
        ranks = sorted(seen)
        return any(seen[a] & seen[b] for i, a in enumerate(ranks) for b in ranks[i + 1 :])

    def busy_where(self, rank: int) -> str:
        """' (in its DataLoader, at data.py:30 in Shard.__getitem__)': where a late rank is."""
        stack = self.ev.stacks.get(rank)
        frames = stack.main.frames if stack is not None and stack.main else []
        user = next((f for f in frames if is_user(f.file)), None)
        in_loader = any("torch/utils/data/" in f.file.replace("\\", "/") for f in frames)
        parts = (["in its DataLoader"] if in_loader else []) + (
            [f"at {self.site(user)} in {user.function}"] if user else []
        )
        return f" ({', '.join(parts)})" if parts else ""

    def current_stack(self, rank: int) -> list[Frame]:
        """Where a rank is now, outermost first: its py-spy stack, else its last call."""
        stack = self.ev.stacks.get(rank)
        if stack is not None and stack.main is not None:
            return [f for f in reversed(stack.main.frames) if is_user(f.file)]
        trace = self.ev.traces.get(rank)
        if trace and trace.calls:
            return trace.calls[-1].user_stack
        return []


@dataclass
class Fork:
    """Ranks at different calls (or at none) at one point of their histories: a
    divergence of the traces (preflight) or ranks waiting at different lines (doctor,
    whose calls are seen on stacks). ``made`` made ``call``; the ``other`` ranks made
    ``alt`` or nothing, and stand at ``alt_stack``; the first ``common`` frames, outermost
    first, are the functions both sides share."""

    d: Context
    members: list[int]
    calls: dict[int, CollectiveCall | None]
    made: list[int]
    other: list[int]
    evidence: list[str]
    call: CollectiveCall
    alt: CollectiveCall | None
    stack: list[Frame]
    alt_stack: list[Frame]
    common: int

    @classmethod
    def of(
        cls,
        d: Context,
        members: list[int],
        calls: dict[int, CollectiveCall | None],
        made: list[int],
        other: list[int],
        evidence: list[str],
    ) -> Fork:
        call = calls[made[0]]
        assert call is not None
        alt = next((calls[r] for r in other if calls[r] is not None), None)
        alt_stack = alt.user_stack if alt else d.current_stack(other[0])
        stack = call.user_stack
        common = 0
        while common < min(len(stack), len(alt_stack)) and _same_function(stack[common], alt_stack[common]):
            common += 1
        chain = " -> ".join(f"{f.function}() at {d.site(f)}" for f in stack)
        evidence = [*evidence, f"call chain on rank {made[0]}: {chain}"]
        replay = d.ev.lines
        if replay is not None and replay.mismatch is not None:
            evidence.append(
                f"line evidence not used: the replay did not run as the first run did ({replay.mismatch}); "
                "the script does not run the same twice (an unseeded random draw, the clock, a file)"
            )
        return cls(d, members, calls, made, other, evidence, call, alt, stack, alt_stack, common)


def _same_function(a: Frame, b: Frame) -> bool:
    """Frames of one function: the same file and name, and the same ``def`` where the
    source is at hand (a trace names a method without its class: two classes'
    ``compute`` in one file are two functions)."""
    if (a.file, a.function) != (b.file, b.function):
        return False
    if a.line == b.line:
        return True
    mine, theirs = reading.enclosing_function(a.file, a.line), reading.enclosing_function(b.file, b.line)
    return mine is None or theirs is None or mine.lineno == theirs.lineno
