"""From a dry run's evidence to findings named by the catalogue's cause ids.

The evidence is the per-rank traces, how each rank ended, whether the watchdog
saw a stall, and the stacks captured then. The first divergence of the
per-group histories says *where* the ranks parted; the source around the call
sites, the eval batch counts, the exits and the stacks say *why*.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ncclcheck.catalogue import Catalogue, load_catalogue
from ncclcheck.causes import Cause
from ncclcheck.communicates import OP_ADVICE, OP_ORIGINS, issuer_of
from ncclcheck.evidence.stacks import ProcessStack
from ncclcheck.explain import source
from ncclcheck.explain.align import Divergence, Mismatch
from ncclcheck.model import (
    CollectiveCall,
    Finding,
    Frame,
    RankState,
    RankStatus,
    Report,
    Severity,
    Verdict,
    format_ranks,
)
from ncclcheck.record.traces import RankTrace, RootedRead, divergences_of, trace_frame


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


def relative(path: str, cwd: str) -> str:
    """A path as CONTRACT.md shows sites: relative to cwd when below it, else absolute."""
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def _issued(call: CollectiveCall) -> tuple[str, str] | None:
    if not call.issuer:
        return None
    module, _, qualname = call.issuer.partition(":")
    return issuer_of(module, qualname)


def op_text(call: CollectiveCall) -> str:
    """The op as a finding names it: one the user never wrote says what issued it (DDP's
    internal broadcast, a SyncBatchNorm layer)."""
    issued = _issued(call)
    origin = issued[0] if issued else OP_ORIGINS.get(call.op)
    return f"{call.op} ({origin})" if origin else call.op


def issuer_advice(call: CollectiveCall | None) -> list[str]:
    """What to do about a collective that library code issued (or an op whose contract
    surprises, such as new_group), for a finding's evidence."""
    if call is None:
        return []
    issued = _issued(call)
    if issued:
        return [issued[1]] if issued[1] else []
    return [OP_ADVICE[call.op]] if call.op in OP_ADVICE else []


def split_exit_error(exit_record: dict[str, Any]) -> tuple[str, Frame | None]:
    """An exit record's error without the " at file:line in function" it ends with, and
    that frame: the user's code the exception left from."""
    error = str(exit_record.get("error") or "")
    raw_site = exit_record.get("site")
    if not (isinstance(raw_site, list) and len(raw_site) == 3):
        return error, None
    where = Frame(str(raw_site[0]), int(raw_site[1]), str(raw_site[2]))
    return error.removesuffix(f" at {where.file}:{where.line} in {where.function}"), where


class Diagnoser:
    def __init__(self, evidence: Evidence, catalogue: Catalogue | None = None) -> None:
        self.ev = evidence
        self.catalogue = catalogue or load_catalogue()

    # -- small helpers -----------------------------------------------------------------

    def site(self, frame: Frame | None) -> str | None:
        return f"{relative(frame.file, self.ev.cwd)}:{frame.line}" if frame else None

    def describe_call(self, call: CollectiveCall | None) -> str:
        if call is None:
            return "no call"
        dtype = call.dtypes[0] if call.dtypes else ""
        shapes = _shapes_text(call.shapes)
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

    def finding(
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
    ) -> Finding:
        """``libraries``: the packages on the call's stack; where the playbook gives its fix
        in one's own terms (Lightning's self.log, accelerate's gather), that is said too."""
        fixes = self.catalogue.get(cause).fix.frameworks if cause in self.catalogue else {}
        framework_fixes = [f"with {name}: {fixes[name]}" for name in libraries if name in fixes]
        if framework_fixes:
            evidence = [*evidence, *framework_fixes]
        return Finding(
            cause=cause,
            severity=Severity.ERROR,
            message=message,
            ranks=ranks,
            absent_ranks=absent_ranks,
            op=op,
            site=site,
            evidence=evidence,
            fix=self.fix(cause),
        )

    def frames_text(self, rank: int, depth: int = 6) -> str:
        """'sleep (x.py:3) <- main (x.py:9)': where a rank's main thread is, innermost first."""
        stack = self.ev.stacks.get(rank)
        frames = stack.main.frames[:depth] if stack is not None and stack.main else []
        return " <- ".join(f"{f.function} ({self.site(f)})" for f in frames)

    # -- the report --------------------------------------------------------------------

    def report(self) -> Report:
        found = divergences_of(self.ev.traces)
        findings: list[Finding] = []
        complete = len(self.ev.traces) >= self.ev.world_size
        if found:
            findings.append(self.explain(found))
        elif self.ev.stalled and complete:
            findings.append(self.explain_stall_without_divergence())
        else:
            dead = [r for r in sorted(self.ev.traces) if self.died(r)]
            if dead:
                findings.append(self.crashed(dead, None))
        findings += self.warnings(findings)
        verdict = self.verdict(findings)
        return Report(
            command="preflight",
            verdict=verdict,
            world_size=self.ev.world_size,
            ranks=self.rank_states(),
            findings=findings,
            summary=self.summary(),
        )

    def verdict(self, findings: list[Finding]) -> Verdict:
        if self.ev.stalled:
            return Verdict.HANG
        if any(self.died(rank) for rank in self.ev.traces):
            return Verdict.CRASH
        if any(f.severity is Severity.ERROR for f in findings):
            return Verdict.MISALIGNED
        return Verdict.ALIGNED

    def rank_states(self) -> list[RankState]:
        states = []
        for rank in range(self.ev.world_size):
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
                frame = next((f for f in stack.main.frames if _is_user(f.file)), None)
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
        if len(self.ev.traces) < self.ev.world_size:
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
            after, in_loop = source.statements_after(frame.file, frame.line)
            if after:
                lines = _line_ranges([(stmt.lineno, stmt.end_lineno or stmt.lineno) for stmt in after])
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

    def explain(self, found: list[Divergence]) -> Finding:
        order = self.order_mismatch(found)
        if order is not None:
            return order
        first = found[0]
        made, other = first.majority()
        calls = first.calls
        evidence = [
            f"rank {r}: {self.describe_call(calls[r])}"
            + (
                " (it ran to the end of the script)"
                if calls[r] is None and self.exit_of(r)[0] == "returned"
                else ""
            )
            for r in sorted(calls)
        ]
        evidence = _collapse(evidence)

        if first.kind is Mismatch.SHAPE:
            call = calls[made[0]]
            return self.finding(
                Cause.COLLECTIVE_SHAPE_MISMATCH,
                f"{who(first.members)} call {call.op if call else '?'} at the same "
                f"site with different shapes or dtypes",
                ranks=first.members,
                absent_ranks=[],
                op=call.op if call else None,
                site=self.site(call.site if call else None),
                evidence=evidence,
            )

        if first.kind is Mismatch.REQUEST:
            return self.mixed_requests(first, made, evidence)

        # A rank that died *here*: it never made this call (a rank that aborts inside
        # a mismatched collective made it, and is explained by the mismatch).
        dead = [r for r in first.absent if self.died(r)]
        if dead:
            return self.crashed(dead, first)
        # A rank killed inside (or just after) its call, and the ranks that had not got
        # there stopped by torchrun because of it: the divergence is the crash's echo.
        # (SIGABRT is gloo's own abort on a mismatched collective: explained by the mismatch.)
        killed_inside = [
            r
            for r in first.present
            if self.died(r) and _signal_name(self.exit_of(r)[1]) not in (None, "SIGABRT")
        ]
        if killed_inside and first.absent and all(self.stopped_by_launcher(r) for r in first.absent):
            return self.killed_in_call(killed_inside, first)

        left = [r for r in first.absent if self.exit_of(r)[0] == "sys.exit"]
        if left and len(left) == len(first.absent):
            return self.exited_early(first, made, left, evidence)

        unanswered = self.join_without_stand_in(first, evidence)
        if unanswered is not None:
            return unanswered

        uneven = self.uneven_eval(first, evidence)
        if uneven is not None:
            return uneven

        if first.kind is Mismatch.STEP:
            return self.skipped_step(first, made, other, evidence)

        straggler = self.straggler(first, made, other, evidence)
        if straggler is not None:
            return straggler

        return self.branch(first, made, other, evidence)

    def mixed_requests(self, first: Divergence, made: list[int], evidence: list[str]) -> Finding:
        """The ranks' n-th reductions are for values logged under different names (one
        self.log_dict call, other keys per rank): each rank's value is reduced with
        another name's, silently, and a rank with more names than the others hangs."""
        calls = {r: c for r, c in first.calls.items() if c is not None}
        call = calls[made[0]]
        by_request: dict[str, list[int]] = {}
        for rank, each in sorted(calls.items()):
            by_request.setdefault(each.later.request if each.later else each.op, []).append(rank)
        sides = "; ".join(f"{who(ranks)}: {request}" for request, ranks in by_request.items())
        by = call.later.by if call.later else "the framework"
        return self.finding(
            Cause.COLLECTIVE_SHAPE_MISMATCH,
            f"{who(first.members)} reach {by}'s {call.op} at {self.site(call.site)} for values "
            f"logged under different names ({sides}): they pair with each other, and a rank "
            f"that logged more names than the others waits forever",
            ranks=first.members,
            absent_ranks=[],
            op=call.op,
            site=self.site(call.site),
            evidence=evidence,
            libraries=call.libraries,
        )

    def order_mismatch(self, found: list[Divergence]) -> Finding | None:
        """Two groups each waiting on ranks that are waiting in the other: a cycle."""
        # lowest present rank first, so the report does not depend on which call was first
        missing = sorted(
            (d for d in found if d.kind is Mismatch.MISSING), key=lambda d: (d.present[:1], d.group)
        )
        for i, one in enumerate(missing):
            for two in missing[i + 1 :]:
                if one.group == two.group:
                    continue
                if set(one.present) & set(two.absent) and set(one.absent) & set(two.present):
                    call_one = one.calls[one.present[0]]
                    call_two = two.calls[two.present[0]]
                    evidence = [
                        f"group {one.group}: {who(one.present)} are in "
                        f"{self.describe_call(call_one)}; {who(one.absent)} have not "
                        f"made that call",
                        f"group {two.group}: {who(two.present)} are in "
                        f"{self.describe_call(call_two)}; {who(two.absent)} have not "
                        f"made that call",
                        "each side waits for the other in a different process group: a cycle",
                    ]
                    return self.finding(
                        Cause.COLLECTIVE_ORDER_MISMATCH,
                        f"{who(one.present)} and {who(two.present)} "
                        f"issue the same collectives in a different order across process groups "
                        f"{one.group} and {two.group}",
                        ranks=one.present,
                        absent_ranks=one.absent,
                        op=call_one.op if call_one else None,
                        site=self.site(call_one.site if call_one else None),
                        evidence=evidence,
                    )
        return None

    def exited_early(
        self, first: Divergence, made: list[int], left: list[int], evidence: list[str]
    ) -> Finding:
        """The absent ranks ended the script (sys.exit) while the others went on to a call."""
        call = first.calls[made[0]]
        trace = self.ev.traces.get(left[0])
        ended = str(trace.exit.get("error") or "") if trace and trace.exit else ""
        where = _location_of(ended)
        evidence = [*evidence, *(f"rank {r} ended: {self.exit_text(r)}" for r in left)]
        return self.finding(
            Cause.RANK_EARLY_EXIT,
            f"{who(left)} left the script early"
            + (f" (sys.exit at {relative(where[0], self.ev.cwd)}:{where[1]})" if where else "")
            + f" while {who(made)} went on to {call.op if call else '?'} at "
            + f"{self.site(call.site if call else None)}",
            ranks=made,
            absent_ranks=left,
            op=call.op if call else None,
            site=f"{relative(where[0], self.ev.cwd)}:{where[1]}"
            if where
            else self.site(call.site if call else None),
            evidence=evidence,
        )

    def exit_text(self, rank: int) -> str:
        trace = self.ev.traces.get(rank)
        how, code = self.exit_of(rank)
        error = trace.exit.get("error") if trace and trace.exit else None
        return str(error or f"{how}, exit code {code}")

    def killed_in_call(self, dead: list[int], first: Divergence) -> Finding:
        call = first.calls[dead[0]]
        signal_name = _signal_name(self.exit_of(dead[0])[1])
        finding = self.crashed(dead, None)
        finding.message = (
            f"{who(dead)} died ({signal_name}) in or right after {self.describe_call(call)}; "
            f"torchrun then stopped {who(first.absent)} before reaching it"
        )
        finding.op = call.op if call else None
        finding.site = self.site(call.site if call else None)
        return finding

    def exit_error(self, rank: int) -> tuple[str | None, Frame | None]:
        """The first line of the error a rank's script ended with (CUDA's run to five
        lines), and the frame of the user's code it left from."""
        trace = self.ev.traces.get(rank)
        error, where = split_exit_error(trace.exit if trace and trace.exit else {})
        return (_first_line(error, 200) or None), where

    def crashed(self, dead: list[int], divergence: Divergence | None) -> Finding:
        evidence = []
        for rank in dead:
            _how, code = self.exit_of(rank)
            trace = self.ev.traces.get(rank)
            error, error_site = self.exit_error(rank)
            signal_name = _signal_name(code)
            last = trace.calls[-1] if trace and trace.calls else None
            text = f"rank {rank} ended: {error or ('exit code ' + str(code))}"
            if error_site:
                text += f" at {self.site(error_site)} in {error_site.function}"
            if signal_name:
                text += f" ({signal_name})"
            evidence.append(text)
            evidence.append(f"rank {rank}'s last collective: {self.describe_call(last)}")
        empty = {rank: found for rank in dead if (found := self.empty_eval_pass(rank)) is not None}
        for rank, (loader, others) in empty.items():
            evidence.append(
                f"rank {rank}'s eval loader {loader} yielded no batch in its last pass (the other "
                f"ranks: {', '.join(f'rank {r}: {n}' for r, n in sorted(others.items()))}), and what "
                "follows the loop failed on this rank alone"
            )
        survivors = []
        site = None
        op = None
        if divergence is not None:
            survivors = [r for r in divergence.present if r not in dead]
            if survivors:
                call = divergence.calls[survivors[0]]
                site = self.site(call.site if call else None)
                op = call.op if call else None
                evidence.append(f"{who(survivors)} waited in {self.describe_call(call)}")
        message = f"{who(dead)} died" + (f" while {who(survivors)} waited in {op}" if survivors else "")
        if not survivors:
            # No one waited at a call of the user's: the line the error left from is the site
            # (a CUDA or NCCL set-up error on one rank, before any collective).
            error, error_site = self.exit_error(dead[0])
            site = self.site(error_site)
            if error:
                message += ": " + error
        if empty:
            message = message.replace(
                f"{who(dead)} died", f"{who(dead)} died after an eval pass with no batch", 1
            )
        finding = self.finding(
            Cause.RANK_CRASHED,
            message,
            ranks=survivors,
            absent_ranks=dead,
            op=op,
            site=site,
            evidence=evidence,
        )
        if empty:
            finding.fix = (
                f"An empty eval shard killed {who(sorted(empty))}: give every rank the same number of "
                "batches (DistributedSampler(val_set, shuffle=False) pads the shards to equal length), "
                "or make the code after the eval loop handle zero batches and still make its "
                "collectives (reduce a sum and a count, not a mean of a list)."
            )
        return finding

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

    def join_without_stand_in(self, first: Divergence, evidence: list[str]) -> Finding | None:
        """Ranks that ran out of batches inside DDP's Join, facing a collective of the
        user's own in the others' step: Join stands in for DDP's collectives only."""
        joined = sorted(r for r, c in first.calls.items() if c is not None and c.shadow)
        own = sorted(r for r, c in first.calls.items() if c is not None and not c.shadow and c.issuer is None)
        if not joined or not own:
            return None
        call, stand_in = first.calls[own[0]], first.calls[joined[0]]
        assert call is not None and stand_in is not None
        batches = {
            r: sum(p.batches for p in self.ev.traces[r].passes if p.role == "train")
            for r in first.members
            if r in self.ev.traces
        }
        return self.finding(
            Cause.UNEVEN_EVAL_BATCHES,
            f"{who(joined)} ran out of batches and joined at {self.site(stand_in.site)} "
            f"(DDP's Join), which stands in for DDP's own collectives only; {who(own)} "
            f"made the {op_text(call)} at {self.site(call.site)} in a later step, and "
            f"nothing on {who(joined)} answers it",
            ranks=own,
            absent_ranks=joined,
            op=call.op,
            site=self.site(call.site),
            evidence=[
                *evidence,
                "batches drawn per rank: " + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items())),
                "DDP's Join shadows the gradient all-reduce and its own notification, not "
                "a collective the loop body calls: reduce that value after the loop, give "
                "Join a Joinable that shadows it, or shard so every rank has the same "
                "number of batches (DistributedSampler)",
            ],
        )

    def uneven_eval(self, first: Divergence, evidence: list[str]) -> Finding | None:
        """Some ranks still in an eval loop's per-batch collective, the others past it."""
        inside = sorted(
            r for r, c in first.calls.items() if c is not None and (c.position or {}).get("role") == "eval"
        )
        outside = sorted(r for r in first.members if r not in inside)
        if not inside or not outside:
            return None
        counts = {r: self.ev.traces[r].eval_batches() for r in first.members if r in self.ev.traces}
        if None in counts.values() or len({str(c) for c in counts.values()}) <= 1:
            return None
        call = first.calls[inside[0]]
        assert call is not None
        passes = [p for t in self.ev.traces.values() for p in t.eval_passes]
        evidence = [
            *evidence,
            "eval batches per rank: " + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items())),
        ]
        for loader_pass in {p.loader: p for p in passes}.values():
            if loader_pass.iterable:
                # No sampler applies: the playbook's DistributedSampler fix does not either.
                evidence.append(
                    f"eval loader {loader_pass.loader}: dataset {loader_pass.dataset} is an "
                    "IterableDataset (it shards itself; no sampler applies)"
                )
                continue
            evidence.append(
                f"eval loader {loader_pass.loader}: sampler {loader_pass.sampler}, "
                f"dataset {loader_pass.dataset}"
                + ("" if loader_pass.distributed_sampler else " (no DistributedSampler)")
            )
        cause = Cause.UNEVEN_EVAL_BATCHES
        if any(not p.distributed_sampler for p in passes) and self.eval_samples_overlap():
            cause = Cause.MISSING_DISTRIBUTED_SAMPLER
            evidence.append(
                "the ranks evaluate overlapping samples: each rank draws its own "
                "eval set instead of a shard of one"
            )
        return self.finding(
            cause,
            f"eval loaders yield different numbers of batches per rank; "
            f"{who(inside)} made a per-batch {op_text(call)} that "
            f"{who(outside)} never made",
            ranks=inside,
            absent_ranks=outside,
            op=call.op,
            site=self.site(call.site),
            evidence=evidence,
        )

    def eval_samples_overlap(self) -> bool:
        seen: dict[int, set[int]] = {}
        for rank, trace in self.ev.traces.items():
            ids = set()
            for loader_pass in trace.eval_passes:
                ids |= set(loader_pass.sample_ids or [])
            seen[rank] = ids
        ranks = sorted(seen)
        return any(seen[a] & seen[b] for i, a in enumerate(ranks) for b in ranks[i + 1 :])

    def skipped_step(
        self, first: Divergence, made: list[int], other: list[int], evidence: list[str]
    ) -> Finding:
        """Same op and site, different loader batches: some ranks skipped a step's call."""
        earlier = min(
            (c for c in first.calls.values() if c is not None),
            key=lambda c: (c.position or {}).get("batch", 0),
        )
        did = sorted(r for r, c in first.calls.items() if c is not None and c.position == earlier.position)
        skipped = sorted(r for r in first.members if r not in did)
        site = earlier.site
        step = earlier.position or {}
        evidence = [
            *evidence,
            f"{who(skipped)} made no {op_text(earlier)} at "
            f"{self.site(site)} for {step.get('loader')} batch {step.get('batch')}",
        ]
        cause, reason = Cause.DATA_DEPENDENT_BRANCH, ""
        if site is not None:
            # the try may be a caller's, around the step function the error left early
            swallow, swallow_file = None, site.file
            for frame in reversed(earlier.user_stack or [site]):
                swallow, swallow_file = source.swallowing_try(frame.file, frame.line), frame.file
                if swallow is not None:
                    break
            loop = source.innermost_loop(site.file, site.line)
            exits = source.conditional_exits(site.file, loop, site.line) if loop else []
            # the call may sit in a helper (step()): the loop that skipped it is a caller's
            for frame in reversed(earlier.user_stack[:-1]):
                if exits or loop is not None:
                    break
                loop = source.innermost_loop(frame.file, frame.line)
                if loop is not None:
                    # any exit of that loop: a break after the call ends the pass early too
                    exits = source.conditional_exits(frame.file, loop)
                    site = frame
            if swallow is not None:
                cause = Cause.RANK_EXCEPTION
                reason = (
                    f"the call is inside a try at {self.site(Frame(swallow_file, swallow.lineno, ''))}"
                    " whose handler swallows the error and continues"
                )
            elif exits:
                guard = exits[-1]
                cause = {
                    "rank": Cause.RANK_CONDITIONAL_COLLECTIVE,
                    "data": Cause.DATA_DEPENDENT_BRANCH,
                }.get(guard.kind, Cause.UNSYNCHRONIZED_DECISION)
                reason = (
                    f"`{guard.statement}` under `if {guard.text}` at "
                    f"{self.site(Frame(site.file, guard.line, ''))} skips it"
                )
        if reason:
            evidence.append(reason)
        return self.finding(
            cause,
            f"{who(skipped)} skipped the {op_text(earlier)} at {self.site(site)} for one "
            f"step ({step.get('loader')} batch {step.get('batch')}); their later calls pair with "
            f"the other ranks' earlier ones",
            ranks=did,
            absent_ranks=skipped,
            op=earlier.op,
            site=self.site(site),
            evidence=evidence,
        )

    def straggler(
        self, first: Divergence, made: list[int], other: list[int], evidence: list[str]
    ) -> Finding | None:
        if not self.ev.stalled or first.kind is not Mismatch.MISSING:
            return None
        late = [
            r
            for r in other
            if r in self.ev.stacks and not self.ev.stacks[r].in_collective and self.ev.stacks[r].threads
        ]
        if not late or len(late) != len(other):
            return None
        call = first.calls[made[0]]
        for rank in late:
            evidence.append(f"rank {rank} is outside any collective: {self.frames_text(rank)}")
        return Finding(
            cause=Cause.STRAGGLER,
            severity=Severity.ERROR,
            message=(
                f"{who(made)} waited in {call.op if call else '?'} for "
                f"{who(late)}, still busy outside any collective{self.busy_where(late[0])} "
                f"({self.ev.stall_seconds:.0f} s without progress)"
            ),
            ranks=made,
            absent_ranks=late,
            op=call.op if call else None,
            site=self.site(call.site if call else None),
            evidence=evidence,
            fix=self.fix(Cause.STRAGGLER),
        )

    def busy_where(self, rank: int) -> str:
        """' (in its DataLoader, at data.py:30 in Shard.__getitem__)': where a late rank is."""
        stack = self.ev.stacks.get(rank)
        frames = stack.main.frames if stack is not None and stack.main else []
        user = next((f for f in frames if _is_user(f.file)), None)
        in_loader = any("torch/utils/data/" in f.file.replace("\\", "/") for f in frames)
        parts = (["in its DataLoader"] if in_loader else []) + (
            [f"at {self.site(user)} in {user.function}"] if user else []
        )
        return f" ({', '.join(parts)})" if parts else ""

    def branch(self, first: Divergence, made: list[int], other: list[int], evidence: list[str]) -> Finding:
        """Different calls (or none) at one position: read the source to see which branch."""
        call = first.calls[made[0]]
        assert call is not None
        alt = next((first.calls[r] for r in other if first.calls[r] is not None), None)
        alt_stack = alt.user_stack if alt else self.current_stack(other[0])
        stack = call.user_stack
        common = 0
        while common < min(len(stack), len(alt_stack)) and (
            stack[common].file,
            stack[common].function,
        ) == (alt_stack[common].file, alt_stack[common].function):
            common += 1
        evidence = list(evidence)
        chain = " -> ".join(f"{f.function}() at {self.site(f)}" for f in stack)
        evidence.append(f"call chain on rank {made[0]}: {chain}")

        # 1. a rank test around the call, in the shared frame or below it; the minority's
        # call too (on 16 ranks, rank 0's lone all_reduce is the minority, not the barrier)
        alt_made = sorted(
            r
            for r in other
            if alt is not None
            and (theirs := first.calls[r]) is not None
            and (theirs.op, theirs.site) == (alt.op, alt.site)
        )
        sides = [(call, stack, made, other)]
        if alt is not None and alt_made:
            sides.append((alt, alt.user_stack, alt_made, sorted(set(first.members) - set(alt_made))))
        for side_call, side_stack, side_made, side_other in sides:
            around = _guard_around(side_stack[max(common - 1, 0) :], source.RANK)
            if around is not None:
                frame, guard = around
                evidence.append(
                    f"`if {guard.text}` at {self.site(Frame(frame.file, guard.line, ''))}"
                    f" sends {who(side_made)} to it"
                )
                return self.call_finding(
                    Cause.RANK_CONDITIONAL_COLLECTIVE,
                    f"only {who(side_made)} reached {op_text(side_call)} at "
                    f"{self.site(side_call.site)} in "
                    f"{side_call.site.function if side_call.site else '?'}(), under "
                    f"`if {guard.text}`; {who(side_other)} never called it",
                    side_call,
                    side_made,
                    side_other,
                    evidence,
                )
        # 2. an early exit, in a function the absent ranks left, before the call
        for frame in stack[common:] or stack[-1:]:
            function = source.enclosing_function(frame.file, frame.line)
            if function is None:
                continue
            exits = [
                g
                for g in source.conditional_exits(frame.file, function, frame.line)
                if g.statement in ("return", "raise")
            ]
            if exits:
                guard = exits[-1]
                cause = _cause_of_exit(guard.kind)
                evidence.append(
                    f"`{guard.statement}` under `if {guard.text}` at "
                    f"{self.site(Frame(frame.file, guard.line, ''))} leaves "
                    f"{frame.function}() before the call"
                )
                return self.call_finding(
                    cause,
                    f"{who(other)} left {frame.function}() early through the "
                    f"`{guard.statement}` at {self.site(Frame(frame.file, guard.line, ''))} and "
                    f"missed the {op_text(call)} at {self.site(call.site)} that "
                    f"{who(made)} waited in",
                    call,
                    made,
                    other,
                    evidence,
                )
        # 3. a loop one side left: the break/return that ended it, and its condition. A
        # side that ran to the end of the script has left every loop its last call was in.
        if alt is None and other and all(self.exit_of(r)[0] == "returned" for r in other):
            left = self.loop_left(stack[-1], None, made, other, call, evidence)
            if left is not None:
                return left
        if common and alt_stack:
            shared = stack[common - 1]
            alt_frame = alt_stack[common - 1]
            for inside, outside, inside_ranks, outside_ranks in (
                (shared, alt_frame, made, other),
                (alt_frame, shared, other, made),
            ):
                left = self.loop_left(inside, outside.line, inside_ranks, outside_ranks, call, evidence)
                if left is not None:
                    return left
        # 3b. a function one side has returned from, whose loop the other is still in;
        # the loop may be in a function called from there (a comprehension's frame,
        # then generate()'s decoding loop): the outermost that has an exit
        if 0 < common < len(stack) and len(alt_stack) <= common:
            for frame in stack[common:]:
                left = self.loop_left(frame, None, made, other, call, evidence)
                if left is not None:
                    return left
        # 3c. a test around the call that the ranks answered differently: one on the data
        # (`if h.shape[0] > 1: h = self.bn(h)`), or one on a value each rank reads for
        # itself (`if os.path.exists(ckpt)` while rank 0 writes it, a clock, a random draw)
        for kind in (source.DATA, source.OTHER):
            around = _guard_around(stack[max(common - 1, 0) :], kind)
            if around is None:
                continue
            frame, guard = around
            if kind == source.DATA:
                cause, what, test_is = Cause.DATA_DEPENDENT_BRANCH, "a test on the data", "tests the data"
            else:
                reads = " and ".join(source.rank_local_reads(guard.text, frame.file))
                if not reads:
                    continue
                cause = Cause.UNSYNCHRONIZED_DECISION
                what = f"a test each rank answers for itself ({reads}, never synchronised)"
                test_is = f"is {reads} each rank makes for itself"
            evidence.append(
                f"`if {guard.text}` at {self.site(Frame(frame.file, guard.line, ''))} {test_is}: "
                f"{who(made)} passed it, {who(other)} did not"
            )
            return self.call_finding(
                cause,
                f"only {who(made)} reached {op_text(call)} at {self.site(call.site)}, under "
                f"`if {guard.text}`, {what}; {who(other)} skipped it",
                call,
                made,
                other,
                evidence,
            )
        # 4. nothing in the source explains it: report the place, plainly, and a value
        # one side logged for a framework to reduce that the other side never did
        for mine, mine_ranks, theirs_ranks, theirs in ((call, made, other, alt), (alt, other, made, call)):
            if mine is not None and mine.later is not None and (theirs is None or theirs.later is None):
                evidence.append(
                    f"{who(mine_ranks)}: {mine.later.by} reduces {mine.later.request} here; "
                    f"{who(theirs_ranks)}: no such reduction at this point. If the names a rank logs "
                    f"depend on its data (self.log_dict of per-rank keys), log the same names on "
                    f"every rank"
                )
                break
        return self.call_finding(
            Cause.RANK_CONDITIONAL_COLLECTIVE,
            f"{who(made)} called {op_text(call)} at {self.site(call.site)}; "
            f"{who(other)} did something else at that point",
            call,
            made,
            other,
            evidence,
        )

    def call_finding(
        self,
        cause: Cause,
        message: str,
        call: CollectiveCall,
        made: list[int],
        absent: list[int],
        evidence: list[str],
    ) -> Finding:
        """A finding sited at ``call``, with what to do when library code issued it (which,
        when there is some, replaces the playbook's fix in the framework's terms: that one
        is about another API of the framework)."""
        advice = issuer_advice(call)
        return self.finding(
            cause,
            message,
            ranks=made,
            absent_ranks=absent,
            op=call.op,
            site=self.site(call.site),
            evidence=[*evidence, *advice],
            libraries=() if advice else call.libraries,
        )

    def loop_left(
        self,
        inside: Frame,
        outside_line: int | None,
        inside_ranks: list[int],
        outside_ranks: list[int],
        call: CollectiveCall,
        evidence: list[str],
    ) -> Finding | None:
        """The loop around ``inside`` that the outside ranks left (one that does not hold
        ``outside_line``; any, when they left the whole function), through which
        break/return, under which condition."""
        exits: list[source.Guard] = []
        for loop in source.enclosing_loops(inside.file, inside.line):
            if outside_line is not None and source.contains(loop, outside_line):
                return None  # both sides are in this loop: it is not the one left
            exits = [
                g for g in source.conditional_exits(inside.file, loop) if g.statement in ("break", "return")
            ]
            ended = source.while_test(inside.file, loop)
            if not exits and ended is not None:
                exits = [ended]  # no break: the loop's own test ended it
            if exits:
                break
        if not exits:
            return None
        guard = exits[-1]
        cause = _cause_of_exit(guard.kind)
        where = self.site(Frame(inside.file, guard.line, ""))
        # a test on what dist.reduce left on a rank that is not its dst (rooted.py)
        rooted = [
            (rank, read)
            for rank, trace in sorted(self.ev.traces.items())
            for read in trace.rooted_reads
            if read.site.file == inside.file
            and source.decision_at(read.site.file, read.site.line)
            in (f"if {guard.text}", f"while {guard.text}")
        ]
        how = (
            f"when `{guard.text}` turned false"
            if guard.statement == "while"
            else f"through `{guard.statement}` under `if {guard.text}` at {where}"
        )
        evidence.append(
            f"{who(outside_ranks)} left the loop at {self.site(Frame(inside.file, loop.lineno, ''))} "
            f"in {inside.function}() {how}; {who(inside_ranks)} stayed in it"
        )
        keyword = "while" if guard.statement == "while" else "if"
        message = (
            f"{who(outside_ranks)} and {who(inside_ranks)} decided differently at "
            f"`{keyword} {guard.text}` ({where})"
        )
        if rooted:
            cause = Cause.UNSYNCHRONIZED_DECISION
            rank, read = rooted[0]
            message += (
                f": it reads what dist.reduce at {self.site(read.reduce_site)} left on rank {rank}, "
                f"not the result, which only rank {read.dst} receives"
            )
        elif cause == Cause.UNSYNCHRONIZED_DECISION:
            message += ": its value differs per rank and was never synchronised"
        return self.finding(
            cause,
            message,
            ranks=outside_ranks,
            absent_ranks=inside_ranks,
            op=call.op,
            site=where,
            evidence=evidence,
        )

    def current_stack(self, rank: int) -> list[Frame]:
        """Where a rank is now, outermost first: its py-spy stack, else its last call."""
        stack = self.ev.stacks.get(rank)
        if stack is not None and stack.main is not None:
            return [f for f in reversed(stack.main.frames) if _is_user(f.file)]
        trace = self.ev.traces.get(rank)
        if trace and trace.calls:
            return trace.calls[-1].user_stack
        return []

    def explain_stall_without_divergence(self) -> Finding:
        """Every rank agrees on its history so far and nothing moves."""
        lasts = {r: t.calls[-1] for r, t in self.ev.traces.items() if t.calls}
        stacks = self.ev.stacks
        late = [r for r, s in stacks.items() if s.threads and not s.in_collective]
        if late and len(late) < len(stacks):
            waiting = sorted(r for r in stacks if r not in late)
            call = lasts.get(waiting[0])
            return Finding(
                cause=Cause.STRAGGLER,
                severity=Severity.ERROR,
                message=(
                    f"{who(waiting)} waited in a collective for {who(late)}, busy outside any collective"
                ),
                ranks=waiting,
                absent_ranks=late,
                op=call.op if call else None,
                site=self.site(call.site if call else None),
                evidence=[f"rank {r}: {self.frames_text(r)}" for r in late],
                fix=self.fix(Cause.STRAGGLER),
            )
        call = next(iter(lasts.values()), None)
        frozen = [r for r, s in stacks.items() if s.status in ("stopped", "tracing-stop", "disk-sleep")]
        evidence = [f"every rank's last call: {self.describe_call(call)}"]
        if frozen:
            evidence.append(f"{who(frozen)} are frozen (process state stopped)")
        return Finding(
            cause=Cause.TRANSPORT_HANG,
            severity=Severity.ERROR,
            message=(
                f"every rank is in the same {call.op if call else 'collective'} at "
                f"{self.site(call.site if call else None)} and nothing has moved for "
                f"{self.ev.stall_seconds:.0f} s: the code is aligned, the transport is not"
            ),
            ranks=sorted(lasts),
            absent_ranks=[],
            op=call.op if call else None,
            site=self.site(call.site if call else None),
            evidence=evidence,
            fix=self.fix(Cause.TRANSPORT_HANG),
        )

    # -- warnings ----------------------------------------------------------------------

    def warnings(self, errors: list[Finding]) -> list[Finding]:
        causes = {f.cause for f in errors}
        found: list[Finding] = []
        if self.ev.world_size > 1 and Cause.MISSING_DISTRIBUTED_SAMPLER not in causes:
            loaders: dict[str, set[str]] = {}
            for trace in self.ev.traces.values():
                for loader_pass in trace.eval_passes:
                    # an IterableDataset shards itself: no sampler to name
                    if not loader_pass.distributed_sampler and not loader_pass.iterable:
                        loaders.setdefault(loader_pass.loader, set()).add(str(loader_pass.sampler))
            overlap = self.eval_samples_overlap()
            for loader, samplers in sorted(loaders.items()):
                effect = (
                    "the ranks evaluate the same samples, so metrics count them more than once"
                    if overlap
                    else "its per-rank shards are made by hand and nothing keeps their lengths equal"
                )
                found.append(
                    Finding(
                        cause=Cause.MISSING_DISTRIBUTED_SAMPLER,
                        severity=Severity.WARNING,
                        message=(
                            f"eval loader {loader} has no DistributedSampler "
                            f"({', '.join(sorted(samplers))}): {effect}"
                        ),
                        fix=self.fix(Cause.MISSING_DISTRIBUTED_SAMPLER),
                    )
                )
        found += self.rooted_reads()
        uneven_train = self.uneven_train_loader()
        if uneven_train is not None and Cause.UNEVEN_EVAL_BATCHES not in causes:
            found.append(uneven_train)
        # complete passes only: a rank that died mid-pass has a partial count
        counts = {
            r: sum(p.batches for p in t.eval_passes if p.exhausted)
            for r, t in self.ev.traces.items()
            if any(p.exhausted for p in t.eval_passes)
        }
        if (
            len(counts) > 1
            and len(set(counts.values())) > 1
            and not causes & {Cause.UNEVEN_EVAL_BATCHES, Cause.MISSING_DISTRIBUTED_SAMPLER}
        ):
            found.append(
                Finding(
                    cause=Cause.UNEVEN_EVAL_BATCHES,
                    severity=Severity.WARNING,
                    message=(
                        "eval loaders yield different numbers of batches per rank: "
                        + ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))
                        + "; a per-batch collective in the eval loop would hang"
                    ),
                    ranks=sorted(counts),
                    fix=self.fix(Cause.UNEVEN_EVAL_BATCHES),
                )
            )
        return found

    def rooted_reads(self) -> list[Finding]:
        """A rank read the tensor it gave dist.reduce, which only the dst rank receives
        the result in (record/rooted.py): what it computes from it is its own partial
        value, and a branch on it may part the ranks on another day's data."""
        readers: dict[tuple[Frame, Frame], list[int]] = {}
        example: dict[tuple[Frame, Frame], RootedRead] = {}
        for rank, trace in sorted(self.ev.traces.items()):
            for read in trace.rooted_reads:
                key = (read.site, read.reduce_site)
                readers.setdefault(key, []).append(rank)
                example.setdefault(key, read)
        found: list[Finding] = []
        for key, ranks in readers.items():
            read = example[key]
            name = f"`{read.var}`" if read.var else "the tensor"
            decides = source.decision_at(read.site.file, read.site.line)
            effect = (
                f", and `{decides}` decides on it: ranks that decide differently part ways" if decides else ""
            )
            members = sorted(self.ev.traces)
            found.append(
                Finding(
                    cause=Cause.UNSYNCHRONIZED_DECISION,
                    severity=Severity.WARNING,
                    message=(
                        f"{who(ranks)} read {name} with {read.how} at {self.site(read.site)} in "
                        f"{read.site.function}(), but dist.reduce at {self.site(read.reduce_site)} "
                        f"sent the result to rank {read.dst} only: what a rank reads there is its "
                        f"own partial value{effect}"
                    ),
                    ranks=ranks,
                    absent_ranks=[r for r in members if r not in ranks],
                    op="reduce",
                    site=self.site(read.site),
                    evidence=[
                        f"dist.reduce(..., dst={read.dst}) at {self.site(read.reduce_site)} in "
                        f"{read.reduce_site.function}() ({read.phase})",
                        "call chain of the read: "
                        + " -> ".join(f"{f.function}() at {self.site(f)}" for f in read.stack),
                    ],
                    fix=(
                        "Where every rank needs the value, use dist.all_reduce instead of dist.reduce "
                        "(divide by the world size for a mean); where only the dst rank should use "
                        f"it, read it under `if rank == {read.dst}` and broadcast any decision taken "
                        "on it."
                    ),
                )
            )
        return found

    def uneven_train_loader(self) -> Finding | None:
        """A train loader whose len() differs per rank, in a loop with a collective in
        every step (DDP's gradient all_reduce): the ranks with fewer batches leave the
        epoch while the others wait in their next step. The dry run's budget ends each
        epoch early, so the run itself stays aligned: said as a warning."""
        lengths: dict[str, dict[int, int]] = {}
        cut = any(p.budget_cut for t in self.ev.traces.values() for p in t.passes if p.role == "train")
        for rank, trace in self.ev.traces.items():
            drawn = sum(p.batches for p in trace.passes if p.role == "train")
            # at least one collective per train batch drawn: a collective in every step
            if not drawn or trace.calls_per_phase().get("train", 0) < drawn:
                continue
            for loader_pass in trace.passes:
                if loader_pass.role == "train" and loader_pass.index == 0 and loader_pass.length is not None:
                    lengths.setdefault(loader_pass.loader, {})[rank] = loader_pass.length
        for loader, per_rank in sorted(lengths.items()):
            if len(per_rank) < 2 or len(set(per_rank.values())) < 2:
                continue
            most = max(per_rank.values())
            if all(self.ev.traces[r].join_stand_ins for r, n in per_rank.items() if n < most):
                continue  # the ranks with fewer batches joined: DDP's Join stood in for them
            return Finding(
                cause=Cause.UNEVEN_EVAL_BATCHES,
                severity=Severity.WARNING,
                message=(
                    f"train loader {loader} yields different numbers of batches per rank ("
                    + ", ".join(f"rank {r}: {n}" for r, n in sorted(per_rank.items()))
                    + "), and every step makes a collective: at the end of each epoch the ranks "
                    "with fewer batches move on while the others wait in their next step"
                    + (" (the dry run's budget ended each epoch sooner)" if cut else "")
                    + ". Shard with DistributedSampler, drop the remainder, or wrap the loop in "
                    "DDP's join()"
                ),
                ranks=sorted(per_rank),
                fix=self.fix(Cause.UNEVEN_EVAL_BATCHES),
            )
        return None


def _guard_around(frames: list[Frame], kind: str) -> tuple[Frame, source.Guard] | None:
    """The first ``if`` of ``kind`` around the frames' lines: frames outermost first,
    each frame's tests innermost first."""
    for frame in frames:
        for guard in source.guards_of(frame.file, frame.line):
            if guard.kind == kind:
                return frame, guard
    return None


def _cause_of_exit(condition_kind: str) -> Cause:
    """The cause an early exit or skip names, by what its condition reads."""
    return {
        source.RANK: Cause.RANK_EARLY_EXIT,
        source.DATA: Cause.DATA_DEPENDENT_BRANCH,
    }.get(condition_kind, Cause.UNSYNCHRONIZED_DECISION)


def _location_of(described: str) -> tuple[str, int] | None:
    """(file, line) from an exit description's ' at FILE:LINE in FUNCTION' ending."""
    match = re.search(r" at (.+):(\d+) in [^ ]+$", described)
    return (match.group(1), int(match.group(2))) if match else None


def _line_ranges(spans: list[tuple[int, int]]) -> str:
    """ "line 83" / "lines 83-85, 90": statements' line spans, merged where they touch."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    texts = [f"{a}-{b}" if b > a else str(a) for a, b in merged]
    single = len(merged) == 1 and merged[0][0] == merged[0][1]
    return ("line " if single else "lines ") + ", ".join(texts)


def who(ranks: list[int]) -> str:
    """'rank 0' or 'ranks 1-3': how a sentence names ranks."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _shapes_text(shapes: list[list[int]]) -> str:
    """[[8], [8], [8]] -> '[8] x3'; [[2], [4, 4]] -> '[2], [4, 4]'."""
    if not shapes:
        return ""
    texts = ["[" + ", ".join(map(str, shape)) + "]" for shape in shapes]
    if len(set(texts)) == 1 and len(texts) > 1:
        return f"{texts[0]} x{len(texts)}"
    return ", ".join(texts)


def _collapse(lines: list[str]) -> list[str]:
    """'rank 1: X', 'rank 2: X' -> 'ranks 1-2: X'."""
    groups: dict[str, list[int]] = {}
    for line in lines:
        head, _, text = line.partition(": ")
        rank = int(head.split()[-1])
        groups.setdefault(text, []).append(rank)
    return [f"rank{'s' if len(r) > 1 else ''} {format_ranks(r)}: {text}" for text, r in groups.items()]


def _signal_name(code: int | None) -> str | None:
    import signal

    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return None


def _is_user(path: str) -> bool:
    from ncclcheck.record.frames import is_user_file

    return is_user_file(path)


def diagnose(evidence: Evidence, catalogue: Catalogue | None = None) -> Report:
    return Diagnoser(evidence, catalogue).report()


def _first_line(text: str, limit: int) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."
