"""The explanation engine and its rules on synthetic evidence: calls as traces record
them, stacks as py-spy shows them, source files the rules read. No ranks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ncclcheck.catalogue import load_catalogue
from ncclcheck.causes import Cause
from ncclcheck.evidence.align import divergences
from ncclcheck.evidence.classes import merge_stacks
from ncclcheck.evidence.stacks import ProcessStack, blocking
from ncclcheck.evidence.traces import LoaderPass, RankEnding, RankTrace
from ncclcheck.explain.context import Evidence, Fork
from ncclcheck.explain.diagnose import diagnose
from ncclcheck.explain.engine import Explanation, ReasonKind, first_explanation
from ncclcheck.explain.rules import branch, divergence, quiet, stacks
from ncclcheck.explain.rules.branch import explain_fork
from ncclcheck.explain.rules.divergence import explain_divergence
from ncclcheck.explain.rules.stacks import explain_classes
from ncclcheck.model import CollectiveCall, Frame, Report, Severity, Verdict
from ncclcheck.record.tracefile import End

from ..conftest import PLAYBOOKS
from .factories import TORCH, call, diagnoser, line_of, script, stack, thread, trace, waiting_in

# -- the engine -------------------------------------------------------------------------


def diagnose_report(evidence: Evidence) -> Report:
    return diagnose(evidence).report


def test_the_first_rule_of_a_table_that_explains_wins() -> None:
    said: list[str] = []

    def silent(_: int) -> Explanation | None:
        said.append("silent")
        return None

    def first(_: int) -> Explanation | None:
        said.append("first")
        return Explanation(Cause.STRAGGLER, "first")

    def second(_: int) -> Explanation | None:
        said.append("second")
        return Explanation(Cause.TRANSPORT_HANG, "second")

    explanation = first_explanation((silent, first, second), 0)
    assert explanation is not None and explanation.message == "first"
    assert said == ["silent", "first"]  # a later rule is not even asked
    assert first_explanation((silent,), 0) is None


def test_an_explanation_carries_the_playbooks_fix_unless_it_has_its_own() -> None:
    catalogue = load_catalogue(PLAYBOOKS)
    plain = Explanation(Cause.STRAGGLER, "slow").finding(catalogue)
    assert plain.fix == catalogue.get(Cause.STRAGGLER).fix.direct and plain.fix
    own = Explanation(Cause.STRAGGLER, "slow", fix="do this").finding(catalogue)
    assert own.fix == "do this"
    assert Explanation(Cause.STRAGGLER, "x", fix="").finding(catalogue).fix == ""


def test_each_table_ends_with_a_rule_that_always_answers() -> None:
    # the source reading and doctor's "no rank waits" close their tables: the commands
    # assert an answer, so a table must never run dry
    assert divergence.DIVERGENCE_RULES[-1] is divergence.the_source_decides
    assert branch.FORK_RULES[-1] is branch.nothing_in_the_source
    assert stacks.STACK_RULES[-1] is stacks.no_rank_waits


# -- the source reading (branch.py), fed by traces --------------------------------------

RANK_TEST = """
def main(rank):
    if rank == 0:
        all_reduce()
    barrier()
"""
EARLY_EXIT = """
def evaluate(rank):
    if rank > 0:
        return
    all_reduce()


def main(rank):
    evaluate(rank)
    barrier()
"""
DATA_TEST = """
def main(batch):
    if batch.shape[0] > 1:
        all_reduce()
    barrier()
"""
LOOP_EXIT = """
def main(rank):
    for step in range(10):
        loss = compute()
        if loss < 0.1:
            break
        all_reduce()
    barrier()
"""
NOTHING = """
def main(rank):
    all_reduce()
    barrier()
"""


def _fork(tmp_path: Path, body: str, lone: str, other: str, lone_function: str = "main") -> Fork:
    """Rank 0 made the call at the line holding ``lone``, rank 1 the one at ``other``."""
    path = script(tmp_path, body)
    lone_line, other_line = line_of(path, lone), line_of(path, other)
    outer = [] if lone_function == "main" else [call(0, path, line_of(path, "    evaluate(rank)")).site]
    calls = {
        0: call(0, path, lone_line, function=lone_function, stack=outer),  # type: ignore[arg-type]
        1: call(1, path, other_line, op="barrier"),
    }
    return Fork.of(diagnoser(tmp_path), [0, 1], calls, [0], [1], [])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "lone_function", "cause", "reason", "at", "test"),
    [
        (
            RANK_TEST,
            "main",
            Cause.RANK_CONDITIONAL_COLLECTIVE,
            ReasonKind.RANK_TEST,
            "if rank == 0",
            "rank == 0",
        ),
        # an exit is sited at its return or break, the test it is under said beside it
        (EARLY_EXIT, "evaluate", Cause.RANK_EARLY_EXIT, ReasonKind.EARLY_EXIT, "return", "rank > 0"),
        (
            DATA_TEST,
            "main",
            Cause.DATA_DEPENDENT_BRANCH,
            ReasonKind.DATA_TEST,
            "if batch",
            "batch.shape[0] > 1",
        ),
        (LOOP_EXIT, "main", Cause.UNSYNCHRONIZED_DECISION, ReasonKind.LOOP_EXIT, "break", "loss < 0.1"),
    ],
)
def test_the_source_reading_names_what_sent_the_ranks_apart(
    tmp_path: Path, body: str, lone_function: str, cause: Cause, reason: ReasonKind, at: str, test: str
) -> None:
    explanation = explain_fork(_fork(tmp_path, body, "all_reduce()", "barrier()", lone_function))
    assert explanation.cause is cause, explanation
    assert explanation.reason is not None and explanation.reason.kind is reason
    path = str(tmp_path / "train.py")
    assert explanation.reason.site == Frame(path, line_of(path, at), "")
    assert test in explanation.reason.text


def test_a_parting_nothing_in_the_source_explains_has_no_reason(tmp_path: Path) -> None:
    explanation = explain_fork(_fork(tmp_path, NOTHING, "all_reduce()", "barrier()"))
    assert explanation.reason is None
    assert explanation.cause is Cause.RANK_CONDITIONAL_COLLECTIVE  # where they parted, said plainly
    assert (explanation.ranks, explanation.absent_ranks) == ([0], [1])


def test_a_divergence_of_shapes_is_named_before_the_source_is_read(tmp_path: Path) -> None:
    path = script(tmp_path, RANK_TEST)
    line = line_of(path, "all_reduce()")
    found = divergences({0: [call(0, path, line, shape=4)], 1: [call(1, path, line, shape=3)]})
    explanation = explain_divergence(diagnoser(tmp_path), found)
    assert explanation.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert explanation.ranks == [0, 1]


# -- one classification of a stack -----------------------------------------------------

USER = "/work/train.py"


@pytest.mark.parametrize(
    ("dump", "what", "waits"),
    [
        (waiting_in("all_reduce", (USER, 9, "main")), "all_reduce", True),
        (
            stack((f"{TORCH}/autograd/graph.py", 824, "_engine_run_backward"), (USER, 9, "main")),
            "all_reduce (DDP gradient buckets, in backward)",
            True,
        ),
        (
            # a store's wait inside init_process_group: torch.distributed, no collective
            stack(
                (f"{TORCH}/distributed/rendezvous.py", 70, "_create_c10d_store"),
                (f"{TORCH}/distributed/distributed_c10d.py", 1500, "init_process_group"),
                (USER, 3, "main"),
            ),
            "init_process_group (torch.distributed)",
            True,
        ),
        (
            # torchelastic's @record wraps the whole script: an outer frame is no wait
            stack(
                (USER, 5, "compute"),
                (f"{TORCH}/distributed/elastic/multiprocessing/errors/__init__.py", 355, "wrapper"),
            ),
            "compute or I/O",
            False,
        ),
        (
            stack((f"{TORCH}/utils/data/dataloader.py", 630, "__next__"), (USER, 7, "main")),
            "DataLoader",
            False,
        ),
        (ProcessStack(pid=1, threads=[], status="stopped"), "stopped (SIGSTOP)", False),
    ],
)
def test_one_classification_of_where_a_stack_waits(dump: ProcessStack, what: str, waits: bool) -> None:
    assert (blocking(dump).what, blocking(dump).waits_for_peers) == (what, waits)
    assert dump.in_collective is waits  # preflight's rank state reads the same


# -- doctor's rules, on stack classes ---------------------------------------------------


def _doctor(tmp_path: Path, dumps: dict[int, ProcessStack], world: int = 2) -> Explanation:
    return explain_classes(diagnoser(tmp_path, world), merge_stacks(dumps), world, sorted(dumps))


def test_doctor_and_preflight_read_one_rank_test_alike(tmp_path: Path) -> None:
    path = script(tmp_path, RANK_TEST)
    reduce_line, barrier_line = line_of(path, "all_reduce()"), line_of(path, "barrier()")
    from_stacks = _doctor(
        tmp_path,
        {
            0: waiting_in("all_reduce", (path, reduce_line, "main")),
            1: waiting_in("barrier", (path, barrier_line, "main")),
        },
    )
    from_traces = explain_fork(_fork(tmp_path, RANK_TEST, "all_reduce()", "barrier()"))
    for explanation in (from_stacks, from_traces):
        assert explanation.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
        assert explanation.reason is not None and explanation.reason.kind is ReasonKind.RANK_TEST
        assert (explanation.site, explanation.ranks, explanation.absent_ranks) == (
            f"train.py:{reduce_line}",
            [0],
            [1],
        )


def test_one_op_at_two_lines_of_straight_line_code_is_a_call_completed_alone(tmp_path: Path) -> None:
    # rank 1 is past the all_reduce rank 0 waits in, with nothing between to skip it: it made
    # the call, and it returned on its side alone, which unequal sizes do
    path = script(tmp_path, "def main():\n    all_reduce()\n    all_reduce()\n")
    explanation = _doctor(
        tmp_path,
        {0: waiting_in("all_reduce", (path, 2, "main")), 1: waiting_in("all_reduce", (path, 3, "main"))},
    )
    assert explanation.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (explanation.ranks, explanation.absent_ranks, explanation.site) == ([0], [1], "train.py:2")


def test_one_op_at_two_lines_a_test_or_a_loop_could_part_is_not_a_call_completed_alone(
    tmp_path: Path,
) -> None:
    for name, source, lines in (
        ("test.py", "def main(x):\n    all_reduce()\n    if x:\n        return\n    all_reduce()\n", (2, 5)),
        (
            "loop.py",
            "def main(n):\n    for _ in range(n):\n        all_reduce()\n        all_reduce()\n",
            (3, 4),
        ),
    ):
        path = script(tmp_path, source, name)
        explanation = _doctor(
            tmp_path,
            {
                0: waiting_in("all_reduce", (path, lines[0], "main")),
                1: waiting_in("all_reduce", (path, lines[1], "main")),
            },
        )
        assert explanation.cause is not Cause.COLLECTIVE_SHAPE_MISMATCH, source


def test_every_rank_in_the_same_call_is_the_transport(tmp_path: Path) -> None:
    dumps = {r: waiting_in("all_reduce", (USER, 9, "main")) for r in (0, 1)}
    assert _doctor(tmp_path, dumps).cause is Cause.TRANSPORT_HANG


def test_a_rank_outside_any_collective_is_the_straggler(tmp_path: Path) -> None:
    dumps = {0: waiting_in("all_reduce", (USER, 9, "main")), 1: stack((USER, 5, "compute"), status="running")}
    explanation = _doctor(tmp_path, dumps)
    assert (explanation.cause, explanation.ranks, explanation.absent_ranks) == (Cause.STRAGGLER, [0], [1])
    assert explanation.severity is Severity.ERROR


def test_a_rank_missing_from_the_host_comes_first(tmp_path: Path) -> None:
    dumps = {0: waiting_in("all_reduce", (USER, 9, "main")), 1: stack((USER, 5, "compute"))}
    explanation = _doctor(tmp_path, dumps, world=3)
    assert (explanation.cause, explanation.absent_ranks) == (Cause.RANK_CRASHED, [2])


def test_no_rank_in_a_collective_is_a_warning_not_a_cause(tmp_path: Path) -> None:
    explanation = _doctor(tmp_path, {r: stack((USER, 5, "compute")) for r in (0, 1)})
    assert (explanation.cause, explanation.severity) == (Cause.STRAGGLER, Severity.WARNING)
    # no cause's fix: what would decide, with every rank's stack seen
    assert explanation.fix is not None and explanation.fix.startswith("What decides: what these stacks")


# -- the divergence table's other rules, on synthetic traces ------------------------------


def _preflight(tmp_path: Path, traces: dict[int, RankTrace], **evidence: object) -> Explanation:
    report = diagnose_report(Evidence(traces=traces, world_size=len(traces), cwd=str(tmp_path), **evidence))  # type: ignore[arg-type]
    assert report.findings, report
    finding = report.findings[0]
    return Explanation(
        finding.cause, finding.message, finding.ranks, finding.absent_ranks, finding.op, finding.site
    )


def _eval_call(rank: int, path: str, line: int, seq: int, batch: int) -> CollectiveCall:
    made = call(rank, path, line, seq=seq)
    made.phase = "eval"
    made.position = {"loader": "val_loader", "batch": batch, "role": "eval"}
    return made


def test_a_rank_that_left_through_sys_exit_is_an_early_exit(tmp_path: Path) -> None:
    path = script(tmp_path, NOTHING)
    ended = {"how": "sys.exit", "code": 0, "error": f"SystemExit: 0 at {path}:2 in main"}
    traces = {
        0: trace(0, [call(0, path, 2), call(0, path, 3, op="barrier", seq=1)]),
        1: trace(1, [call(1, path, 2)]),
    }
    traces[1].exit = RankEnding.of(ended)
    explanation = _preflight(tmp_path, traces)
    assert (explanation.cause, explanation.ranks, explanation.absent_ranks) == (
        Cause.RANK_EARLY_EXIT,
        [0],
        [1],
    )


def test_eval_loaders_of_different_lengths_are_uneven_eval_batches(tmp_path: Path) -> None:
    path = script(tmp_path, NOTHING)
    traces = {
        0: trace(0, [_eval_call(0, path, 2, seq, seq) for seq in range(3)]),
        1: trace(
            1,
            [*(_eval_call(1, path, 2, seq, seq) for seq in range(2)), call(1, path, 3, op="barrier", seq=2)],
        ),
    }
    for rank, batches in ((0, 3), (1, 2)):
        traces[rank].passes = [
            LoaderPass("val_loader", 0, "eval", batches, "DistributedSampler", True, "Val", batches, True)
        ]
    explanation = _preflight(tmp_path, traces, stalled=True)
    assert (explanation.cause, explanation.ranks, explanation.absent_ranks) == (
        Cause.UNEVEN_EVAL_BATCHES,
        [0],
        [1],
    )


@pytest.mark.parametrize(
    ("whole", "cause"),
    [
        # each rank slices its own set from the tensors (40 and 41 samples), numbered from
        # 0: other samples at the same positions
        ((40, 41), Cause.UNEVEN_EVAL_BATCHES),
        # subsets of one pool, its length on every rank, that no sampler shards: the pool's
        # samples, drawn on several ranks
        ((81, 81), Cause.MISSING_DISTRIBUTED_SAMPLER),
    ],
)
def test_eval_sets_without_a_sampler_repeat_samples_only_where_their_whole_sets_agree(
    tmp_path: Path, whole: tuple[int, int], cause: Cause
) -> None:
    path = script(tmp_path, NOTHING)
    traces = {
        0: trace(0, [_eval_call(0, path, 2, seq, seq) for seq in range(3)]),
        1: trace(
            1,
            [*(_eval_call(1, path, 2, seq, seq) for seq in range(2)), call(1, path, 3, op="barrier", seq=2)],
        ),
    }
    for rank, (batches, length) in enumerate(zip((3, 2), whole, strict=True)):
        traces[rank].passes = [
            LoaderPass("val_loader", 0, "eval", batches, "SequentialSampler", False, "Subset", batches, True)
        ]
        traces[rank].passes[0].sample_ids = list(range(batches * 4))
        traces[rank].passes[0].dataset_len = length
    explanation = _preflight(tmp_path, traces, stalled=True)
    assert (explanation.cause, explanation.ranks) == (cause, [0])


def test_the_same_call_for_different_batches_is_a_skipped_step(tmp_path: Path) -> None:
    path = script(tmp_path, NOTHING)
    traces = {
        0: trace(0, [_eval_call(0, path, 2, 0, 0), _eval_call(0, path, 2, 1, 1)]),
        1: trace(1, [_eval_call(1, path, 2, 0, 0), _eval_call(1, path, 2, 1, 2)]),  # batch 1 skipped
    }
    explanation = _preflight(tmp_path, traces, stalled=True)
    assert explanation.cause is Cause.DATA_DEPENDENT_BRANCH
    assert explanation.absent_ranks == [1] and "skipped" in explanation.message


def test_a_step_function_returning_early_under_a_data_test_is_the_reason_of_a_skipped_step(
    tmp_path: Path,
) -> None:
    # the loop is the caller's; the helper's early return before the call is what skips it
    path = script(
        tmp_path,
        """
        import torch.distributed as dist


        def update(grads, loss):
            if loss.isnan().any():
                return None
            dist.all_reduce(grads)
            return grads


        def train(batches):
            for grads, loss in batches:
                update(grads, loss)
        """,
    )
    reduce_line, caller = line_of(path, "dist.all_reduce"), line_of(path, "        update(grads, loss)")

    def step(rank: int, seq: int, batch: int) -> CollectiveCall:
        made = call(rank, path, reduce_line, function="update", seq=seq, stack=[Frame(path, caller, "train")])
        made.position = {"loader": "train_loader", "batch": batch, "role": "train"}
        return made

    traces = {
        0: trace(0, [step(0, 0, 0), step(0, 1, 1)]),
        1: trace(1, [step(1, 0, 0), step(1, 1, 2)]),  # batch 1 skipped
    }
    report = diagnose_report(Evidence(traces=traces, world_size=2, cwd=str(tmp_path), stalled=True))
    finding = report.findings[0]
    assert (finding.cause, finding.site, finding.absent_ranks) == (
        Cause.DATA_DEPENDENT_BRANCH,
        f"train.py:{reduce_line}",
        [1],
    )
    assert f"`return` under `if loss.isnan().any()` at train.py:{reduce_line - 1}" in " ".join(
        finding.evidence
    )


def test_a_rank_busy_outside_any_collective_while_the_others_wait_is_the_straggler(tmp_path: Path) -> None:
    path = script(tmp_path, NOTHING)
    traces = {0: trace(0, [call(0, path, 2)]), 1: trace(1, [])}
    stacks = {0: waiting_in("all_reduce", (path, 2, "main")), 1: stack((path, 3, "main"), status="running")}
    explanation = _preflight(tmp_path, traces, stalled=True, stacks=stacks)
    assert (explanation.cause, explanation.ranks, explanation.absent_ranks) == (Cause.STRAGGLER, [0], [1])


def test_a_rank_that_ran_to_its_end_is_not_a_straggler_whatever_its_process_still_does(
    tmp_path: Path,
) -> None:
    """CI saw it: a rank that made fewer calls ran to the end of the script and sat in the
    interpreter's teardown (a stack with no Python frame) while the other waited; calling
    it busy elsewhere sent the reader to the wrong rank and the wrong fix."""
    path = script(tmp_path, NOTHING)
    ended = trace(1, [])
    ended.exit = RankEnding(End.RETURNED, 0)
    traces = {0: trace(0, [call(0, path, 2)]), 1: ended}
    for late in (stack((path, 3, "main"), status="running"), ProcessStack(pid=1001, threads=[thread()])):
        stacks = {0: waiting_in("all_reduce", (path, 2, "main")), 1: late}
        explanation = _preflight(tmp_path, traces, stalled=True, stacks=stacks)
        assert explanation.cause is not Cause.STRAGGLER, explanation
        assert "outside any collective" not in explanation.message


def test_every_rank_in_the_same_last_call_and_nothing_moving_is_the_transport(tmp_path: Path) -> None:
    path = script(tmp_path, NOTHING)
    traces = {r: trace(r, [call(r, path, 2)]) for r in (0, 1)}
    stacks = {r: waiting_in("all_reduce", (path, 2, "main")) for r in (0, 1)}
    explanation = _preflight(tmp_path, traces, stalled=True, stacks=stacks)
    assert explanation.cause is Cause.TRANSPORT_HANG


def test_a_rank_held_in_its_data_pipeline_is_a_straggler_with_the_pipeline_named(tmp_path: Path) -> None:
    # one rank's dump, in a buffered iterator of a data package (the shape of fairseq's,
    # written here as a trainer's own): what holds it is its own pipeline, whatever the
    # ranks not seen do; the fix is the pipeline's
    path = script(tmp_path, NOTHING)
    feeder = str(tmp_path / "mylib" / "data" / "streaming.py")
    blocked = stack(
        ("/usr/lib/python3.11/threading.py", 320, "wait"),
        ("/usr/lib/python3.11/queue.py", 171, "get"),
        (feeder, 88, "PrefetchIterator.__next__"),
        (path, 3, "main"),
    )
    explanation = _doctor(tmp_path, {0: blocked}, world=1)
    assert explanation.severity is Severity.ERROR and explanation.cause is Cause.STRAGGLER
    assert explanation.ranks == [0]
    assert f"data pipeline (at {feeder}:88 in PrefetchIterator.__next__)" in explanation.message
    assert explanation.fix is not None and explanation.fix.startswith(
        "Mend the data pipeline of the process that waits"
    )
    # posted alone, with nothing saying how many ranks the job has: the others are said as unseen
    alone = explain_classes(diagnoser(tmp_path, 1), merge_stacks({0: blocked}), 1, [0], world_known=False)
    assert alone.severity is Severity.ERROR
    assert "the ranks not seen here would wait for rank 0" in alone.message
    # a lock is no data pipeline: no cause is claimed, what decides is said
    locked = stack(("/usr/lib/python3.11/threading.py", 320, "wait"), (path, 3, "main"))
    explanation = _doctor(tmp_path, {0: locked, 1: locked}, world=2)
    assert explanation.severity is Severity.WARNING
    assert explanation.fix is not None and explanation.fix.startswith("What decides")
    assert "data pipeline" not in explanation.fix
    alone = explain_classes(diagnoser(tmp_path, 1), merge_stacks({0: locked}), 1, [0], world_known=False)
    assert alone.fix is not None and alone.fix.startswith("What decides: the other ranks' stacks")


def test_a_quiet_rank_after_the_others_ended_is_no_hang_and_no_cause_is_named(tmp_path: Path) -> None:
    """A stall with every history alike, one rank ended and the other waiting outside any
    collective (joining a checkpoint writer): nobody waits on a peer. Calling it a
    straggler named the ended rank as waiting; it is said as undecided, with what decides."""
    path = script(tmp_path, NOTHING)
    ended = trace(1, [call(1, path, 2)])
    ended.exit = RankEnding(End.RETURNED, 0)
    traces = {0: trace(0, [call(0, path, 2)]), 1: ended}
    stacks = {0: stack((path, 3, "main"), status="sleeping"), 1: ProcessStack(pid=1001, threads=[thread()])}
    report = diagnose_report(
        Evidence(
            traces=traces, world_size=2, cwd=str(tmp_path), stalled=True, stall_seconds=16, stacks=stacks
        )
    )
    assert report.verdict is Verdict.INCOMPLETE and not report.has_errors, report
    (finding,) = report.findings
    assert finding.severity is Severity.WARNING and not finding.ranks and not finding.absent_ranks
    assert "rank 0 outside any collective" in finding.message and "after rank 1 ended" in finding.message
    assert finding.fix.startswith("What decides")
    assert "16 s quiet outside any collective" in report.summary["incomplete"]


def test_a_rank_in_a_collective_no_record_holds_after_the_others_ended_is_left_alone(tmp_path: Path) -> None:
    # histories alike, rank 1 ended, rank 0's stack in a collective the recorder did not see:
    # rank 0 waits for a rank that will never come; never "no rank inside a collective"
    path = script(tmp_path, NOTHING)
    ended = trace(1, [call(1, path, 2)])
    ended.exit = RankEnding(End.RETURNED, 0)
    traces = {0: trace(0, [call(0, path, 2)]), 1: ended}
    stacks = {0: waiting_in("barrier", (path, 3, "main")), 1: ProcessStack(pid=1001, threads=[thread()])}
    evidence = Evidence(traces=traces, world_size=2, cwd=str(tmp_path), stalled=True, stacks=stacks)
    report = diagnose_report(evidence)
    assert report.verdict is Verdict.HANG
    (finding,) = [f for f in report.findings if f.severity is Severity.ERROR]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_EARLY_EXIT, [0], [1])


def test_ranks_all_quiet_outside_any_collective_are_not_the_transport(tmp_path: Path) -> None:
    # every rank in a lock or a DataLoader worker's queue: no collective is pending
    path = script(tmp_path, NOTHING)
    traces = {r: trace(r, [call(r, path, 2)]) for r in (0, 1)}
    stacks = {r: stack((path, 3, "main")) for r in (0, 1)}
    evidence = Evidence(traces=traces, world_size=2, cwd=str(tmp_path), stalled=True, stacks=stacks)
    report = diagnose_report(evidence)
    assert report.verdict is Verdict.INCOMPLETE, report
    assert [f.cause for f in report.findings] != [Cause.TRANSPORT_HANG]
    assert all(f.severity is Severity.WARNING for f in report.findings)


HOOKS = """
import torch
import torch.distributed as dist


class LossHook:
    def finish(self):
        dist.all_reduce(torch.zeros(1))


class SampleHook:
    def finish(self):
        dist.broadcast(torch.zeros(3), src=0)


def end_of_epoch(hooks):
    for name, hook in hooks.items():
        hook.finish()
"""


def test_one_call_in_a_loop_reaching_other_methods_per_rank_is_an_order_mismatch(tmp_path: Path) -> None:
    """Hooks registered in the order each rank met them: the loop's one call reaches
    LossHook.finish on one rank and SampleHook.finish on the other (both named
    ``finish``: a trace names no class, so the defs tell them apart)."""
    path = script(tmp_path, HOOKS)
    loop_call = line_of(path, "hook.finish()")
    caller = [Frame(path, loop_call, "end_of_epoch")]
    traces = {
        0: trace(0, [call(0, path, line_of(path, "all_reduce"), function="finish", stack=caller)]),
        1: trace(
            1, [call(1, path, line_of(path, "broadcast"), op="broadcast", function="finish", stack=caller)]
        ),
    }
    explanation = _preflight(tmp_path, traces, stalled=True)
    assert explanation.cause is Cause.COLLECTIVE_ORDER_MISMATCH, explanation
    assert f"in the loop over `hooks.items()` at train.py:{loop_call - 1}" in explanation.message


def test_ranks_in_one_function_from_one_loop_call_are_not_a_loop_order(tmp_path: Path) -> None:
    # the same def on both sides (two calls of one method): no other function was reached
    path = script(tmp_path, HOOKS)
    loop_call = line_of(path, "hook.finish()")
    caller = [Frame(path, loop_call, "end_of_epoch")]
    reduce_line = line_of(path, "all_reduce")
    traces = {
        0: trace(0, [call(0, path, reduce_line, function="finish", stack=caller)]),
        1: trace(1, [call(1, path, reduce_line, function="finish", stack=caller, shape=5)]),
    }
    explanation = _preflight(tmp_path, traces, stalled=True)
    assert explanation.cause is not Cause.COLLECTIVE_ORDER_MISMATCH or "loop over" not in explanation.message


def test_when_nothing_in_the_source_explains_the_fork_it_says_so_and_gives_no_fix(tmp_path: Path) -> None:
    """Ranks at two calls that no test, exit or loop of the source sends apart (a rank that
    took another path through a library, say): the finding says the reason was not found,
    lists what the source shows on the way and what would decide, and gives no fix."""
    path = script(
        tmp_path,
        """
        import torch.distributed as dist


        def sync(x):
            dist.all_reduce(x)


        def share(x):
            dist.broadcast(x, src=0)


        def main(x, y):
            sync(x)
            share(y)
        """,
    )
    dumps = {
        0: waiting_in("all_reduce", (path, line_of(path, "dist.all_reduce(x)"), "sync"), (path, 13, "main")),
        1: waiting_in("broadcast", (path, line_of(path, "dist.broadcast(x"), "share"), (path, 14, "main")),
    }
    explanation = _doctor(tmp_path, dumps)
    assert explanation.reason is None
    assert "the reason was not found in the source" in explanation.message
    assert any(line.startswith("what would decide:") for line in explanation.evidence)
    assert any("no test, exit or swallowing try" in line for line in explanation.evidence)
    finding = explanation.finding(load_catalogue(PLAYBOOKS))
    assert finding.fix == ""


@pytest.mark.parametrize(
    ("lengths", "said"),
    [
        # one dataset read whole by every rank: the same positions are the same samples
        ((4, 4), "the ranks evaluate the same samples"),
        # positions in datasets of other lengths: shards sliced per rank, not one set twice
        ((4, 3), "its per-rank shards are made by hand"),
    ],
)
def test_an_eval_loader_without_a_sampler_is_said_to_repeat_samples_only_where_one_dataset_is_read(
    tmp_path: Path, lengths: tuple[int, int], said: str
) -> None:
    traces = {rank: trace(rank, []) for rank in (0, 1)}
    for rank, length in enumerate(lengths):
        traces[rank].passes = [
            LoaderPass(
                "val_loader", 0, "eval", length, "SequentialSampler", False, "TensorDataset", length, True
            )
        ]
        traces[rank].passes[0].sample_ids = list(range(length * 8))
    (warning,) = [
        w
        for w in quiet.warnings(diagnoser(tmp_path, traces=traces), [])
        if w.cause is Cause.MISSING_DISTRIBUTED_SAMPLER
    ]
    assert said in warning.message, warning.message


@pytest.mark.parametrize(
    ("passes", "warned"),
    [
        # rank 0 evaluated twice after the ranks had parted, rank 1 once: 2 against 1 in
        # all, every pass one batch (fresh w03, a DistributedSampler building a loader per
        # evaluate() call)
        ({0: [1, 1], 1: [1]}, None),
        # the first pass itself is longer on rank 0
        ({0: [2, 1], 1: [1]}, "rank 0: 2, rank 1: 1"),
    ],
)
def test_eval_passes_are_compared_pass_by_pass_not_in_total(
    tmp_path: Path, passes: dict[int, list[int]], warned: str | None
) -> None:
    traces = {rank: trace(rank, []) for rank in passes}
    for rank, lengths in passes.items():
        traces[rank].passes = [
            LoaderPass(f"loader#{n + 1}", n, "eval", b, "DistributedSampler", True, "TensorDataset", b, True)
            for n, b in enumerate(lengths)
        ]
    said = [
        w.message
        for w in quiet.warnings(diagnoser(tmp_path, traces=traces), [])
        if w.cause is Cause.UNEVEN_EVAL_BATCHES
    ]
    if warned is None:
        assert said == []
    else:
        (message,) = said
        assert warned in message, message


BUDGET_THEN_EVALUATE = """\
def evaluate(loader):
    for batch in loader:
        all_gather(batch)

def fit(loader, val_loader, budget):
    seen = 0
    for batch in loader:
        backward_all_reduce(batch)
        seen += count(batch)
        if seen >= budget:
            break
    evaluate(val_loader)
"""


def test_a_rank_still_in_the_train_loop_never_entered_the_eval_loop_the_other_waits_in(
    tmp_path: Path,
) -> None:
    """Rank 0 left the train loop by its own count and waits in evaluate's loop; rank 1 is
    still training, before the call to evaluate: it never entered that loop, so the eval
    loop did not run fewer times on it (no uneven-eval-batches); the break that sent rank 0
    out decides."""
    path = script(tmp_path, BUDGET_THEN_EVALUATE)
    explanation = _doctor(
        tmp_path,
        {
            0: waiting_in("all_gather", (path, 3, "evaluate"), (path, 12, "fit")),
            1: waiting_in("all_reduce", (path, 8, "fit")),
        },
    )
    assert explanation.cause is not Cause.UNEVEN_EVAL_BATCHES, explanation.message
    assert explanation.reason is not None and explanation.reason.text.startswith("break"), explanation
    assert explanation.site == "train.py:11", explanation


def test_a_loop_exit_names_the_test_at_its_own_line_and_the_exit_at_its_own(tmp_path: Path) -> None:
    """The `if` is quoted with the `if`'s line, not the `break`'s a line below it."""
    explanation = explain_fork(_fork(tmp_path, LOOP_EXIT, "all_reduce()", "barrier()"))
    path = str(tmp_path / "train.py")
    if_line, break_line = line_of(path, "if loss"), line_of(path, "break")
    assert f"`if loss < 0.1` (train.py:{if_line})" in explanation.message, explanation.message
    assert any(
        f"`break` at train.py:{break_line} under `if loss < 0.1` at train.py:{if_line}" in e
        for e in explanation.evidence
    ), explanation.evidence


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        ("KeyError: 'shadow'", Cause.RANK_EXCEPTION),
        ("FileNotFoundError: [Errno 2] No such file or directory: 'ann/0007.json'", Cause.RANK_EXCEPTION),
        ("PIL.UnidentifiedImageError: cannot identify image file 'x.jpg'", Cause.RANK_EXCEPTION),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", Cause.RANK_CRASHED),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", Cause.RANK_CRASHED),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", Cause.RANK_CRASHED),
        ("SystemExit: 7", Cause.RANK_CRASHED),
        (None, Cause.RANK_CRASHED),
    ],
)
def test_what_a_rank_died_of_decides_crash_or_exception(error: str | None, cause: Cause) -> None:
    from ncclcheck.explain.context import death_cause

    assert death_cause(error) is cause


@pytest.mark.parametrize(
    ("inner_test", "kind"),
    [
        ("batch['mask'].sum() == 0", "data"),  # a test of the data itself
        ("not all_finite(batch)", "data"),  # through a helper of the file that tests values
        ("self.rank != 0", "rank"),
        ("self.calls > 3", None),  # a count of its own: nothing to pass on
    ],
)
def test_a_test_on_a_sentinel_passes_on_the_test_that_returned_it(
    tmp_path: Path, inner_test: str, kind: str | None
) -> None:

    path = tmp_path / "train.py"
    path.write_text(
        "import torch\n"
        "import torch.distributed as dist\n"
        "\n"
        "def all_finite(batch):\n"
        "    return bool(torch.isfinite(batch['x']).all())\n"
        "\n"
        "class Stepper:\n"
        "    def step(self, batch):\n"
        f"        if {inner_test}:\n"
        "            return None\n"
        "        return batch['x'].sum()\n"
        "\n"
        "def fit(stepper, loader):\n"
        "    for batch in loader:\n"
        "        out = stepper.step(batch)\n"
        "        if not out:\n"
        "            continue\n"
        "        dist.all_reduce(out)\n"
    )
    inner = _where_the_sentinel_comes_from(path, 17)
    assert (inner.kind if inner else None) == kind
    if inner is not None:
        assert (inner.decided_at, inner.text) == (9, inner_test)


@pytest.mark.parametrize(
    ("test", "kind"),
    [
        ("not batch_is_finite(batch)", "data"),  # a helper of the file that tests values
        ("stopper(val_loss.item())", "other"),  # a stateful judgement of the project's: a decision
        ("self.tracker.improved(acc.item())", "other"),
        ("not math.isfinite(loss.item())", "data"),  # a library's test of the value
    ],
)
def test_what_a_condition_reads_through_the_files_own_helpers_and_objects(
    tmp_path: Path, test: str, kind: str
) -> None:
    from ncclcheck.source import reading

    path = tmp_path / "fit.py"
    path.write_text(
        "import math\n"
        "import torch\n"
        "\n"
        "def batch_is_finite(batch):\n"
        "    return bool(torch.isfinite(batch).all())\n"
        "\n"
        "class Patience:\n"
        "    def __call__(self, value):\n"
        "        return value > 1\n"
        "\n"
        "class Fit:\n"
        "    def __init__(self):\n"
        "        self.tracker = Patience()\n"
        "\n"
        "    def run(self, batch, val_loss, acc, loss):\n"
        "        stopper, seen = Patience(), 0\n"
        f"        if {test}:\n"
        "            return\n"
    )
    assert reading.condition_kind(str(path), ast.parse(test, mode="eval").body) == kind


def test_a_sentinel_a_decorator_of_the_file_returns_is_traced_into_its_wrapper(tmp_path: Path) -> None:
    """``@skip_unlabelled`` returns None before the step runs where the batch has no label:
    the caller's ``if out is None: continue`` passes on the wrapper's test of the data."""

    path = tmp_path / "train.py"
    path.write_text(
        "import functools\n"
        "import torch.distributed as dist\n"
        "\n"
        "def skip_unlabelled(step):\n"
        "    @functools.wraps(step)\n"
        "    def wrapper(batch):\n"
        "        if (batch['y'] >= 0).sum() == 0:\n"
        "            return None\n"
        "        return step(batch)\n"
        "    return wrapper\n"
        "\n"
        "@skip_unlabelled\n"
        "def step(batch):\n"
        "    return batch['y'].float().sum()\n"
        "\n"
        "def fit(loader):\n"
        "    for batch in loader:\n"
        "        out = step(batch)\n"
        "        if out is None:\n"
        "            continue\n"
        "        dist.all_reduce(out)\n"
    )
    inner = _where_the_sentinel_comes_from(path, 19)
    assert inner is not None and (inner.kind, inner.decided_at) == ("data", 7)


def _where_the_sentinel_comes_from(path: Path, line: int):  # type: ignore[no-untyped-def]
    """The test the ``continue`` of the function holding ``line`` passes on."""
    from ncclcheck.source import reading

    function = reading.enclosing_function(str(path), line)
    (guard,) = [g for g in reading.conditional_exits(str(path), function) if g.statement == "continue"]
    return reading.where_the_sentinel_comes_from(str(path), guard)
