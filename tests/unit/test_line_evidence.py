"""Line evidence without ranks: the tracer on functions of this process, the names a
snapshot reads, and the construct the comparison names from synthetic line counts."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ncclcheck.causes import Cause
from ncclcheck.evidence.replayed import RankLines, Replay
from ncclcheck.explain import lines
from ncclcheck.explain.engine import ReasonKind
from ncclcheck.model import CollectiveCall, Frame
from ncclcheck.record.lines import LineTracer, describe_value


def _load(tmp_path: Path, text: str) -> tuple[Path, dict[str, Any]]:
    path = tmp_path / "steps.py"
    path.write_text(textwrap.dedent(text))
    namespace: dict[str, Any] = {"__name__": "steps"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return path, namespace


def test_the_tracer_counts_lines_keeps_values_and_sees_a_handled_exception(tmp_path: Path) -> None:
    path, namespace = _load(
        tmp_path,
        """
        def decode(x):
            if x == 2:
                raise ValueError(f"record {x}: truncated")
            return x

        def loop(n, bad):
            kept = 0
            for x in range(n):
                try:
                    decode(x)
                except ValueError:
                    kept -= 1
                if x == bad:
                    continue
                kept += 1
            return kept
        """,
    )
    source = path.read_text().splitlines()
    line_of = {text.strip(): number for number, text in enumerate(source, 1)}
    plan = {
        "targets": [[str(path), "loop", line_of["def loop(n, bad):"], len(source)]],
        "watch": [[str(path), line_of["continue"], ["x", "bad"]]],
        "stop": {},
    }
    tracer = LineTracer(plan, 0, str(tmp_path))
    previous = sys.gettrace()
    sys.settrace(tracer.global_trace)
    try:
        namespace["loop"](4, 3)
    finally:
        sys.settrace(previous)
    here = str(path)
    assert tracer.counts[(here, line_of["continue"])] == 1
    assert tracer.counts[(here, line_of["kept += 1"])] == 3
    assert (
        here,
        line_of['raise ValueError(f"record {x}: truncated")'],
    ) not in tracer.counts  # decode(): not a target
    assert tracer.values[(here, line_of["continue"])]["first"] == {"x": "3", "bad": "3"}
    (seen,) = tracer.exceptions
    assert (seen["type"], seen["message"], seen["count"]) == ("ValueError", "record 2: truncated", 1)
    assert seen["raised_at"][1:] == [line_of['raise ValueError(f"record {x}: truncated")'], "decode"]
    assert seen["next_line"] == line_of["except ValueError:"]
    tracer.save("exit", 0)
    saved = json.loads((tmp_path / "lines-rank-00000.json").read_text())
    assert saved["how"] == "exit" and saved["exceptions"][0]["type"] == "ValueError"


def test_a_value_is_described_without_running_the_users_code() -> None:
    assert describe_value(torch.tensor([float("inf")])) == "tensor([inf]) float32"
    big = torch.zeros(4, 4)
    big[0, 0], big[1, 1] = 1e6, float("nan")
    assert describe_value(big) == "tensor float32[4, 4], from 0 to 1e+06, 1 non-finite"
    assert describe_value([1, 2]) == "list of 2"
    assert describe_value(3) == "3"

    class Loud:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert describe_value(Loud()) == "a Loud"


def test_a_snapshot_reads_names_and_attribute_chains_but_not_calls() -> None:
    import ast

    def names(text: str) -> list[str]:
        return lines.read_names(ast.parse(text, mode="eval").body)

    # a module read is kept here and dropped by the tracer, which sees it is a module
    assert names("not torch.isfinite(loss)") == ["torch", "loss"]
    assert names("self.bad_epochs >= self.patience") == ["self.bad_epochs", "self.patience"]
    assert names("time.time() - start < budget") == ["time", "start", "budget"]
    assert names("batch.abs().max() > 100") == ["batch"]


def _fork(path: Path, function: str, line: int, phase: str = "train") -> Any:
    call = CollectiveCall(rank=0, seq=3, op="all_reduce", group="default", group_ranks=[0, 1], phase=phase)
    call.site = Frame(str(path), line, function)
    call.n = 4
    stack = [Frame(str(path), line, function)]
    d = SimpleNamespace(
        site=lambda frame: f"{path.name}:{frame.line}" if frame else None, ev=SimpleNamespace(traces={})
    )
    return SimpleNamespace(
        made=[0], other=[1], stack=stack, alt_stack=stack, call=call, alt=None, d=d, calls={0: call, 1: None}
    )


def _replay(counts: dict[int, dict[tuple[str, int], int]], **extra: Any) -> Replay:
    replay = Replay()
    for rank, seen in counts.items():
        replay.ranks[rank] = RankLines(rank, "stopped", 4, seen, extra.get("values", {}).get(rank, {}), [])
    return replay


def test_the_exit_only_one_side_took_is_named_with_the_values_its_test_read(tmp_path: Path) -> None:
    path, _ = _load(
        tmp_path,
        """
        def train(loader, sync):
            for batch in loader:
                loss = batch.sum()
                if not loss.isfinite():
                    continue
                sync(loss)
        """,
    )
    here, (skip, call) = str(path), (6, 7)
    values = {1: {(here, skip): {"first": {"loss": "tensor([inf]) float32"}, "last": {}}}}
    replay = _replay(
        {
            0: {(here, call): 4, (here, skip - 1): 4},
            1: {(here, call): 3, (here, skip): 1, (here, skip - 1): 4},
        },
        values=values,
    )
    found = lines.decided(_fork(path, "train", call), replay)
    assert found is not None
    assert (found.kind, found.cause, found.side, found.statement) == (
        ReasonKind.DATA_TEST,
        Cause.DATA_DEPENDENT_BRANCH,
        [1],
        "continue under if not loss.isfinite()",
    )
    assert found.evidence == [
        "`continue` under `if not loss.isfinite()` at steps.py:6 ran once on rank 1, 0 times on rank 0",
        "the test read, when it sent rank 1 out: loss = tensor([inf]) float32",
    ]


def test_lines_that_differ_without_an_exit_handler_or_loop_name_nothing(tmp_path: Path) -> None:
    path, _ = _load(
        tmp_path,
        """
        def train(sync, x):
            y = x + 1
            sync(y)
        """,
    )
    here = str(path)
    replay = _replay({0: {(here, 3): 2, (here, 4): 2}, 1: {(here, 3): 1, (here, 4): 1}})
    fork = _fork(path, "train", 4)
    assert lines.decided(fork, replay) is None
    assert lines.differing(fork, replay) == [
        "steps.py:3 ran 2 times on rank 0, once on rank 1",
        "steps.py:4 ran 2 times on rank 0, once on rank 1",
    ]


def test_the_loop_one_rank_is_still_in_is_named_not_the_loop_the_other_went_on_in(tmp_path: Path) -> None:
    """Fresh w07: a hand-split validation set, 33 records on rank 0 and 32 on rank 1, two
    batches against one; rank 0 waits in its second validation batch, rank 1 went back to
    training. Every line of the train loop ran more on rank 1 (it went on), and the
    validation's `if step % EVAL_EVERY == 0` was made to fire on rank 1 only as far as the
    replay saw, with the same values read on both ranks: the loop that decided is the
    validation's, in the deeper function, not the train loop, not the test."""
    path, _ = _load(
        tmp_path,
        """
        def validate(sync, batches):
            for batch in batches:
                sync(batch)

        def main(sync, train, val, every):
            step = 0
            for batch in train:
                sync(batch)
                step += 1
                if step % every == 0:
                    validate(sync, val)
        """,
    )
    here = str(path)
    val_body, train_body, test, in_test = 4, 9, 11, 12
    same = {"first": {"step": "1", "every": "5"}, "last": {"step": "1", "every": "5"}}
    replay = _replay(
        {
            0: {(here, val_body): 2, (here, train_body): 1, (here, test): 1, (here, in_test): 0},
            1: {(here, val_body): 1, (here, train_body): 2, (here, test): 1, (here, in_test): 1},
        },
        values={0: {(here, test): same}, 1: {(here, test): same}},
    )
    fork = _fork(path, "validate", val_body, phase="eval")
    fork.stack = [Frame(here, in_test, "main"), Frame(here, val_body, "validate")]
    fork.alt_stack = [Frame(here, train_body, "main")]
    found = lines.decided(fork, replay)
    assert found is not None
    assert (found.cause, found.side, found.frame.line, found.statement) == (
        Cause.UNEVEN_EVAL_BATCHES,
        [0],
        val_body - 1,
        "for batch in batches",
    )


def test_of_two_loops_each_run_more_on_one_side_the_one_around_the_last_call_alike_decided(
    tmp_path: Path,
) -> None:
    """Fresh x04: validation shards dealt round-robin, 12 batches on rank 0 and 8 on rank
    1, an all_reduce per batch; rank 1 left the validation loop and ran one more train
    pass. Both loops ran more passes on one side, at the same depth; the ranks' last call
    made alike is the validation's 8th all_reduce, so they parted in that loop: it is
    named, not the train loop rank 1 went on in."""
    path, _ = _load(
        tmp_path,
        """
        def train(sync, batches):
            for batch in batches:
                sync(batch)

        def evaluate(sync, batches):
            for batch in batches:
                sync(batch)

        def main(sync, train_set, val_set):
            for epoch in range(2):
                train(sync, train_set)
                evaluate(sync, val_set)
        """,
    )
    here = str(path)
    train_for, train_body, eval_for, eval_body, train_call, eval_call = 3, 4, 7, 8, 12, 13
    replay = _replay(
        {
            0: {(here, train_body): 16, (here, eval_body): 9},
            1: {(here, train_body): 17, (here, eval_body): 8},
        }
    )
    fork = _fork(path, "evaluate", eval_body, phase="eval")
    fork.stack = [Frame(here, eval_call, "main"), Frame(here, eval_body, "evaluate")]
    fork.alt_stack = [Frame(here, train_call, "main"), Frame(here, train_body, "train")]
    fork.alt = CollectiveCall(rank=1, seq=3, op="all_reduce", group="default", group_ranks=[0, 1])
    fork.alt.n, fork.alt.user_stack = 4, fork.alt_stack
    fork.call.user_stack = fork.stack

    def eval_call_at(n: int, rank: int) -> CollectiveCall:
        call = CollectiveCall(rank=rank, seq=n - 1, op="all_reduce", group="default", group_ranks=[0, 1])
        call.n, call.user_stack = n, list(fork.stack)
        return call

    traces = {rank: SimpleNamespace(calls=[eval_call_at(3, rank)]) for rank in (0, 1)}
    fork.d.ev = SimpleNamespace(traces=traces)
    found = lines.decided(fork, replay)
    assert found is not None
    assert (found.side, found.frame.line, found.statement) == ([0], eval_for, "for batch in batches")
    # without the calls' histories the two loops tie, and the first in the file is named:
    # what the rule above is for
    fork.d.ev = SimpleNamespace(traces={})
    found = lines.decided(fork, replay)
    assert found is not None and found.frame.line == train_for


def test_an_exit_on_a_flag_names_where_the_flag_is_set_and_under_which_test(tmp_path: Path) -> None:
    """Fresh w03, an HF-style callback: the loop breaks on `self.control.should_training_stop`,
    set to True by a callback under a test of the rank's own logged loss and reset to False
    elsewhere: the setting under its test is the line to look at next, not the reset."""
    path, _ = _load(
        tmp_path,
        """
        class TargetLoss:
            def on_log(self, control, logs):
                control.should_training_stop = False
                if logs["loss"] <= 0.95:
                    control.should_training_stop = True

        def train(self, loader, sync):
            for batch in loader:
                sync(batch)
                if self.control.should_training_stop:
                    break
        """,
    )
    here = str(path)
    call, exit_ = 10, 12
    replay = _replay({0: {(here, call): 3, (here, exit_): 1}, 1: {(here, call): 3}})
    found = lines.decided(_fork(path, "train", call), replay)
    assert found is not None and found.statement == "break under if self.control.should_training_stop"
    assert (
        "where `should_training_stop` is set: steps.py:6, under `if logs['loss'] <= 0.95` (steps.py:5)"
        in (found.evidence)
    )
    assert not any("steps.py:4" in line for line in found.evidence)
