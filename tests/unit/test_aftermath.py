"""doctor after the fact: what a dead job left (logs, stack dumps), read by content and
explained by the aftermath's rules. Fixtures in tests/fixtures/aftermath are shaped
after what people post: NCCL's watchdog lines, torchelastic's summary, py-spy text,
faulthandler."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from ncclcheck.causes import Cause
from ncclcheck.commands.doctor import run_doctor_from
from ncclcheck.errors import InputError
from ncclcheck.evidence.logs import read_leftovers
from ncclcheck.model import Report, Verdict

from ..conftest import REPO, run_bounded

FIXTURES = REPO / "tests" / "fixtures" / "aftermath"


def diagnose(*names: str) -> Report:
    return run_doctor_from([FIXTURES / name for name in names])


def test_ranks_that_disagree_on_one_sequence_number_are_named_with_each_op() -> None:
    report = diagnose("ops_differ.log")
    (finding,) = report.findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([0], [1, 2, 3])
    assert "#1235" in finding.message and "ALLREDUCE" in finding.message and "BARRIER" in finding.message
    # each piece of evidence names the file and line it came from
    assert any("ops_differ.log:4" in line and "rank 0" in line for line in finding.evidence)
    assert any("ranks 1-3" in line and "BARRIER" in line for line in finding.evidence)


def test_a_rank_that_left_no_watchdog_line_never_issued_the_collective() -> None:
    report = diagnose("stopped_early.log")
    (finding,) = report.findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 2], [3])
    assert "#8812 ALLREDUCE" in finding.message
    assert "the logs do not show" in finding.message  # no reason claimed that the logs lack
    assert "not why" in finding.fix and "evaluate()" not in finding.fix  # no one playbook's fix
    assert report.verdict is Verdict.HANG


def test_the_rank_that_failed_first_explains_the_others_wait() -> None:
    report = diagnose("oom_one_rank.log")
    (finding,) = report.findings
    assert finding.cause is Cause.RANK_CRASHED
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 3], [2])
    assert "OutOfMemoryError" in finding.message
    assert finding.site == "/workspace/train.py:88"
    assert report.verdict is Verdict.CRASH


def test_different_sizes_at_one_sequence_number_are_a_shape_mismatch() -> None:
    (finding,) = diagnose("sizes_differ.log").findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert "1024" in finding.message and "1000" in finding.message


def test_every_rank_in_the_same_collective_is_the_transport() -> None:
    (finding,) = diagnose("transport.log").findings
    assert finding.cause is Cause.TRANSPORT_HANG


def test_an_unprefixed_log_is_the_rank_it_names() -> None:
    job = read_leftovers([FIXTURES / "older_torch_rank3.txt"])
    assert set(job.ranks) == {3}
    (work,) = job.ranks[3].timeouts
    assert (work.seq, work.op, work.numel_in, work.group) == (4411, "ALLREDUCE", 1, "0")


def test_py_spy_text_and_faulthandler_dumps_are_read_into_stacks() -> None:
    job = read_leftovers([FIXTURES / "py_spy_dumps.txt", FIXTURES / "faulthandler_rank1.txt"])
    rank0 = job.ranks[0].stack
    assert rank0 is not None and rank0.main is not None
    assert [f.function for f in rank0.main.frames[:3]] == ["all_reduce", "wrapper", "evaluate"]
    rank1 = job.ranks[1].stack  # the faulthandler file, read after the py-spy one, by its name
    assert rank1 is not None and rank1.main is not None
    assert rank1.main.frames[0].function == "barrier"
    assert rank1.main.frames[-1].function == "<module>"


def test_stack_dumps_go_through_the_live_rules_and_the_source() -> None:
    (finding,) = diagnose("py_spy_dumps.txt").findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    assert finding.site == "playbooks/rank-conditional-collective/repro.py:39"
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])


def test_two_jobs_in_one_log_are_refused_with_their_run_ids() -> None:
    with pytest.raises(InputError, match="job-a, job-b"):
        diagnose("two_jobs.log")


def test_files_of_no_known_kind_are_named_and_skipped(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing about ranks here\n")
    (tmp_path / "garbage.bin").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / "cut.json").write_text('{"format": "ncclcheck-doctor-dump/1", "ranks": [')
    shutil.copy(FIXTURES / "transport.log", tmp_path / "job.log")
    report = run_doctor_from([tmp_path])
    assert report.findings[0].cause is Cause.TRANSPORT_HANG
    skipped = " ".join(report.summary["skipped"])
    assert "notes.txt" in skipped and "garbage.bin" in skipped and "cut.json" in skipped


@pytest.mark.parametrize("content", [None, "nothing about ranks\n", b"\x00\xff" * 64])
def test_nothing_usable_is_exit_2_with_one_clear_line(tmp_path: Path, content: str | bytes | None) -> None:
    if isinstance(content, str):
        (tmp_path / "a.log").write_text(content)
    elif isinstance(content, bytes):
        (tmp_path / "a.bin").write_bytes(content)
    result = run_bounded([sys.executable, "-m", "ncclcheck", "doctor", "--from", str(tmp_path)], 60, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "nothing doctor can read" in result.output and "Traceback" not in result.output


def test_the_json_report_of_a_log_is_the_contracts(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--from", str(FIXTURES / "ops_differ.log")]
    result = run_bounded(argv, 60, cwd=REPO)
    assert result.returncode == 1, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["findings"][0]["cause"] == "collective-order-mismatch"
    assert report["summary"]["read"] == [
        f"{FIXTURES / 'ops_differ.log'}: NCCL watchdog lines, torchelastic's failure summary"
    ]
