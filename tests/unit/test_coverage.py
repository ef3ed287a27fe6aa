"""What a dry run did not run (explain/coverage.py) and the periodic actions lint reads
(lint/periodic.py), on synthetic traces and scripts: no ranks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ncclcheck.causes import Cause
from ncclcheck.evidence.traces import LoaderPass, RankTrace
from ncclcheck.explain.context import Evidence
from ncclcheck.explain.diagnose import diagnose
from ncclcheck.lint.periodic import is_periodic, periodic_actions
from ncclcheck.lint.project import Linter
from ncclcheck.model import Frame, Verdict

from .factories import call, line_of, script, trace

TRAINER = """
    import torch.distributed as dist


    def save(model, step):
        try:
            dist.barrier()
        except OSError:
            pass


    class Trainer:
        def log(self, value):
            dist.all_reduce(value)

        def fit(self, model, loader, value):
            for step, batch in enumerate(loader):
                dist.all_reduce(batch)
                if (step + 1) % self.log_every == 0:
                    self.log(value)
                if step % 20 == 0 and step > 0:
                    save(model, step)
                if step % 7 == 3:
                    print(step)  # periodic, but reaches no collective


    def main(model, loader, value):
        step = 0
        while True:
            step += 1
            if not step % 1000:
                save(model, step)
    """


@pytest.mark.parametrize(
    ("test", "periodic"),
    [
        ("step % 100 == 0", True),
        ("(i + 1) % accumulation == 0", True),
        ("0 == step % args.save_every", True),
        ("not step % interval", True),
        ("step % 100 == 0 and rank == 0", True),
        ("step % 100 != 0", False),  # fires on every step but one in N: not what a short run misses
        ("step == 100", False),
        ("loss > 3", False),
        ('"step-%d" % step == name', False),  # formatting, not a period
    ],
)
def test_a_periodic_test_is_a_remainder_compared_for_equality(test: str, periodic: bool) -> None:
    assert is_periodic(ast.parse(test, mode="eval").body) is periodic


def test_periodic_actions_are_those_in_loops_whose_bodies_reach_a_collective(tmp_path: Path) -> None:
    path = script(tmp_path, TRAINER)
    actions = periodic_actions(Linter(), Path(path))
    assert [(a.line, a.test) for a in actions] == [
        (line_of(path, "(step + 1) % self.log_every"), "(step + 1) % self.log_every == 0"),
        (line_of(path, "if step % 20 == 0"), "step % 20 == 0 and step > 0"),
        (line_of(path, "if not step % 1000"), "not step % 1000"),
    ]
    log_every = actions[0]
    assert log_every.collective.label == "dist.all_reduce"
    assert log_every.collective.chain[0].startswith("log() called at ")
    assert log_every.body == (log_every.line + 1, log_every.line + 1)


def _train_pass(rank: int, length: int | None, batches: int = 5) -> LoaderPass:
    return LoaderPass("train_loader", 0, "train", length, "DistributedSampler", True, "Shards", batches, None)


def _cut(loader_pass: LoaderPass) -> LoaderPass:
    loader_pass.budget_cut = True
    return loader_pass


def _traces(path: str, lengths: dict[int, int | None], fired_line: int | None = None) -> dict[int, RankTrace]:
    traces = {}
    for rank, length in lengths.items():
        stack = [Frame(path, fired_line, "fit")] if fired_line else []
        made = call(rank, path, line_of(path, "dist.all_reduce(batch)"), function="fit", stack=stack)
        made.phase = "train"
        traces[rank] = trace(rank, [made])
        traces[rank].script = path
        traces[rank].passes = [_cut(_train_pass(rank, length))]
    return traces


def test_a_periodic_action_that_never_fired_makes_the_verdict_partial(tmp_path: Path) -> None:
    path = script(tmp_path, TRAINER)
    report = diagnose(
        Evidence(world_size=2, traces=_traces(path, {0: 400, 1: 400}), cwd=str(tmp_path))
    ).report
    assert (report.verdict, report.exit_code, report.findings) == (Verdict.PARTIAL, 5, [])
    not_run = report.summary["not_run"]
    assert isinstance(not_run, list) and len(not_run) == 3, not_run
    assert not_run[1].startswith(
        f"`if step % 20 == 0 and step > 0` at train.py:{line_of(path, 'if step % 20')}"
    )
    assert "never fired in the dry run: it reaches dist.barrier (save() called at" in not_run[1]
    covered = report.summary["covered"]
    assert covered == [
        "train loader train_loader: 5 of 400 batches a pass ran; the same length on every rank, so every "
        "rank's pass ends at the same step"
    ]


def test_a_periodic_action_whose_body_is_on_a_recorded_call_chain_fired(tmp_path: Path) -> None:
    path = script(tmp_path, TRAINER)
    everything = [action.body[0] for action in periodic_actions(Linter(), Path(path))]
    traces = _traces(path, {0: 400, 1: 400})
    for rank in (0, 1):  # every rank fired them alike
        fired = [call(rank, path, line, function="fit", seq=n) for n, line in enumerate(everything, 1)]
        traces[rank].calls = [*traces[rank].calls, *fired]
    report = diagnose(Evidence(world_size=2, traces=traces, cwd=str(tmp_path))).report
    assert report.verdict is Verdict.ALIGNED, report.summary.get("not_run")
    assert sum("fired: its collectives ran" in line for line in report.summary["covered"]) == 3


def test_train_passes_of_different_lengths_part_at_the_pass_end_the_dry_run_cut(tmp_path: Path) -> None:
    path = script(tmp_path, TRAINER)
    traces = _traces(path, {0: 401, 1: 400})
    for rank, rank_trace in traces.items():  # a collective in every step drawn: DDP's
        step = call(rank, path, line_of(path, "dist.all_reduce(batch)"), function="fit")
        rank_trace.calls = [*rank_trace.calls, *([step] * 5)]
    report = diagnose(Evidence(world_size=2, traces=traces, cwd=str(tmp_path))).report
    assert (report.verdict, report.exit_code) == (Verdict.MISALIGNED, 1)
    (finding,) = report.findings
    assert (finding.cause, finding.severity.value) == (Cause.UNEVEN_EVAL_BATCHES, "error")
    assert "yields different numbers of batches per rank (rank 0: 401, rank 1: 400)" in finding.message


def test_a_train_pass_of_unknown_length_cut_by_the_budget_is_not_vouched_for(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        import torch.distributed as dist


        def fit(loader):
            for batch in loader:
                dist.all_reduce(batch)
        """,
    )
    report = diagnose(
        Evidence(world_size=2, traces=_traces(path, {0: None, 1: None}), cwd=str(tmp_path))
    ).report
    assert report.verdict is Verdict.PARTIAL
    (gap,) = report.summary["not_run"]
    assert "its length is unknown (an IterableDataset)" in gap


RANK_ZERO_EVAL_EVERY_N = """
    import torch.distributed as dist


    def evaluate(model, loader):
        total = model.zeros()
        dist.all_reduce(total)
        return total


    def fit(model, loader, rank):
        for step, batch in enumerate(loader):
            dist.all_reduce(batch)
            if step % 500 == 0 and rank == 0:
                evaluate(model, loader)
    """


def test_a_periodic_action_that_never_fired_is_still_an_error_where_the_source_decides(
    tmp_path: Path,
) -> None:
    """Only rank 0 evaluates every 500 steps and the evaluation all-reduces: the dry run
    never got there, but the rank test decides without running it."""
    path = script(tmp_path, RANK_ZERO_EVAL_EVERY_N)
    report = diagnose(
        Evidence(world_size=2, traces=_traces(path, {0: 400, 1: 400}), cwd=str(tmp_path))
    ).report
    assert (report.verdict, report.exit_code) == (Verdict.MISALIGNED, 1)
    (finding,) = report.findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    assert finding.site.endswith(f"train.py:{line_of(path, 'dist.all_reduce(total)')}")
    assert finding.fix  # the playbook's, as preflight gives every finding
    assert finding.evidence[-1].startswith("the dry run never ran it (`if step % 500 == 0 and rank == 0` at ")
    assert report.summary["not_run"][0].startswith("`if step % 500 == 0 and rank == 0`")
