"""From a dry run's evidence to preflight's report, named by the catalogue's cause ids.

The evidence is the per-rank traces, how each rank ended, whether the watchdog
saw a stall, and the stacks captured then. The first divergence of the
per-group histories says *where* the ranks parted; the source around the call
sites, the eval batch counts, the exits and the stacks say *why* (the rules'
tables, rules/); this module assembles what they return into the report.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ncclcheck.catalogue import Catalogue, load_catalogue
from ncclcheck.evidence.align import Divergence, Mismatch
from ncclcheck.evidence.traces import divergences_of, eval_calls_without_loader
from ncclcheck.explain.context import Context, Evidence
from ncclcheck.explain.coverage import Coverage, Gap, coverage
from ncclcheck.explain.engine import Explanation
from ncclcheck.explain.rules.divergence import crashed, explain_divergence
from ncclcheck.explain.rules.quiet import explain_stall_without_divergence, warnings
from ncclcheck.model import Finding, RankState, RankStatus, Report, Severity, Verdict
from ncclcheck.record.tracefile import End
from ncclcheck.wording import is_user, who


class Diagnosed(NamedTuple):
    """preflight's report, and the replay that would decide its first finding where the
    source alone did not (the line-tracing plan of explain/lines.py), if any."""

    report: Report
    replay_plan: dict[str, Any] | None
    not_run: list[Gap]  # what summary["not_run"] says, with the decisions preflight may force


def diagnose(evidence: Evidence, catalogue: Catalogue | None = None) -> Diagnosed:
    d = Context(evidence, catalogue or load_catalogue())
    explanations = _explanations(d)
    covered = coverage(d) if d.ev.traces and not d.ev.incomplete else Coverage()
    findings = [explanation.finding(d.catalogue) for explanation in explanations]
    findings += covered.found_in_source
    verdict = _verdict(d, findings)
    summary = _summary(d)
    if covered.ran:
        summary["covered"] = covered.ran
    if covered.not_run:
        summary["not_run"] = [gap.text for gap in covered.not_run]
        if verdict is Verdict.ALIGNED and any(gap.communicates for gap in covered.not_run):
            verdict = Verdict.PARTIAL  # nothing wrong in what ran; collectives that did not run
    if verdict is Verdict.INCOMPLETE and d.ev.incomplete:
        summary["incomplete"] = _what_was_checked(d, d.ev.incomplete)
    elif verdict is Verdict.INCOMPLETE and d.ev.stalled:
        why = f"it stopped ranks {d.ev.stall_seconds:.0f} s quiet outside any collective"
        summary["incomplete"] = _what_was_checked(d, why)
    elif d.ev.incomplete:
        summary["incomplete"] = f"{d.ev.incomplete}: the findings are what it saw until then"
    report = Report(
        command="preflight",
        verdict=verdict,
        world_size=d.ev.world_size,
        ranks=_rank_states(d),
        findings=findings,
        summary=summary,
    )
    plan = next((e.replay_plan for e in explanations if e.replay_plan is not None), None)
    return Diagnosed(report, plan, covered.not_run)


def _explanations(d: Context) -> list[Explanation]:
    found = [divergence for divergence in divergences_of(d.ev.traces) if not _only_behind(d, divergence)]
    explanations: list[Explanation] = []
    complete = len(d.ev.traces) >= d.ev.world_size
    if found:
        explanations.append(explain_divergence(d, found))
    elif d.ev.stalled and complete:
        explanations.append(explain_stall_without_divergence(d))
    else:
        dead = [r for r in sorted(d.ev.traces) if d.died(r)]
        if dead:
            explanations.append(crashed(d, dead, None))
    return explanations + warnings(d, explanations)


def _verdict(d: Context, findings: list[Finding]) -> Verdict:
    errors = any(f.severity is Severity.ERROR for f in findings)
    # stopped quiet, but the stacks show no rank inside a collective: nothing waited on a
    # peer, so no hang was seen (without stacks, the stall itself is the evidence)
    nobody_waited = bool(d.ev.stacks) and not any(s.in_collective for s in d.ev.stacks.values())
    if d.ev.stalled and (errors or not nobody_waited):
        # stopped while a rank was aborting on its own (gloo's abort on a buffer of another
        # size takes seconds on a loaded machine): the job ended itself, it did not wait
        if any(d.aborted_on_its_own(rank) for rank in d.ev.traces):
            return Verdict.CRASH
        return Verdict.HANG
    if any(d.died(rank) for rank in d.ev.traces):
        return Verdict.CRASH
    if errors:
        return Verdict.MISALIGNED
    # nothing wrong in what ran, but not all of it ran; or it stopped ranks that were
    # quiet with none of them in a collective: nothing waited on a peer, no hang seen
    if d.ev.incomplete or d.ev.stalled:
        return Verdict.INCOMPLETE
    return Verdict.ALIGNED


def _rank_states(d: Context) -> list[RankState]:
    states = []
    ranks = sorted(d.ev.ranks_run) if d.ev.ranks_run is not None else range(d.ev.world_size)
    for rank in ranks:
        trace = d.ev.traces.get(rank)
        if trace is None:
            states.append(RankState(rank=rank, state=RankStatus.EXITED, where="no trace"))
            continue
        how, code = d.exit_of(rank)
        stack = d.ev.stacks.get(rank)
        last = trace.calls[-1] if trace.calls else None
        if how is not End.RUNNING:
            state = RankStatus.EXITED
        elif stack is not None and stack.in_collective:
            state = RankStatus.IN_COLLECTIVE
        elif d.ev.stalled:
            state = RankStatus.STUCK
        else:
            state = RankStatus.EXITED if code is not None else RankStatus.RUNNING
        where = None
        _error, error_site = d.exit_error(rank)
        if error_site is not None:  # an exception's: the line the script left from
            where = f"{d.site(error_site)} in {error_site.function}"
        if where is None and stack is not None and stack.main is not None:
            frame = next((f for f in stack.main.frames if is_user(f.file)), None)
            where = f"{d.site(frame)} in {frame.function}" if frame else None
        if where is None and last is not None and last.site is not None:
            where = f"{d.site(last.site)} in {last.site.function}"
        states.append(
            RankState(
                rank=rank,
                host=trace.host,
                pid=trace.pid,
                exit_code=code if how is not End.RUNNING else None,
                phase=trace.phase,
                collectives=trace.collectives,
                eval_batches=trace.eval_batches(),
                state=state,
                where=where,
            )
        )
    return states


def _only_behind(d: Context, divergence: Divergence) -> bool:
    """In a run stopped from outside, a rank still running that has not made a call
    yet is behind, not absent: it was cut off on its way (a straggler mid-write)."""
    return (
        bool(d.ev.incomplete)
        and divergence.kind is Mismatch.MISSING
        # no exit line: the rank never ended on its own (our stop killed it, if anything)
        and all(rank in d.ev.traces and d.ev.traces[rank].exit is None for rank in divergence.absent)
    )


def _fast_forward(d: Context) -> list[str]:
    """What --eval-batches did to each eval loader's first pass: skipped how many of
    how many batches, or why it ran in full (record/fastforward.py)."""
    said: dict[str, str] = {}
    for trace in d.ev.traces.values():
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


def _what_was_checked(d: Context, why: str) -> str:
    """An unfinished run's extent: how far each rank got, so a reader knows what the
    absence of a finding covers and what it does not."""
    traces = d.ev.traces.values()
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


def _summary(d: Context) -> dict[str, object]:
    per_phase: dict[str, int] = {}
    for trace in d.ev.traces.values():
        for phase, count in trace.calls_per_phase().items():
            per_phase[phase] = per_phase.get(phase, 0) + count
    eval_batches = {str(r): t.eval_batches() for r, t in sorted(d.ev.traces.items())}
    backends = sorted({t.backend for t in d.ev.traces.values() if t.backend})
    summary: dict[str, object] = {
        "backend": ", ".join(backends) or None,
        "collectives_per_phase": per_phase,
        "eval_batches": eval_batches,
    }
    if d.ev.stopped:
        summary["stopped"] = d.ev.stopped
    if d.ev.ranks_run is not None:
        summary["virtual"] = [f"rank {rank}: {why}" for rank, why in sorted(d.ev.ranks_run.items())][:64]
        summary["virtual_note"] = (
            f"a virtual world of {d.ev.world_size} ranks on the fake process group: "
            f"{len(d.ev.ranks_run)} ran, each alone; collectives returned at once with rank 0's "
            "results, so decisions on synchronised values agree and decisions on rank-local ones do not"
        )
    elif len(d.ev.traces) < d.ev.world_size:
        summary["partial"] = (
            f"traces of {who(sorted(d.ev.traces))} of {d.ev.world_size} "
            f"only: gather every node's --trace-dir in one folder and run "
            f"`ncclcheck preflight --from DIR` for the whole picture"
        )
    for key, attribute in (("cpu", "cpu_mapped"), ("perturbed", "perturbed"), ("framework", "adapted")):
        noted: dict[str, list[int]] = {}
        for rank, trace in sorted(d.ev.traces.items()):
            for kind, frame in getattr(trace, attribute):
                noted.setdefault(f"{kind} at {d.site(frame)}", []).append(rank)
        if noted:
            summary[key] = [f"{what} ({who(ranks)})" for what, ranks in noted.items()]
    fast_forward = _fast_forward(d)
    if fast_forward:
        summary["eval_fast_forward"] = fast_forward
    eval_calls = eval_calls_without_loader(d.ev.traces)
    if eval_calls is not None:
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
            (t.exit is not None and t.exit.how is End.DRY_RUN_COMPLETE) or any(p.budget_cut for p in t.passes)
            for t in d.ev.traces.values()
        )
        # a train pass fast-forwarded to its end skipped the steps where it would come
        skipped = any(p.head and p.skipped for t in d.ev.traces.values() for p in t.passes)
        if budget_cut or skipped:
            # the budget ended a train pass, or the run, or skipped its middle, before evaluation came
            note += (
                "; the dry run's budget "
                + ("skipped the steps" if skipped and not budget_cut else "stopped it")
                + " before it: if evaluation runs every N steps, rerun with --train-steps above N "
                "(or the script's eval interval set low)"
            )
        summary["note"] = note
    return summary
