"""The pure analysis code on synthetic traces: alignment, source reading, diagnosis."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ncclcheck.errors import InputError
from ncclcheck.evidence.align import Mismatch, compare, divergences
from ncclcheck.evidence.traces import (
    CallWindow,
    Caught,
    RankEnding,
    RankTrace,
    divergences_of,
    load_rank_trace,
    load_traces,
)
from ncclcheck.explain.context import Evidence
from ncclcheck.explain.diagnose import diagnose
from ncclcheck.model import CollectiveCall, Finding, Frame, Report
from ncclcheck.render.lanes import build_lanes
from ncclcheck.source import reading


def diagnose_report(evidence: Evidence) -> Report:
    return diagnose(evidence).report


def stalled_report(
    rank0: list[CollectiveCall], rank1: list[CollectiveCall], cwd: Path | None = None
) -> Report:
    """The report on two ranks that made these calls and then went quiet."""
    traces = {0: trace(0, rank0), 1: trace(1, rank1)}
    if cwd is None:
        return diagnose_report(Evidence(traces=traces, world_size=2, stalled=True))
    return diagnose_report(Evidence(traces=traces, world_size=2, stalled=True, cwd=str(cwd)))


def call(
    rank: int,
    seq: int,
    op: str = "all_reduce",
    line: int = 10,
    shape: int = 2,
    group: str = "0",
    batch: int | None = None,
    time: float = 0.0,
    path: str = "train.py",
) -> CollectiveCall:
    site = Frame(path, line, "main")
    return CollectiveCall(
        rank=rank,
        seq=seq,
        op=op,
        group=group,
        group_ranks=[0, 1],
        shapes=[[shape]],
        dtypes=["float32"],
        site=site,
        user_stack=[site],
        time=time or seq,
        position=None if batch is None else {"loader": "val_loader", "batch": batch, "role": "eval"},
    )


def test_identical_histories_do_not_diverge() -> None:
    history = {r: [call(r, 0), call(r, 1, op="barrier", line=12)] for r in (0, 1)}
    assert divergences(history) == []


@pytest.mark.parametrize(
    ("one", "two", "kind"),
    [
        (call(0, 0), None, Mismatch.MISSING),
        (call(0, 0), call(1, 0, op="barrier"), Mismatch.OP),
        (call(0, 0), call(1, 0, line=99), Mismatch.SITE),
        (call(0, 0, batch=3), call(1, 0, batch=4), Mismatch.STEP),
        (call(0, 0, shape=12), call(1, 0, shape=7), Mismatch.SHAPE),
    ],
)
def test_compare_names_the_kind_of_mismatch(one, two, kind) -> None:  # type: ignore[no-untyped-def]
    assert compare({0: one, 1: two}) is kind


def test_a_join_stand_in_pairs_with_ddps_calls_but_not_with_the_users_own() -> None:
    from dataclasses import replace

    ddp_bucket = replace(call(0, 0, line=20), issuer="torch.nn.parallel.distributed:DDP._hook")
    stand_in = replace(call(1, 0, line=18), shadow=True, issuer="torch.distributed.algorithms.join:x")
    assert compare({0: ddp_bucket, 1: stand_in}) is None
    assert compare({0: replace(ddp_bucket, shapes=[[5]]), 1: stand_in}) is Mismatch.SHAPE
    users_own = call(0, 0, line=25)  # issuer None: the user's code called it
    assert compare({0: users_own, 1: stand_in}) is Mismatch.SITE


def test_barriers_at_other_lines_meet_when_the_histories_agree_again_after_them() -> None:
    # torch_distributed_zero_first: the others wait at line 18 while rank 0 works, then
    # rank 0 releases them from line 23; twice in a row, then training together
    zero_first = {
        0: [call(0, 0, op="barrier", line=23), call(0, 1, op="barrier", line=23), call(0, 2, line=40)],
        1: [call(1, 0, op="barrier", line=18), call(1, 1, op="barrier", line=18), call(1, 2, line=40)],
    }
    assert divergences(zero_first) == []
    # a barrier rank 0 alone makes (line 23) pairs with the next barrier of rank 1 (line
    # 50), and the histories part after it: the first barrier is the divergence
    rank0_only = {
        0: [call(0, 0, op="barrier", line=23), call(0, 1, op="barrier", line=50), call(0, 2, line=40)],
        1: [call(1, 0, op="barrier", line=50), call(1, 1, line=40)],
    }
    (found,) = divergences(rank0_only)
    assert (found.seq, found.kind) == (0, Mismatch.SITE)
    # library barriers at one line of the user's (a Lightning fit) agree by line alone:
    # the issuer tells rank 0's extra barrier apart, and it is still the divergence
    from dataclasses import replace

    def barrier(rank: int, seq: int, line: int, issuer: str) -> CollectiveCall:
        return replace(call(rank, seq, op="barrier", line=line), issuer=issuer)

    strategy, sync = "lightning:DDPStrategy.barrier", "lightning:_sync_ddp"
    extra_barrier = {
        0: [
            barrier(0, 0, 23, strategy),
            barrier(0, 1, 59, strategy),
            barrier(0, 2, 59, sync),
            call(0, 3, line=59),
        ],
        1: [barrier(1, 0, 59, strategy), barrier(1, 1, 59, sync), call(1, 2, line=59), call(1, 3, line=59)],
    }
    (found,) = divergences(extra_barrier)
    assert (found.seq, found.kind) == (0, Mismatch.SITE)


def test_a_root_and_the_others_may_broadcast_from_their_own_lines_but_not_all_reduce() -> None:
    def history(rank: int, op: str, line: int) -> list[CollectiveCall]:
        return [call(rank, 0, op=op, line=line), call(rank, 1, line=40)]

    assert divergences({0: history(0, "broadcast", 14), 1: history(1, "broadcast", 19)}) == []
    # an all_reduce of one value on rank 0 and another on rank 1 mixes the two
    (found,) = divergences({0: history(0, "all_reduce", 14), 1: history(1, "all_reduce", 19)})
    assert found.kind is Mismatch.SITE
    # a broadcast of another shape is no pairing by design
    other_shape = {0: history(0, "broadcast", 14), 1: [call(1, 0, op="broadcast", line=19, shape=3)]}
    assert divergences(other_shape)[0].seq == 0


def test_first_divergence_is_found_by_site_even_when_ops_and_shapes_pair() -> None:
    # rank 1 skips the in-loop all_reduce once; its post-loop all_reduce (same op,
    # same shape) would pair silently with rank 0's last in-loop one.
    rank0 = [call(0, 0, line=10), call(0, 1, line=10), call(0, 2, line=20)]
    rank1 = [call(1, 0, line=10), call(1, 1, line=20)]
    (found,) = divergences({0: rank0, 1: rank1})
    assert (found.seq, found.kind) == (1, Mismatch.SITE)
    assert found.majority() == ([0], [1])


def test_members_without_traces_are_not_held_against_the_others() -> None:
    history = {0: [call(0, 0)]}  # rank 1's node sent no traces
    assert divergences(history) == []


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_condition_kinds(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        import torch.distributed as dist

        def main(rank, loss, accelerator, best):
            is_main = rank == 0
            if is_main:
                pass
            if dist.get_rank() != 0:
                pass
            if accelerator.is_main_process:
                pass
            if not torch.isfinite(loss):
                pass
            if loss.item() < best:
                pass
    """,
    )
    kinds = [guard.kind for line in (7, 9, 11, 13, 15) for guard in reading.guards_of(path, line)]
    assert kinds == ["rank", "rank", "rank", "data", "data"]


def test_early_exits_and_loops(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        def save(rank):
            if rank != 0:
                return
            write()
            barrier()

        def train(loader, target):
            for epoch in range(3):
                for batch in loader:
                    step(batch)
                if evaluate() < target:
                    break
            barrier()

        def evaluate_all(loader):
            for batch in loader:
                try:
                    reduce(batch)
                except ValueError:
                    log()
    """,
    )
    function = reading.enclosing_function(path, 6)
    (exit_,) = reading.conditional_exits(path, function, 6)
    assert (exit_.statement, exit_.kind, exit_.line) == ("return", "rank", 4)
    loops = reading.enclosing_loops(path, 11)
    assert [loop.lineno for loop in loops] == [10, 9]
    (brk,) = reading.conditional_exits(path, loops[1])
    assert (brk.statement, brk.kind, brk.text) == ("break", "other", "evaluate() < target")
    assert reading.swallowing_try(path, 19) is not None
    assert reading.swallowing_try(path, 11) is None


def trace(rank: int, calls: list[CollectiveCall], exit_: dict | None = None) -> RankTrace:  # type: ignore[type-arg]
    return RankTrace(
        rank=rank,
        host="node",
        pid=100 + rank,
        world_size=2,
        initialised=True,
        calls=calls,
        exit=RankEnding.of(exit_) if exit_ else None,
    )


def test_diagnosis_of_a_rank_branch_from_synthetic_traces(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        def main(rank):
            if rank == 0:
                all_reduce()
            barrier()
    """,
    )
    rank0 = [call(0, 0, line=4, path=path)]
    rank1 = [call(1, 0, op="barrier", line=5, path=path)]
    report = stalled_report(rank0, rank1, tmp_path)
    finding = report.findings[0]
    assert (finding.cause, finding.site, finding.ranks, finding.absent_ranks) == (
        "rank-conditional-collective",
        "train.py:4",
        [0],
        [1],
    )
    assert report.verdict.value == "hang"


def test_diagnosis_of_an_order_cycle_across_groups() -> None:
    rank0 = [call(0, 0, group="0", line=7)]
    rank1 = [call(1, 0, group="1", line=7)]
    report = stalled_report(rank0, rank1)
    assert report.findings[0].cause == "collective-order-mismatch"


def test_a_cycle_made_by_one_ranks_extra_call_on_a_side_group_is_the_rank_test_that_sent_it(
    tmp_path: Path,
) -> None:
    """Rank 0 alone saves, and its save all-reduces on a side group while rank 1 went on to
    the default group's next call: each waits for the other in another group, a cycle, but
    no order differs; the rank test on rank 0's chain decided (fresh w01, a Trainer's
    `if self.is_main: self.save_checkpoint()`). The same cycle with no rank test stays an
    order mismatch."""
    path = write(
        tmp_path,
        """
        def main(rank, side):
            if rank == 0:
                all_reduce(group=side)
            all_reduce()
    """,
    )
    rank0 = [call(0, 0, group="1", line=4, path=path)]
    rank1 = [call(1, 0, group="0", line=5, path=path)]
    report = stalled_report(rank0, rank1, tmp_path)
    finding = report.findings[0]
    assert (finding.cause, finding.site, finding.ranks, finding.absent_ranks) == (
        "rank-conditional-collective",
        "train.py:4",
        [0],
        [1],
    )
    assert "each side waits for the other in a different process group: a cycle" in finding.evidence
    (tmp_path / "plain").mkdir()  # another file: the source reading caches by path
    unguarded = write(
        tmp_path / "plain",
        """
        def main(rank, side):
            all_reduce(group=side)
            all_reduce()
    """,
    )
    rank0 = [call(0, 0, group="1", line=3, path=unguarded)]
    rank1 = [call(1, 0, group="0", line=4, path=unguarded)]
    report = stalled_report(rank0, rank1, tmp_path / "plain")
    assert report.findings[0].cause == "collective-order-mismatch"


def test_a_step_skipped_by_a_handler_that_continues_before_the_call_is_a_rank_exception(
    tmp_path: Path,
) -> None:
    """Fresh w05: `try: batch = encode(lines) / except (ValueError, KeyError): continue`
    before the step, a record in an old format on one rank: that rank's DDP all-reduces
    pair with the next batch's of the others. The swallowed error decided, not the data:
    rank-exception at the handler, with what the rank caught there; where the loop also
    exits under a test, what the rank caught says which of the two skipped the step."""
    path = write(
        tmp_path,
        """
        def train(loader, step):
            for lines in loader:
                try:
                    batch = encode(lines)
                except (ValueError, KeyError):
                    continue
                if batch is None:
                    continue
                step(batch)
    """,
    )
    handler, call_line = 6, 10

    def skipped(caught: list[Caught]) -> Finding:
        rank0 = [call(0, 0, batch=4, line=call_line, path=path)]
        rank1 = [call(1, 0, batch=3, line=call_line, path=path)]
        traces = {0: trace(0, rank0), 1: trace(1, rank1)}
        traces[0].caught = caught
        evidence = Evidence(traces=traces, world_size=2, stalled=True, cwd=str(tmp_path))
        return diagnose_report(evidence).findings[0]

    raised = Frame(path, 5, "train")
    finding = skipped([Caught(Frame(path, handler, "train"), "ValueError: not enough values", raised)])
    assert (finding.cause, finding.ranks, finding.absent_ranks) == ("rank-exception", [1], [0])
    assert f"the handler `except (ValueError, KeyError)` at train.py:{handler} swallows" in "\n".join(
        finding.evidence
    )
    assert any(line.startswith("rank 0 caught ValueError: not enough values") for line in finding.evidence)
    # nothing caught: the test's `continue` skipped it, as far as the run tells
    assert skipped([]).cause == "unsynchronized-decision"


def test_a_dry_run_stopped_before_its_budget_is_incomplete_never_aligned() -> None:
    """Stopped from outside (a CI job's timeout) with nothing wrong so far: its own verdict
    and exit code, and what it did check, never "aligned" (exit 0) for a pipeline to pass."""
    calls = {rank: [call(rank, seq) for seq in range(3)] for rank in (0, 1)}
    why = "the dry run was stopped by a signal to preflight (Ctrl-C, SIGTERM)"
    report = diagnose_report(
        Evidence(traces={r: trace(r, c) for r, c in calls.items()}, world_size=2, incomplete=why)
    )
    assert (report.verdict.value, report.exit_code, report.findings) == ("incomplete", 4, [])
    assert report.summary["incomplete"].startswith(f"incomplete: {why} before its budget was spent")
    assert "checked 3 collective(s) per rank" in report.summary["incomplete"]
    whole = diagnose_report(Evidence(traces={r: trace(r, c) for r, c in calls.items()}, world_size=2))
    assert (whole.verdict.value, whole.exit_code, "incomplete" in whole.summary) == ("aligned", 0, False)


def test_a_rank_behind_when_the_run_was_stopped_is_not_absent() -> None:
    """Rank 0 still writing a checkpoint when CI's timeout came, rank 1 a call ahead: not a
    divergence (the straggler would have caught up), while a rank that ended is absent."""
    rank0 = [call(0, seq) for seq in range(2)]
    rank1 = [call(1, seq) for seq in range(3)]
    report = diagnose_report(
        Evidence(traces={0: trace(0, rank0), 1: trace(1, rank1)}, world_size=2, incomplete="stopped")
    )
    assert (report.verdict.value, report.findings) == ("incomplete", [])
    assert "checked 2 to 3 collective(s) per rank" in report.summary["incomplete"]
    ended = trace(0, rank0, exit_={"how": "returned", "code": 0})
    report = diagnose_report(
        Evidence(traces={0: ended, 1: trace(1, rank1)}, world_size=2, incomplete="stopped")
    )
    assert report.verdict.value == "misaligned"


def test_an_incomplete_run_that_already_diverged_is_misaligned() -> None:
    """What it saw before the stop stands: the divergence is the verdict, exit 1."""
    rank0 = [call(0, 0), call(0, 1, line=20)]
    rank1 = [call(1, 0), call(1, 1, op="barrier", line=21)]
    report = diagnose_report(
        Evidence(traces={0: trace(0, rank0), 1: trace(1, rank1)}, world_size=2, incomplete="stopped")
    )
    assert (report.verdict.value, report.exit_code) == ("misaligned", 1)
    assert report.summary["incomplete"] == "stopped: the findings are what it saw until then"


def test_diagnosis_of_a_dead_rank() -> None:
    rank0 = [call(0, 0), call(0, 1, line=30)]
    rank1 = [call(1, 0)]
    report = diagnose_report(
        Evidence(
            traces={0: trace(0, rank0), 1: trace(1, rank1)},
            world_size=2,
            rank_exits={1: -9, 0: -15},
            first_failure=1,
        )
    )
    finding = report.findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == ("rank-crashed", [0], [1])
    assert any("SIGKILL" in line for line in finding.evidence)
    assert report.verdict.value == "crash"


STEP_SKIPPED_ON_EMPTY = """\
import lightning.pytorch as pl

class Tagger(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        tokens, mask = batch
        if mask.sum() == 0:
            return None
        return self.net(tokens).sum()
"""


@pytest.mark.parametrize(
    ("when", "also_on_rank_0", "cause"),
    [
        ("after", False, "data-dependent-branch"),
        # taken long before its last collective: not what it died of
        ("before", False, "rank-crashed"),
        # the survivor took it that way too: no sign it sent rank 1 anywhere else
        ("after", True, "rank-crashed"),
    ],
    ids=["just-before-dying", "long-before", "taken-by-both"],
)
def test_a_rank_that_dies_right_after_a_decision_no_other_rank_took_is_named_at_that_test(
    tmp_path: Path, when: str, also_on_rank_0: bool, cause: str
) -> None:
    from ncclcheck.evidence.traces import Decided

    script = tmp_path / "train.py"
    script.write_text(STEP_SKIPPED_ON_EMPTY)
    test = Frame(str(script), 6, "Tagger.training_step")
    rank0 = [call(0, 0, time=1.0, path=str(script)), call(0, 1, time=3.0, path=str(script))]
    rank1 = [call(1, 0, time=1.0, path=str(script))]
    traces = {0: trace(0, rank0), 1: trace(1, rank1, exit_=None)}
    traces[1].decided.append(Decided(test, True, False, 2.0 if when == "after" else 0.5))
    if also_on_rank_0:
        traces[0].decided.append(Decided(test, True, False, 2.0))
    report = diagnose_report(
        Evidence(traces=traces, world_size=2, rank_exits={1: 1, 0: -15}, first_failure=1, cwd=str(tmp_path))
    )
    finding = report.findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (cause, [0], [1]), finding
    if cause == "data-dependent-branch":
        assert finding.site == "train.py:6"
        assert finding.message.startswith("rank 1 took `if mask.sum() == 0` at train.py:6 true, which no")
        assert any(line.startswith("lint's reading of it: ") for line in finding.evidence)


def test_a_rank_that_dies_before_any_collective_is_sited_where_its_error_left(tmp_path: Path) -> None:
    # One rank more than there are GPUs: set_device fails on rank 1 right after
    # init_process_group, and torchrun stops rank 0 before its first collective.
    script = str(tmp_path / "train.py")
    error = (
        "AcceleratorError: CUDA error: invalid device ordinal\n"
        "GPU device may be out of range, do you have enough GPUs?\n"
        f" at {script}:12 in main"
    )
    ended = {"how": "exception", "code": 1, "error": error, "site": [script, 12, "main"]}
    report = diagnose_report(
        Evidence(
            traces={0: trace(0, []), 1: trace(1, [], exit_=ended)},
            world_size=2,
            rank_exits={1: 1, 0: -15},
            first_failure=1,
            cwd=str(tmp_path),
        )
    )
    finding = report.findings[0]
    assert (finding.cause, finding.site, finding.absent_ranks) == ("rank-crashed", "train.py:12", [1])
    assert finding.message == "rank 1 died: AcceleratorError: CUDA error: invalid device ordinal"
    assert "rank 1 ended: AcceleratorError: CUDA error: invalid device ordinal at train.py:12 in main" in (
        finding.evidence
    )
    assert report.summary["backend"] is None  # these traces never say which backend


def test_call_lines_take_their_fields_from_the_site_line_they_name(tmp_path: Path) -> None:
    hello = json.dumps({"t": "hello", "rank": 0, "world_size": 2, "pid": 1, "host": "h"})
    site = (
        '{"t":"site","id":%d,"op":"%s","group":"0","group_ranks":[0,1],"shapes":[[2]],'
        '"dtypes":["float32"],"device":"cpu","async":false,"phase":"%s","src":"python",'
        '"stack":[["train.py",5,"main"],["train.py",%d,"step"]]}'
    )
    lines = [
        hello,
        site % (0, "all_reduce", "train", 12),
        '{"t":"call","n":1,"seq":0,"ns":1500000000,"site":0}',
        site % (1, "barrier", "eval", 30),
        '{"t":"call","n":2,"seq":1,"ns":2500000000,"pos":{"loader":"val","pass":1,"batch":3,"role":"eval"},'
        '"site":1}',
        '{"t":"call","n":3,"seq":2,"ns":3500000000,"site":0}',
    ]
    path = tmp_path / "rank-00000.jsonl"
    path.write_text("\n".join(lines) + "\n")
    calls = load_rank_trace(path).calls
    assert [(c.n, c.seq, c.op, c.phase, c.site) for c in calls] == [
        (1, 0, "all_reduce", "train", Frame("train.py", 12, "step")),
        (2, 1, "barrier", "eval", Frame("train.py", 30, "step")),
        (3, 2, "all_reduce", "train", Frame("train.py", 12, "step")),
    ]
    assert [c.time for c in calls] == [1.5, 2.5, 3.5]
    assert calls[1].position == {"loader": "val", "pass": 1, "batch": 3, "role": "eval"}
    assert calls[0].position is None and calls[2].position is None
    assert calls[1].user_stack == [Frame("train.py", 5, "main"), Frame("train.py", 30, "step")]
    # a call that names a site the file never wrote
    path.write_text("\n".join([*lines, '{"t":"call","n":4,"seq":3,"ns":1,"site":7}']) + "\n")
    with pytest.raises(InputError, match=r"rank-00000\.jsonl:7: malformed 'call' trace line"):
        load_rank_trace(path)


def test_trace_reader_skips_a_truncated_last_line_and_rejects_garbage(tmp_path: Path) -> None:
    hello = json.dumps({"t": "hello", "rank": 0, "world_size": 2, "pid": 1, "host": "h"})
    path = tmp_path / "rank-00000.jsonl"
    path.write_text(hello + "\n" + '{"t":"call","n":1,"op":"all_red')
    assert load_rank_trace(path).calls == []
    path.write_text(hello + "\nnot json\n" + hello + "\n")
    with pytest.raises(InputError, match=r"rank-00000\.jsonl:2: not a trace line"):
        load_rank_trace(path)


def test_calls_read_through_shared_templates_come_back_field_for_field(tmp_path: Path) -> None:
    """Trace lines of two call sites in a loop (templates shared), a p2p call and one
    line in the slow form: read back field for field, and aligned like any calls."""
    hello = json.dumps({"t": "hello", "rank": 0, "world_size": 2, "pid": 1, "host": "h"})
    static = ',"op":"all_reduce","group":"0","group_ranks":[0,1],"shapes":[[4]],"dtypes":["float32"],'
    lines = [hello]
    for n in range(1, 7):
        site = 10 if n % 2 else 20
        position = f',"pos":{{"loader":"val","pass":0,"batch":{n},"role":"eval"}}' if n > 2 else ""
        lines.append(
            f'{{"t":"call","n":{n},"seq":{n - 1},"time":{n}.5{position}{static}'
            f'"device":"cpu","async":false,"phase":"eval","src":"python","stack":[["t.py",{site},"f"]]}}'
        )
    lines.append(
        json.dumps(
            {
                "t": "call",
                "n": 7,
                "seq": 0,
                "time": 7.5,
                "op": "send",
                "group": "0",
                "group_ranks": [0, 1],
                "peer": 1,
                "phase": "eval",
                "stack": [["t.py", 30, "g"]],
            }
        )
    )
    path = tmp_path / "rank-00000.jsonl"
    path.write_text("\n".join(lines) + "\n")
    history = load_rank_trace(path).calls
    assert len(history) == 7
    assert [c.n for c in history] == [1, 2, 3, 4, 5, 6, 7]
    assert [c.site_text for c in history[:3]] == ["t.py:10", "t.py:20", "t.py:10"]
    assert history[-1].op == "send" and history[-1].peer == 1
    assert history[0].position is None and history[4].position == {
        "loader": "val",
        "pass": 0,
        "batch": 5,
        "role": "eval",
    }
    assert (history[3].seq, history[3].time, history[3].shapes) == (3, 4.5, [[4]])
    other = [*history[:5], call(1, 5, line=99)]
    found = divergences({0: history, 1: other})
    assert [(d.group, d.seq, d.kind) for d in found] == [("0", 5, Mismatch.SITE)]
    assert found[0].calls[0] is history[5]


def _trace_file(folder: Path, rank: int, calls: list[tuple[str, str, int]]) -> None:
    """A trace in the recorder's format: one line per (op, group, line) call."""
    hello = json.dumps({"t": "hello", "rank": rank, "world_size": 2, "pid": rank, "host": "h"})
    lines, seqs = [hello], dict[str, int]()
    for n, (op, group, line) in enumerate(calls, 1):
        seq = seqs.get(group, 0)
        seqs[group] = seq + 1
        lines.append(
            f'{{"t":"call","n":{n},"seq":{seq},"time":{n}.0,"op":"{op}","group":"{group}",'
            f'"group_ranks":[0,1],"shapes":[[4]],"dtypes":["float32"],"device":"cpu","async":false,'
            f'"phase":"train","src":"python","stack":[["t.py",{line},"f"]]}}'
        )
    (folder / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("case", ["site", "missing", "aligned"])
def test_streamed_alignment_finds_what_whole_histories_find(tmp_path: Path, case: str) -> None:
    """load_traces reads the files in turns and aligns as it goes, holding windows of
    the histories; its divergences are those of divergences() over whole histories,
    and the calls around the divergence are still there for the lanes."""
    loop = [("all_reduce", "0", 10), ("send", "0", 11), ("broadcast", "1", 12)] * 2000
    rank0 = [*loop, ("all_reduce", "0", 20), *loop[:300]]
    rank1 = {
        "site": [*loop, ("all_reduce", "0", 21), *loop[:300]],
        "missing": loop,
        "aligned": [*loop, ("all_reduce", "0", 20), *loop[:300]],
    }[case]
    _trace_file(tmp_path, 0, rank0)
    _trace_file(tmp_path, 1, rank1)
    streamed = load_traces(tmp_path)
    whole = {rank: load_rank_trace(tmp_path / f"rank-{rank:05d}.jsonl") for rank in (0, 1)}
    expected = divergences({rank: trace.calls for rank, trace in whole.items()})
    found = divergences_of(streamed)
    assert [(d.group, d.seq, d.kind, d.calls) for d in found] == [
        (d.group, d.seq, d.kind, d.calls) for d in expected
    ]
    # rank 1 stopping early misses calls on both groups
    assert {"site": [Mismatch.SITE], "missing": [Mismatch.MISSING] * 2, "aligned": []}[case] == [
        d.kind for d in found
    ]
    assert [t.collectives for t in streamed.values()] == [len(rank0), len(rank1)]
    assert streamed[0].calls_per_phase() == {"train": len(rank0)}
    # bounded: the recent calls and a window around each divergence, not the 6000 calls
    bound = CallWindow.RECENT + CallWindow.MAX_WINDOWS * (CallWindow.BEFORE + CallWindow.AFTER + 1)
    assert all(len(t.calls) <= bound for t in streamed.values())
    if found:
        marked = found[0].calls[0]
        assert marked is not None
        held = [c.n for c in streamed[0].calls]
        assert all(n in held for n in range(marked.n - CallWindow.BEFORE, marked.n + CallWindow.AFTER + 1))
        lanes = build_lanes(streamed)
        assert [c.divergent for c in lanes.lanes[0].calls].count(True) == 1


# -- Flight Recorder dumps -----------------------------------------------------------------


def _fr_dump(entries: list[dict]) -> str:  # type: ignore[type-arg]
    return json.dumps({"version": "2.10", "entries": entries})


def _entry(seq: int, op: str, state: str = "scheduled") -> dict:  # type: ignore[type-arg]
    return {
        "collective_seq_id": seq,
        "profiling_name": op,
        "state": state,
        "process_group": ["0", "default_pg"],
        "is_p2p": False,
    }


def test_flight_recorder_dumps_give_the_last_call_per_group_and_the_disagreement(tmp_path: Path) -> None:
    from ncclcheck.evidence import flight_recorder

    (tmp_path / "fr_0").write_text(
        _fr_dump([_entry(3, "nccl:all_reduce", "completed"), _entry(4, "nccl:all_reduce")])
    )
    (tmp_path / "fr_1").write_text(
        _fr_dump([_entry(3, "nccl:all_reduce", "completed"), _entry(4, "nccl:barrier")])
    )
    env = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}
    dumps = {rank: flight_recorder.read_dump(flight_recorder.dump_path(env, rank) or "") for rank in (0, 1)}
    assert dumps[1]["last"]["0 (default_pg)"] == {
        "group": "0 (default_pg)",
        "seq": 4,
        "op": "nccl:barrier",
        "state": "scheduled",
    }
    assert flight_recorder.disagreement(dumps) == (
        "0 (default_pg)",
        {"nccl:all_reduce": [0], "nccl:barrier": [1]},
    )
    assert flight_recorder.evidence(dumps)[-1].startswith("Flight Recorder: the ranks disagree on group 0")


def test_flight_recorder_is_off_without_its_buffer_and_pickles_are_never_unpickled(tmp_path: Path) -> None:
    import pickle

    from ncclcheck.evidence import flight_recorder

    assert flight_recorder.dump_path({}, 0) is None
    assert flight_recorder.dump_path({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}, 3) == "/tmp/nccl_trace_rank_3"
    marker = tmp_path / "unpickled"

    class Trap:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(marker), "w"))

    (tmp_path / "fr_0").write_bytes(pickle.dumps(Trap()))
    dump = flight_recorder.read_dump(str(tmp_path / "fr_0"))
    assert dump["format"] == "pickle" and "fr_trace" in dump["note"]
    assert not marker.exists()
    assert flight_recorder.read_dump(str(tmp_path / "missing")) == {}


def _write_rank(folder: Path, rank: int, calls: list[tuple[str, int]], exited: bool = False) -> None:
    """A trace file of ``calls`` (op, line) on the default group of 2 ranks."""
    lines = [json.dumps({"t": "hello", "rank": rank, "world_size": 2, "pid": 10 + rank, "host": "h"})]
    for n, (op, line) in enumerate(calls):
        record = {"t": "call", "n": n + 1, "seq": n, "time": n + 0.5, "op": op, "group": "0"}
        record.update({"group_ranks": [0, 1], "shapes": [[2]], "dtypes": ["float32"]})
        lines.append(json.dumps({**record, "stack": [["train.py", line, "main"]]}))
    if exited:
        lines.append(json.dumps({"t": "exit", "how": "returned", "code": 0, "time": 9.0}))
    (folder / f"rank-{rank:05d}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("rank1_calls", "rank1_exited", "expected"),
    [
        ([("all_reduce", 5)], False, None),  # only behind: a straggler, not a divergence
        ([("all_reduce", 5), ("barrier", 9)], False, Mismatch.OP),  # rank 0 all_reduces at 7
        ([("all_reduce", 5)], True, Mismatch.MISSING),  # it left: it will never make the call
    ],
)
def test_live_traces_tell_ranks_that_parted_from_ranks_that_are_behind(
    tmp_path: Path, rank1_calls: list[tuple[str, int]], rank1_exited: bool, expected: Mismatch | None
) -> None:
    _write_rank(tmp_path, 0, [("all_reduce", 5), ("all_reduce", 7)])
    _write_rank(tmp_path, 1, rank1_calls, exited=rank1_exited)
    found = load_traces(tmp_path, live=True).divergences
    assert [d.kind for d in found or []] == ([expected] if expected else [])
    # read as a finished run, a rank behind is missing its call
    assert [d.kind for d in load_traces(tmp_path).divergences or []] == [expected or Mismatch.MISSING]


# -- whose code a frame is ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "user"),
    [
        ("/home/me/project/train.py", True),
        ("/home/me/project/metrics/loss.py", True),
        # a virtualenv inside the project: its packages are not the user's code
        ("/home/me/project/.venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", False),
        ("/usr/lib/python3.11/runpy.py", False),
        # a script kept inside site-packages (a package's own example) is the user's
        ("/opt/py/site-packages/somepkg/examples/train.py", True),
        ("/opt/py/site-packages/torch/distributed/distributed_c10d.py", False),
        ("/home/me/elsewhere.py", True),
    ],
)
def test_the_deepest_root_decides_whose_code_a_file_is(
    monkeypatch: pytest.MonkeyPatch, path: str, user: bool
) -> None:
    from ncclcheck import frames

    monkeypatch.setattr(
        frames,
        "_ROOTS",
        (
            "/home/me/project/.venv/lib/python3.11/site-packages/",
            "/opt/py/site-packages/",
            "/usr/lib/python3.11/",
        ),
    )
    monkeypatch.setattr(
        frames, "_USER_ROOTS", ("/home/me/project/", "/opt/py/site-packages/somepkg/examples/")
    )
    monkeypatch.setattr(frames.os.path, "realpath", lambda p: p)
    assert frames.is_user_file(path) is user


@pytest.mark.parametrize(
    "issuer",
    [
        "torch.nn.modules._functions:SyncBatchNorm.forward",  # PyTorch's, on GPUs
        "torch.nn.modules._functions:forward",  # Python 3.10 records no class name
        "ncclcheck.record.cpu_syncbn:CpuSyncBatchNormFunction.forward",  # preflight --cpu
    ],
)
def test_a_collective_syncbatchnorm_issued_is_named_and_advised(issuer: str) -> None:
    from ncclcheck.communicates import issued_at
    from ncclcheck.wording import issuer_advice, op_text

    call = CollectiveCall(rank=0, seq=3, op="all_gather", group="0", group_ranks=[0, 1], issuer=issuer)
    assert op_text(call) == "all_gather (SyncBatchNorm's batch statistics, in training mode)"
    assert issuer_advice(call)[0].startswith("SyncBatchNorm synchronises its statistics")
    # the user's own all_gather, and library code not in the table, stay plain
    assert (
        op_text(CollectiveCall(rank=0, seq=3, op="all_gather", group="0", group_ranks=[0, 1])) == "all_gather"
    )
    other = CollectiveCall(
        rank=0, seq=3, op="all_gather", group="0", group_ranks=[0, 1], issuer="torchmetrics.x:f"
    )
    assert (op_text(other), issuer_advice(other)) == ("all_gather", [])
    # doctor's view of the same frame in a py-spy dump: a path and "Class.method"
    module, _, qualname = issuer.partition(":")
    path = f"/venv/lib/python3.11/site-packages/{module.replace('.', '/')}.py"
    assert issued_at(path, qualname) is not None
    assert issued_at("/venv/lib/python3.11/site-packages/torch/nn/modules/batchnorm.py", qualname) is None


def test_reductions_a_framework_runs_for_different_names_are_a_mismatch() -> None:
    from ncclcheck.model import Deferred

    def reduction(rank: int, name: str) -> CollectiveCall:
        request = f"self.log({name!r}, sync_dist=True)"
        return CollectiveCall(
            rank=rank,
            seq=4,
            op="all_reduce",
            group="0",
            group_ranks=[0, 1],
            shapes=[[]],
            dtypes=["float32"],
            site=Frame("model.py", 38, "validation_step"),
            later=Deferred("Lightning", request, None),
        )

    assert compare({0: reduction(0, "val_loss"), 1: reduction(1, "val_loss")}) is None
    assert compare({0: reduction(0, "val_loss_neg"), 1: reduction(1, "val_loss_pos")}) is Mismatch.REQUEST


def test_statements_after_a_stop_skip_what_ran_in_earlier_passes_and_what_waits_for_nothing(
    tmp_path: Path,
) -> None:
    from ncclcheck.source.reading import statements_after

    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """\
            def main(loader, epochs):
                for epoch in range(epochs):
                    for batch in loader:
                        step(batch)
                    evaluate()
                try:
                    save()
                    barrier()
                finally:
                    cleanup_files()
                print("done")
                return

            def fit():
                main(loader, 3)
                report()
            """
        )
    )
    after, in_loop = statements_after(str(script), 4)  # in step(), in the epoch loop
    # evaluate() ran in the earlier epochs; the finally runs as the stop unwinds
    assert [stmt.lineno for stmt in after] == [6] and in_loop
    after, in_loop = statements_after(str(script), 7)  # stopped inside save()
    assert [stmt.lineno for stmt in after] == [8] and not in_loop
    after, in_loop = statements_after(str(script), 15)  # the caller's frame: no loop there
    assert [stmt.lineno for stmt in after] == [16] and not in_loop


def test_ddps_gradient_all_reduce_from_a_backward_on_another_line_pairs_at_the_same_batch() -> None:
    # the fix of a swallowed OOM: the skipping rank runs a backward of a zeroed loss in its
    # handler (line 43), which all-reduces the same buckets as the others' step (line 24)
    from dataclasses import replace

    def bucket(rank: int, seq: int, line: int, batch: int) -> CollectiveCall:
        made = call(rank, seq, line=line, shape=18)
        return replace(made, source="ddp", position={"loader": "loader", "pass": 0, "batch": batch})

    same_batch = {
        0: [bucket(0, 0, 24, 3), bucket(0, 1, 24, 4)],
        1: [bucket(1, 0, 43, 3), bucket(1, 1, 24, 4)],
    }
    assert divergences(same_batch) == []
    # a rank a batch behind from another line is a skipped step, not a pairing
    a_batch_apart = {0: [bucket(0, 0, 24, 3), bucket(0, 1, 24, 4)], 1: [bucket(1, 0, 43, 4)]}
    assert divergences(a_batch_apart)[0].seq == 0
    # the user's own all_reduce from two lines still mixes two values
    users_own = {0: [call(0, 0, line=24)], 1: [call(1, 0, line=43)]}
    assert divergences(users_own)[0].kind is Mismatch.SITE


@pytest.mark.parametrize(
    ("exits", "verdict"),
    [
        ({1: -6, 0: 1}, "crash"),  # gloo's abort, in progress when the stall was declared
        ({1: -11, 0: -15}, "crash"),  # a fault of its own
        ({1: -9, 0: -15}, "hang"),  # only the stop's own signals: the ranks waited
        ({}, "hang"),
    ],
)
def test_a_stall_during_which_a_rank_aborted_on_its_own_is_a_crash(
    exits: dict[int, int], verdict: str
) -> None:
    """Two ranks' all_gathers of other sizes go quiet: the stop after the stall finds a rank
    that ended by its own abort (a signal no launcher stops ranks with): the job ended
    itself, which is a crash, not a hang; the mismatch is the finding either way."""
    traces = {
        0: trace(0, [call(0, 0, op="all_gather", shape=12)]),
        1: trace(1, [call(1, 0, op="all_gather", shape=7)]),
    }
    report = diagnose_report(Evidence(traces=traces, world_size=2, stalled=True, rank_exits=exits))
    assert report.verdict.value == verdict
    assert report.findings[0].cause == "collective-shape-mismatch"
