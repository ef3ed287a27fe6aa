"""From a dry run's evidence to findings named by the catalogue's cause ids.

The evidence is the per-rank traces, how each rank ended, whether the watchdog
saw a stall, and the stacks captured then. The first divergence of the
per-group histories says *where* the ranks parted; the source around the call
sites, the eval batch counts, the exits and the stacks say *why*.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ncclcheck.catalogue import Catalogue, load_catalogue
from ncclcheck.causes import Cause
from ncclcheck.evidence.align import Divergence, Mismatch
from ncclcheck.evidence.stacks import ProcessStack
from ncclcheck.evidence.traces import RankTrace, divergences_of, trace_frame
from ncclcheck.explain.engine import Explanation, Reason, framework_fixes
from ncclcheck.explain.rules.divergence import crashed, explain_divergence
from ncclcheck.explain.rules.quiet import explain_stall_without_divergence, warnings
from ncclcheck.model import (
    CollectiveCall,
    Finding,
    Frame,
    RankState,
    RankStatus,
    Report,
    Severity,
    Verdict,
)
from ncclcheck.source import reading
from ncclcheck.wording import (
    first_line,
    is_user,
    line_ranges,
    op_text,
    relative,
    shapes_text,
    split_exit_error,
    who,
)

if TYPE_CHECKING:
    from ncclcheck.explain.lines import Replay
    from ncclcheck.explain.rules.branch import Fork

__all__ = ["Diagnoser", "Evidence", "diagnose", "relative", "split_exit_error", "who"]


@dataclass
class Evidence:
    """Everything a diagnosis may use; all of it optional but the traces."""

    traces: dict[int, RankTrace]
    world_size: int
    stalled: bool = False
    stall_seconds: float = 0.0
    stacks: dict[int, ProcessStack] = field(default_factory=dict)
    rank_exits: dict[int, int] = field(default_factory=dict)  # from the launcher, by rank
    first_failure: int | None = None
    stopped: str | None = None  # why the run ended, in words
    cwd: str = field(default_factory=os.getcwd)
    lines: Replay | None = None  # what a replay up to the divergence saw (explain/lines.py)
    ranks_run: dict[int, str] | None = None  # a virtual world's ranks that ran, with why
    # why the run ended before its budget was spent (a signal, the time limit), if it did
    incomplete: str | None = None


class Diagnoser:
    def __init__(self, evidence: Evidence, catalogue: Catalogue | None = None) -> None:
        self.ev = evidence
        self.catalogue = catalogue or load_catalogue()
        # ranks at different calls, each with what explained it (rules/branch.py adds them):
        # preflight replays the first for line evidence when the source was not certain
        self.forks: list[tuple[Fork, Explanation]] = []

    # -- small helpers -----------------------------------------------------------------

    def site(self, frame: Frame | None) -> str | None:
        return f"{relative(frame.file, self.ev.cwd)}:{frame.line}" if frame else None

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

    def exit_of(self, rank: int) -> tuple[str, int | None]:
        """How a rank ended: ("running"|"returned"|"dry-run-complete"|"exception"|"killed", code)."""
        trace = self.ev.traces.get(rank)
        if trace is not None and trace.exit is not None:
            return str(trace.exit.get("how")), int(trace.exit.get("code", 0))
        code = self.ev.rank_exits.get(rank)
        if code is not None and code != 0:
            return "killed", code
        return "running", None

    def died(self, rank: int) -> bool:
        how, code = self.exit_of(rank)
        if how == "exception":
            return True
        if how == "killed" and code is not None:
            # torchrun's own SIGTERM to the survivors of a failure is not a death of its own
            return not (code == -15 and self.ev.first_failure not in (None, rank))
        return False

    def stopped_by_launcher(self, rank: int) -> bool:
        """torchrun's SIGTERM to the other ranks after one failed, before this rank went on."""
        how, code = self.exit_of(rank)
        return how == "killed" and code == -15 and self.ev.first_failure not in (None, rank)

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

    # -- the report --------------------------------------------------------------------

    def report(self) -> Report:
        found = [d for d in divergences_of(self.ev.traces) if not self.only_behind(d)]
        explanations: list[Explanation] = []
        complete = len(self.ev.traces) >= self.ev.world_size
        if found:
            explanations.append(explain_divergence(self, found))
        elif self.ev.stalled and complete:
            explanations.append(explain_stall_without_divergence(self))
        else:
            dead = [r for r in sorted(self.ev.traces) if self.died(r)]
            if dead:
                explanations.append(crashed(self, dead, None))
        explanations += warnings(self, explanations)
        findings = [explanation.finding(self.catalogue) for explanation in explanations]
        verdict = self.verdict(findings)
        summary = self.summary()
        if verdict is Verdict.INCOMPLETE and self.ev.incomplete:
            summary["incomplete"] = self.what_was_checked(self.ev.incomplete)
        elif self.ev.incomplete:
            summary["incomplete"] = f"{self.ev.incomplete}: the findings are what it saw until then"
        return Report(
            command="preflight",
            verdict=verdict,
            world_size=self.ev.world_size,
            ranks=self.rank_states(),
            findings=findings,
            summary=summary,
        )

    def verdict(self, findings: list[Finding]) -> Verdict:
        if self.ev.stalled:
            return Verdict.HANG
        if any(self.died(rank) for rank in self.ev.traces):
            return Verdict.CRASH
        if any(f.severity is Severity.ERROR for f in findings):
            return Verdict.MISALIGNED
        if self.ev.incomplete:  # nothing wrong in what ran, but not all of it ran
            return Verdict.INCOMPLETE
        return Verdict.ALIGNED

    def rank_states(self) -> list[RankState]:
        states = []
        ranks = sorted(self.ev.ranks_run) if self.ev.ranks_run is not None else range(self.ev.world_size)
        for rank in ranks:
            trace = self.ev.traces.get(rank)
            if trace is None:
                states.append(RankState(rank=rank, state=RankStatus.EXITED, where="no trace"))
                continue
            how, code = self.exit_of(rank)
            stack = self.ev.stacks.get(rank)
            last = trace.calls[-1] if trace.calls else None
            if how != "running":
                state = RankStatus.EXITED
            elif stack is not None and stack.in_collective:
                state = RankStatus.IN_COLLECTIVE
            elif self.ev.stalled:
                state = RankStatus.STUCK
            else:
                state = RankStatus.EXITED if code is not None else RankStatus.RUNNING
            where = None
            _error, error_site = self.exit_error(rank)
            if error_site is not None:  # an exception's: the line the script left from
                where = f"{self.site(error_site)} in {error_site.function}"
            if where is None and stack is not None and stack.main is not None:
                frame = next((f for f in stack.main.frames if is_user(f.file)), None)
                where = f"{self.site(frame)} in {frame.function}" if frame else None
            if where is None and last is not None and last.site is not None:
                where = f"{self.site(last.site)} in {last.site.function}"
            states.append(
                RankState(
                    rank=rank,
                    host=trace.host,
                    pid=trace.pid,
                    exit_code=code if how != "running" else None,
                    phase=trace.phase,
                    collectives=trace.collectives,
                    eval_batches=trace.eval_batches(),
                    state=state,
                    where=where,
                )
            )
        return states

    def only_behind(self, divergence: Divergence) -> bool:
        """In a run stopped from outside, a rank still running that has not made a call
        yet is behind, not absent: it was cut off on its way (a straggler mid-write)."""
        return (
            bool(self.ev.incomplete)
            and divergence.kind is Mismatch.MISSING
            # no exit line: the rank never ended on its own (our stop killed it, if anything)
            and all(
                rank in self.ev.traces and self.ev.traces[rank].exit is None for rank in divergence.absent
            )
        )

    def fast_forward(self) -> list[str]:
        """What --eval-batches did to each eval loader's first pass: skipped how many of
        how many batches, or why it ran in full (record/fastforward.py)."""
        said: dict[str, str] = {}
        for trace in self.ev.traces.values():
            for loader_pass in trace.eval_passes:
                told, name = loader_pass.told, loader_pass.loader
                if name in said or told is None or not (loader_pass.skipped or loader_pass.why_not):
                    continue  # a set shorter than --eval-batches runs in full, as asked
                lengths = sorted({n for n in told.values() if n is not None})
                span = f" of {lengths[0]}" if lengths else ""
                span += f" to {lengths[-1]}" if len(lengths) > 1 else ""
                how = (
                    "read without the loop body (an IterableDataset: read, not skipped)"
                    if loader_pass.read
                    else "skipped on every rank (not loaded)"
                )
                said[name] = (
                    f"{name}: the first {loader_pass.skipped}{span} batches {how}, the rest run for real"
                    if loader_pass.skipped
                    else f"{name}: every batch run ({loader_pass.why_not})"
                )
        return list(said.values())

    def what_was_checked(self, why: str) -> str:
        """An unfinished run's extent: how far each rank got, so a reader knows what the
        absence of a finding covers and what it does not."""
        traces = self.ev.traces.values()
        if not traces:
            return (
                f"incomplete: {why} before its budget was spent, before any rank wrote its first "
                "record: nothing was checked; rerun it to the end"
            )

        def span(values: list[int]) -> str:
            low, high = min(values, default=0), max(values, default=0)
            return f"{low}" if low == high else f"{low} to {high}"

        calls = span([t.collectives for t in traces])
        passes = span([sum(1 for p in t.eval_passes if p.exhausted) for t in traces])
        return (
            f"incomplete: {why} before its budget was spent. It checked {calls} collective(s) per "
            f"rank, alike on every rank, and {passes} complete eval pass(es) per rank; the rest "
            "is unchecked: rerun to the end, or with a smaller --train-steps / --eval-passes"
        )

    def summary(self) -> dict[str, object]:
        per_phase: dict[str, int] = {}
        for trace in self.ev.traces.values():
            for phase, count in trace.calls_per_phase().items():
                per_phase[phase] = per_phase.get(phase, 0) + count
        eval_batches = {str(r): t.eval_batches() for r, t in sorted(self.ev.traces.items())}
        backends = sorted({t.backend for t in self.ev.traces.values() if t.backend})
        summary: dict[str, object] = {
            "backend": ", ".join(backends) or None,
            "collectives_per_phase": per_phase,
            "eval_batches": eval_batches,
        }
        if self.ev.stopped:
            summary["stopped"] = self.ev.stopped
        if self.ev.ranks_run is not None:
            summary["virtual"] = [f"rank {rank}: {why}" for rank, why in sorted(self.ev.ranks_run.items())][
                :64
            ]
            summary["virtual_note"] = (
                f"a virtual world of {self.ev.world_size} ranks on the fake process group: "
                f"{len(self.ev.ranks_run)} ran, each alone; collectives returned at once with rank 0's "
                "results, so decisions on synchronised values agree and decisions on rank-local ones do not"
            )
        elif len(self.ev.traces) < self.ev.world_size:
            summary["partial"] = (
                f"traces of {who(sorted(self.ev.traces))} of {self.ev.world_size} "
                f"only: gather every node's --trace-dir in one folder and run "
                f"`ncclcheck preflight --from DIR` for the whole picture"
            )
        for key, attribute in (("cpu", "cpu_mapped"), ("perturbed", "perturbed"), ("framework", "adapted")):
            noted: dict[str, list[int]] = {}
            for rank, trace in sorted(self.ev.traces.items()):
                for kind, frame in getattr(trace, attribute):
                    noted.setdefault(f"{kind} at {self.site(frame)}", []).append(rank)
            if noted:
                summary[key] = [f"{what} ({who(ranks)})" for what, ranks in noted.items()]
        fast_forward = self.fast_forward()
        if fast_forward:
            summary["eval_fast_forward"] = fast_forward
        not_run = self.not_run()
        if not_run:
            summary["not_run"] = not_run
        if not any(t.eval_passes for t in self.ev.traces.values()):
            eval_calls = max((t.calls_per_phase().get("eval", 0) for t in self.ev.traces.values()), default=0)
            if eval_calls:
                # evaluation without a loader (generation from prompts, a fixed batch)
                note = (
                    f"no eval loader was seen: the collectives made in eval mode (up to {eval_calls} "
                    "per rank) were checked, but no eval batches were counted"
                )
            else:
                note = (
                    "no eval phase was seen: no loader was iterated in eval mode or under no_grad, "
                    "so only the training loop was checked"
                )
            budget_cut = any(
                (t.exit and t.exit.get("how") == "dry-run-complete") or any(p.budget_cut for p in t.passes)
                for t in self.ev.traces.values()
            )
            if budget_cut:
                # the budget ended a train pass, or the run, before evaluation came
                note += (
                    "; the dry run's budget stopped it first: if evaluation runs every N steps, "
                    "rerun with --train-steps above N (or the script's eval interval set low)"
                )
            summary["note"] = note
        return summary

    def not_run(self) -> str | None:
        """What the script does after the point where the budget stopped the dry run (a
        final evaluation, a save, a barrier at the end): not checked, and said so."""
        stopped = next(
            (
                t.exit["stack"]
                for _rank, t in sorted(self.ev.traces.items())
                if t.exit and t.exit.get("how") == "dry-run-complete" and t.exit.get("stack")
            ),
            None,
        )
        if not stopped:
            return None
        parts: list[str] = []
        for raw in stopped:  # outermost first
            frame = trace_frame(raw)
            after, in_loop = reading.statements_after(frame.file, frame.line)
            if after:
                lines = line_ranges([(stmt.lineno, stmt.end_lineno or stmt.lineno) for stmt in after])
                parts.append(f"{lines} of {frame.function}() in {relative(frame.file, self.ev.cwd)}")
            if in_loop:
                break  # deeper frames ran in the loop's earlier passes
        if not parts:
            return None
        innermost = trace_frame(stopped[-1])
        return (
            f"the budget stopped the dry run at {self.site(innermost)} in {innermost.function}(): "
            f"what the script does after that did not run ({'; '.join(parts)}), so a final "
            "evaluation, save or barrier there is not checked: run the script for one epoch "
            "(its own option) to check it too"
        )

    # -- the first divergence ----------------------------------------------------------

    def exit_text(self, rank: int) -> str:
        trace = self.ev.traces.get(rank)
        how, code = self.exit_of(rank)
        error = trace.exit.get("error") if trace and trace.exit else None
        return str(error or f"{how}, exit code {code}")

    def exit_error(self, rank: int) -> tuple[str | None, Frame | None]:
        """The first line of the error a rank's script ended with (CUDA's run to five
        lines), and the frame of the user's code it left from."""
        trace = self.ev.traces.get(rank)
        error, where = split_exit_error(trace.exit if trace and trace.exit else {})
        return (first_line(error, 200) or None), where

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


def diagnose(evidence: Evidence, catalogue: Catalogue | None = None) -> Report:
    return Diagnoser(evidence, catalogue).report()
