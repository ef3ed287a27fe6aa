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
from ncclcheck.model import Report, Severity, Verdict

from ..conftest import REPO, WAIT_S, line_in, run_bounded

FIXTURES = REPO / "tests" / "fixtures" / "aftermath"


def diagnose(*names: str) -> Report:
    return run_doctor_from([FIXTURES / name for name in names])


def _pyspy_dump(pid: int, frames: list[str], state: str = "active") -> str:
    """One process's py-spy dump: its main thread with ``frames``, innermost first."""
    return f'Process {pid}: python train.py\n\nThread {pid} ({state}): "MainThread"\n' + "".join(
        f"    {f}\n" for f in frames
    )


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


def test_every_rank_in_the_same_collective_is_the_transport_only_where_they_are_the_whole_job(
    tmp_path: Path,
) -> None:
    """Ranks 0 and 1 time out at one number. Nothing states the job's size: they may be one
    node of a larger job, so the transport is one reading of two (a warning naming what
    decides). Their communicators' init lines state a world of 2: the transport, found; a
    world of 4: the two ranks never seen are where to look, no transport said."""
    (finding,) = diagnose("transport.log").findings
    assert (finding.cause, finding.severity) == (Cause.TRANSPORT_HANG, Severity.WARNING), finding
    assert "nothing here states the job's size" in finding.message
    for world, severity in ((2, Severity.ERROR), (4, Severity.WARNING)):
        log = tmp_path / f"world{world}.log"
        log.write_text(
            "".join(
                f"node-{r}:{4100 + r}:{4180 + r} [0] NCCL INFO comm 0x55d3c8a0e4{r}0 rank {r} nranks {world} "
                f"cudaDev 0 nvmlDev 0 busId 18000 commId 0x7c1e2b3a5f0d11aa - Init COMPLETE\n"
                for r in range(2)
            )
            + (FIXTURES / "transport.log").read_text()
        )
        (finding,) = run_doctor_from([log]).findings
        assert finding.severity is severity, (world, finding)
        if world == 4:
            assert finding.cause is not Cause.TRANSPORT_HANG and "ranks 2-3" in finding.message, finding


def test_an_excerpt_in_which_every_rank_it_covers_waits_sets_no_rank_apart() -> None:
    # three of six ranks in the first collective; rank 0 seen only aborted (SIGABRT, as its
    # own watchdog ends a waiting rank); ranks 2 and 5: not a line
    report = diagnose("excerpt_first_collective.log")
    (finding,) = report.findings
    assert (finding.ranks, finding.absent_ranks) == ([1, 3, 4], [])
    assert "No rank is set apart by this evidence" in finding.message
    assert "ranks 0,2,5" in finding.message and "only seen aborted" in finding.message
    assert "ncclcheck probe" in finding.fix and "watchdog lines or stacks of ranks 0,2,5" in finding.fix
    # ranks of which the files hold nothing are unseen, not "exited": nothing says they ended
    states = {state.rank: state.state.value for state in report.ranks}
    assert (states[2], states[5]) == ("unseen", "unseen"), states


def test_ranks_in_a_prepared_loaders_rng_broadcast_had_begun_the_next_pass() -> None:
    """Two ops at one position; the ranks in the BROADCAST show, in the tracebacks their
    waits ended in (one cut above its first frame, lines indented as pasted into a list),
    accelerate's RNG sync as a prepared loader's pass starts: they ran out of batches."""
    report = diagnose("epoch_start_broadcast.log")
    (finding,) = report.findings
    assert finding.cause is Cause.UNEVEN_EVAL_BATCHES, finding
    # rank 3's traceback shows the same RNG sync, but no line of its places it at #20417:
    # it is not counted on either side
    assert (finding.ranks, finding.absent_ranks, finding.op) == ([0, 1], [2], "BROADCAST")
    assert "accelerate synchronising the RNG state as a prepared DataLoader starts a new pass" in (
        finding.message
    )
    assert "ranks 0-1 issued ALLREDUCE, a collective of the pass before" in finding.message, finding.message
    assert "the same number of batches per pass" in finding.fix
    # the traceback whose header was cut is still rank 3's, frames and all
    job = read_leftovers([FIXTURES / "epoch_start_broadcast.log"])
    ending = job.ranks[3].ending
    assert (
        ending is not None
        and ending.error == "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3."
    )
    assert [f.function for f in ending.frames] == ["synchronize_rng_state"]
    assert [f.function for f in job.ranks[2].ending.frames][-2:] == [
        "synchronize_rng_states",
        "synchronize_rng_state",
    ]


def test_a_new_pass_on_both_sides_tells_nothing_and_the_disagreement_stands(tmp_path: Path) -> None:
    text = (FIXTURES / "epoch_start_broadcast.log").read_text()
    # rank 0 too shows the RNG sync: no side stands apart by it
    text += (
        '  [rank0]:  File "/opt/conda/lib/python3.11/site-packages/accelerate/utils/random.py", line 118, '
        "in synchronize_rng_state\n  [rank0]:RuntimeError: NCCL communicator was aborted on rank 0.\n"
    )
    both = tmp_path / "both.log"
    both.write_text(text)
    (finding,) = run_doctor_from([both]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH, finding


def test_the_one_rank_that_never_timed_out_with_the_others_was_in_no_collective() -> None:
    # rank 2 had issued up to #7314: a collective that timed out is only a lower bound of
    # what a rank issued, so ranks 1 and 3 are not "behind" it. Rank 0 left no timeout of
    # its own: had it taken another path at a collective, it would wait in one and time out
    # too; it had raised or died (or was busy all along), and its own output decides.
    report = diagnose("one_rank_without_a_line.log")
    (finding,) = report.findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_CRASHED, [1, 2, 3], [0])
    assert "not even a timeout of its own" in finding.message and "straggler" in finding.message
    assert finding.fix.startswith("Read rank 0's own output")  # how to decide, not one playbook's fix


def test_tagged_wrapped_lines_and_unnamed_groups_are_read_as_one_job() -> None:
    job = read_leftovers([FIXTURES / "tagged_and_wrapped.log"])
    assert sorted(job.ranks) == [0, 1]
    assert [(w.group, w.seq, w.op) for w in job.ranks[0].timeouts] == [("2", 412, "REDUCE")]
    assert [(w.group, w.seq, w.op) for w in job.ranks[1].timeouts] == [("2", 412, "ALLREDUCE")]
    assert job.ranks[0].last_enqueued("2") == 412 and job.ranks[1].last_enqueued("2") == 419
    (finding,) = run_doctor_from([FIXTURES / "tagged_and_wrapped.log"]).findings
    # parted at #412, REDUCE against ALLREDUCE: a value reduced two ways at one point, no
    # branch; one rank against one: neither is set apart
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.COLLECTIVE_ORDER_MISMATCH,
        [0, 1],
        [],
    )


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
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--from", str(tmp_path)]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "nothing doctor can read" in result.output and "Traceback" not in result.output


def test_the_json_report_of_a_log_is_the_contracts(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--json", "--from", str(FIXTURES / "ops_differ.log")]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 1, result.output
    report = json.loads(result.output[result.output.index("{") :])
    assert report["findings"][0]["cause"] == "collective-order-mismatch"
    assert report["summary"]["read"] == [
        f"{FIXTURES / 'ops_differ.log'}: NCCL watchdog lines, torchelastic's failure summary"
    ]


REAL = FIXTURES / "real"  # written by make_real.py from real hung jobs here (gloo)
HANGING = sorted(p.name for p in REAL.iterdir()) if REAL.is_dir() else []


@pytest.mark.parametrize("cause", HANGING)
@pytest.mark.parametrize("evidence", ["job.log", "py-spy.txt"])
def test_what_a_real_hung_repro_left_names_its_cause_and_ranks(catalogue, cause: str, evidence: str) -> None:
    """Each hanging playbook repro, killed by SIGABRT as NCCL's watchdog kills: its
    torchrun log (faulthandler's stacks and torchelastic's summary) alone, and py-spy's
    text dumps alone, each give the playbook's cause and ranks."""
    playbook = catalogue.get(cause)
    report = run_doctor_from([REAL / cause / evidence])
    finding = report.findings[0]
    expected = sorted(playbook.repro.ranks + playbook.repro.absent_ranks)
    if (evidence, cause) == ("job.log", "collective-order-mismatch"):
        # faulthandler prints no locals: two ranks at one line of a loop, on different passes,
        # look alike; and nothing in the log states the job's size: no rank is set apart, and
        # neither the transport nor a split is said as found
        assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
        assert "either the ranks not in these files never reached this call" in finding.message
        return
    if cause == "transport-hang":
        # the frozen rank cannot be dumped (py-spy, faulthandler): named as not dumped, not
        # guessed; whether it reached the call, nothing here says
        assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
        assert "either rank 1, whose stacks are not here, never reached this call" in finding.message
        not_dumped = "of at least 2: the others were not dumped"
        assert any(not_dumped in line for line in finding.evidence), finding.evidence
        assert set(finding.ranks + finding.absent_ranks) <= set(expected)
        return
    assert finding.cause == cause, (finding.message, finding.evidence)
    assert sorted(finding.ranks + finding.absent_ranks) == expected


def test_a_large_job_is_said_in_rank_ranges_unless_every_rank_is_asked_for(tmp_path: Path) -> None:
    lines = [
        f"[rank{r}]:[E1202 00:00:00.1 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
        "Watchdog "
        f"caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=4, NumelOut=4, "
        f"Timeout(ms)=600000) ran for 600001 milliseconds before timing out."
        for r in range(200)
        if r != 150
    ]
    log = tmp_path / "job.log"
    log.write_text("\n".join([*lines, "WORLD_SIZE=200"]) + "\n")
    report = run_doctor_from([log])
    assert report.ranks == []  # 200 rows would bury the finding
    (finding,) = report.findings
    assert finding.absent_ranks == [150]
    assert any(line.startswith("ranks 0-149,151-199: the watchdog timed out #9") for line in finding.evidence)
    assert len(run_doctor_from([log], all_ranks=True).ranks) == 200


def _pickled_trace(path: Path, op: str) -> None:
    import pickle

    entry = {"collective_seq_id": 3, "profiling_name": f"nccl:{op}", "process_group": ["0", "default_pg"]}
    path.write_bytes(
        pickle.dumps({"entries": [{**entry, "state": "scheduled"}], "version": "2.4", "pg_config": {}})
    )


def test_pickled_flight_recorder_dumps_are_read_only_when_trusted(tmp_path: Path) -> None:
    _pickled_trace(tmp_path / "nccl_trace_rank_0", "all_reduce")
    _pickled_trace(tmp_path / "nccl_trace_rank_1", "broadcast")
    with pytest.raises(InputError) as refused:
        run_doctor_from([tmp_path])
    assert "unpickling runs code" in (refused.value.hint or "")
    (finding,) = run_doctor_from([tmp_path], trust_pickle=True).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert "nccl:all_reduce" in finding.message and "nccl:broadcast" in finding.message


def _recorders(cause: str) -> list[Path]:
    dumps = sorted((REAL / cause).glob("fr_rank_*"))
    assert dumps, f"make_real.py --flight-recorder {cause} writes them"
    return dumps


@pytest.mark.parametrize("cause", HANGING)
def test_flight_recorders_of_a_real_hung_repro_never_give_another_causes_fix(catalogue, cause: str) -> None:
    """The Flight Recorder's dumps alone show where the ranks parted (the same position,
    other ops), not why: the finding is the playbook's cause, or it says where and gives
    how to find the reason, never another cause's fix; or nothing is claimed."""
    report = run_doctor_from(_recorders(cause))
    if not report.findings:
        assert "no rule explains" in report.summary["unexplained"]
        return
    finding = report.findings[0]
    own_fix = catalogue.get(finding.cause).fix.direct
    assert finding.cause == cause or finding.fix != own_fix, (finding.cause, finding.fix)
    assert any("Flight Recorder" in line and "fr_rank_" in line for line in finding.evidence), (
        finding.evidence
    )


@pytest.mark.parametrize("cause", HANGING)
def test_stacks_and_flight_recorders_together_name_the_playbooks_cause(catalogue, cause: str) -> None:
    """With the stacks beside the recorders, the stacks' reason wins, the recorders'
    positions are evidence."""
    playbook = catalogue.get(cause)
    finding = run_doctor_from([REAL / cause / "py-spy.txt", *_recorders(cause)]).findings[0]
    expected = set(playbook.repro.ranks + playbook.repro.absent_ranks)
    if cause == "transport-hang":  # rank 1 froze: neither dumped nor recorded, so not set apart
        assert (finding.severity.value, finding.absent_ranks) == ("warning", []), finding.message
        assert set(finding.ranks) <= expected
        return
    assert finding.cause == cause, (finding.message, finding.evidence)
    assert set(finding.ranks + finding.absent_ranks) <= expected


def test_a_stack_dump_of_no_known_rank_is_read_as_such(tmp_path: Path) -> None:
    # a pid or a thread id in a file's name is not a rank: the dump is read, described,
    # and sets no rank apart
    for name in ("hung_pid4884.txt", "hung_pid4886.txt"):
        shutil.copy(FIXTURES / "faulthandler_rank1.txt", tmp_path / name)
    job = read_leftovers(sorted(tmp_path.iterdir()))
    assert job.ranks == {} and [u.label for u in job.unplaced] == ["hung_pid4884.txt", "hung_pid4886.txt"]
    report = run_doctor_from(sorted(tmp_path.iterdir()))
    assert report.findings == [] and report.ranks == [] and report.world_size == 0
    (merged,) = report.summary["stacks_of_no_known_rank"]
    assert merged.startswith("2 dumps (hung_pid4884.txt, hung_pid4886.txt): ")
    assert "name no rank" in report.summary["unexplained"]


def test_the_flight_recorder_analysers_missing_ranks_are_named_at_the_users_line() -> None:
    (finding,) = diagnose("fr_trace_missing.txt").findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    assert (finding.ranks, finding.absent_ranks) == ([0, 2, 3], [1])
    assert finding.site == "/home/me/project/retrieval/loss.py:88"  # the first frame not torch's
    assert "all_gather_into_tensor #2207 of group default_pg" in finding.message
    assert "not why" in finding.fix


def test_the_flight_recorder_analysers_size_mismatch_is_a_shape_mismatch() -> None:
    (finding,) = diagnose("fr_trace_sizes.txt").findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert "SIZE_OR_SYNTAX_MISMATCH" in finding.message and "names rank 1" in finding.message
    assert (finding.ranks, finding.absent_ranks) == ([], [])  # its culprit is a hint, not a verdict


def test_an_analyser_verdict_cut_before_its_error_message_is_said_as_undecided(tmp_path: Path) -> None:
    lines = (FIXTURES / "fr_trace_sizes.txt").read_text().splitlines()
    (tmp_path / "fr.txt").write_text("\n".join(line for line in lines if not line.startswith("error msg")))
    (finding,) = run_doctor_from([tmp_path / "fr.txt"]).findings
    assert finding.severity.value == "warning" and "error message is not in these files" in finding.message
    assert "error msg" in finding.fix


def test_the_rank_nccls_desync_report_says_never_joined_is_set_apart() -> None:
    (finding,) = diagnose("desync_lagging.log").findings
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 3], [2])
    assert "never joined collective #88" in finding.message and "not why" in finding.fix


def test_every_rank_joined_and_none_finished_is_the_transport() -> None:
    (finding,) = diagnose("desync_all_joined.log").findings
    assert finding.cause is Cause.TRANSPORT_HANG
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 2, 3], [])


def test_the_rank_a_monitored_barrier_says_did_not_pass_is_set_apart() -> None:
    (finding,) = diagnose("monitored_barrier.log").findings
    assert finding.cause is Cause.STRAGGLER and finding.op == "monitored_barrier"
    assert (finding.ranks, finding.absent_ranks) == ([0, 2], [1])
    assert "within 60 s" in finding.message and "never calls it" in finding.message


def test_gdb_py_bt_and_a_printed_stack_are_read_with_their_source_lines() -> None:
    job = read_leftovers([FIXTURES / "gdb_py_bt.txt", FIXTURES / "printed_stack_item.txt"])
    by_label = {u.label: u.stack.main for u in job.unplaced}
    py_bt, printed = by_label["gdb_py_bt.txt"], by_label["printed_stack_item.txt"]
    assert py_bt is not None and printed is not None
    assert [f.function for f in py_bt.frames] == ["all_reduce", "mean_over_ranks", "validate", "<module>"]
    assert [f.function for f in printed.frames] == ["log_loss", "main", "<module>"]  # innermost first
    assert printed.code[0] == 'print(f"loss {loss.item():.4f}")'
    report = run_doctor_from([FIXTURES / "gdb_py_bt.txt", FIXTURES / "printed_stack_item.txt"])
    said = " ".join(report.summary["stacks_of_no_known_rank"])
    assert (
        "all_reduce" in said and "a device sync point: .item() at /home/me/train/logging_utils.py:12" in said
    )
    assert "its source is not on this host" in said  # no claim about source it could not read


def test_a_gdb_native_backtrace_says_the_thread_waits_on_the_device() -> None:
    report = run_doctor_from([FIXTURES / "gdb_native_bt.txt"])
    (said,) = report.summary["stacks_of_no_known_rank"]
    assert said == "1 dump (gdb_native_bt.txt): a device sync point (cudaStreamSynchronize, in native frames)"


def _watchdog_log(tmp_path: Path, ops: dict[int, str], seq: int = 88) -> Path:
    lines = [
        f"[rank{r}]:[E1202 00:00:00.1 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
        f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600001 milliseconds before timing out."
        for r, op in ops.items()
    ]
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n")
    return log


def test_a_side_at_a_reduce_to_one_rank_parted_on_a_decision_taken_from_its_result(tmp_path: Path) -> None:
    log = _watchdog_log(tmp_path, {0: "BROADCAST", 1: "BROADCAST", 2: "REDUCE", 3: "REDUCE"})
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [2, 3],
        [0, 1],
    )
    assert "its destination only" in finding.message and "not a proof" in finding.message


@pytest.mark.parametrize(
    "ops",
    [
        {0: "ALLREDUCE", 1: "BROADCAST"},  # no reduce to one rank: the numbers say where, not why
        {0: "_REDUCE_SCATTER_BASE", 1: "_ALLGATHER_BASE"},  # a reduce-scatter is every rank's
        {0: "REDUCE", 1: "REDUCE", 2: "ALLREDUCE", 3: "ALLREDUCE"},  # one value, reduced two ways
    ],
)
def test_ops_that_differ_without_a_reduce_to_one_rank_stay_unexplained(
    tmp_path: Path, ops: dict[int, str]
) -> None:
    (finding,) = run_doctor_from([_watchdog_log(tmp_path, ops)]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert "Find the line of each side's call" in finding.fix


_BACKGROUND_THREAD = """Thread 0x7F0000000{r}00 (idle): "saver"
    all_gather_object (torch/distributed/distributed_c10d.py:3020)
    wrapper (torch/distributed/c10d_logger.py:81)
    plan (trainer/ckpt.py:40)
    run (threading.py:982)
    _bootstrap_inner (threading.py:1045)
    _bootstrap (threading.py:1002)
"""


def _two_thread_dumps(tmp_path: Path, background: str) -> list[Path]:
    paths = []
    for rank in (0, 1, 2):
        text = (
            f"Process {900 + rank}: python trainer/main.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
            f'Thread 0x7F0000000{rank}11 (idle): "MainThread"\n'
            "    barrier (torch/distributed/distributed_c10d.py:4159)\n"
            "    wrapper (torch/distributed/c10d_logger.py:81)\n"
            "    fit (trainer/main.py:77)\n"
            "    <module> (trainer/main.py:90)\n" + background.format(r=rank)
        )
        path = tmp_path / f"rank{rank}.txt"
        path.write_text(text)
        paths.append(path)
    return paths


def test_two_threads_waiting_in_collectives_at_once_is_an_order_the_ranks_need_not_share(
    tmp_path: Path,
) -> None:
    (finding,) = run_doctor_from(_two_thread_dumps(tmp_path, _BACKGROUND_THREAD)).findings
    assert (finding.cause, finding.ranks) == (Cause.COLLECTIVE_ORDER_MISMATCH, [0, 1, 2]), finding
    assert "two threads wait in collectives at once" in finding.message
    assert "all_gather_object on saver" in finding.message and "different process groups" in finding.message
    assert "its own process group" in finding.fix


def test_a_background_thread_outside_any_collective_leaves_the_main_threads_wait_alone(
    tmp_path: Path,
) -> None:
    idle = _BACKGROUND_THREAD.replace(
        "    all_gather_object (torch/distributed/distributed_c10d.py:3020)\n"
        "    wrapper (torch/distributed/c10d_logger.py:81)\n",
        "    wait (threading.py:324)\n",
    )
    dumps = _two_thread_dumps(tmp_path, idle)
    # every dumped rank in one barrier, nothing else in a collective; the job's size unsaid
    (finding,) = run_doctor_from(dumps).findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "warning")
    assert "nothing here says how many ranks the job has" in finding.message
    sized = tmp_path / "launch.log"
    sized.write_text("launching trainer/main.py with WORLD_SIZE=3\n")
    (finding,) = run_doctor_from([*dumps, sized]).findings
    assert finding.cause is Cause.TRANSPORT_HANG  # every rank of the job in one barrier


def _old_watchdog_line(rank: int, seq: int, op: str, numel: int, timeout_ms: int) -> str:
    # torch 2.1's: no process group named
    return (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:523] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel * 4}, "
        f"Timeout(ms)={timeout_ms}) ran for {timeout_ms + 700} milliseconds before timing out."
    )


def test_lines_that_name_no_group_are_told_apart_by_their_groups_timeouts(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "\n".join(
            [
                _old_watchdog_line(3, 812, "ALLGATHER", 640, 3_600_000),
                _old_watchdog_line(3, 97, "ALLREDUCE", 1, 600_000),
                _old_watchdog_line(2, 812, "ALLGATHER", 640, 3_600_000),
            ]
        )
        + "\n"
    )
    job = read_leftovers([log])
    assert sorted((w.group, w.seq) for w in job.ranks[3].timeouts) == [
        ("(timeout 3600 s)", 812),
        ("(timeout 600 s)", 97),
    ]


def test_the_rank_left_behind_at_an_earlier_call_of_a_size_mismatch_is_the_first_to_part(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    lines = [_old_watchdog_line(r, 301, "ALLGATHER", 96 + r, 1_800_000) for r in (0, 1, 3)]
    lines.append(_old_watchdog_line(2, 300, "ALLGATHER", 12, 1_800_000))
    log.write_text("\n".join(lines) + "\n")
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([2], [0, 1, 3])
    assert "rank 2 is stuck earlier, in ALLGATHER #300 with 12 elements" in finding.message


def test_a_rank_stuck_earlier_in_another_op_is_not_taken_for_the_first_to_part(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    lines = [_old_watchdog_line(r, 301, "ALLGATHER", 96 + r, 1_800_000) for r in (0, 1)]
    lines.append(_old_watchdog_line(2, 300, "BROADCAST", 12, 1_800_000))
    log.write_text("\n".join(lines) + "\n")
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([0, 1], [])


_OPTIONS = "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, memory_format=(nullopt))"


def _detail_line(rank: int, mine: str, other: int, theirs: str) -> str:
    return (
        f"[rank{rank}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {rank} is running "
        f"collective: CollectiveFingerPrint({mine}, {_OPTIONS}), but Rank {other} is running collective: "
        f"CollectiveFingerPrint({theirs}, {_OPTIONS}).Collectives differ in the following aspects:"
    )


def test_the_debug_checks_op_mismatch_names_both_calls_and_where_the_raising_rank_was(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/srv/exp/fit.py", line 12, in <module>\n'
        "[rank1]:     run()\n"
        '[rank1]:   File "/srv/exp/fit.py", line 9, in run\n'
        "[rank1]:     dist.all_reduce(total)\n"
        + _detail_line(
            1,
            "SequenceNumber=40, OpType=ALLREDUCE, TensorShape=[3], TensorDtypes=Float",
            0,
            "SequenceNumber=40, OpType=BARRIER, TensorShape=[1], TensorDtypes=Float",
        )
        + "\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert "rank 1 runs ALLREDUCE #40; rank 0 runs BARRIER #40" in finding.message
    assert any(line.endswith("as its traceback ends: /srv/exp/fit.py:9") for line in finding.evidence)


def test_the_debug_check_sets_apart_the_one_rank_whose_tensor_differs(tmp_path: Path) -> None:
    ours = "SequenceNumber=7, OpType=ALLGATHER, TensorShape=[16, 8], TensorDtypes=BFloat16"
    odd = "SequenceNumber=7, OpType=ALLGATHER, TensorShape=[15, 8], TensorDtypes=BFloat16"
    log = tmp_path / "job.log"
    log.write_text("\n".join(_detail_line(r, ours, 2, odd) for r in (0, 1, 3)) + "\n")
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([2], [0, 1, 3])
    assert "rank 2 with [15, 8], BFloat16" in finding.message


def test_a_rank_missing_between_those_an_excerpt_holds_is_not_accused_without_the_world_size(
    tmp_path: Path,
) -> None:
    # ranks 0 and 2 timed out in an all-reduce (no world size in it); nothing says the job had
    # 3 ranks rather than 8, so rank 1 is not set apart for being absent from the excerpt
    log = tmp_path / "job.log"
    log.write_text(
        "\n".join(
            f"[{80700 + r}] [rank{r}]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466, "
            "NumelOut=466, Timeout(ms)=600000) ran for 600060 milliseconds before timing out."
            for r in (0, 2)
        )
        + "\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.severity.value == "warning" and finding.absent_ranks == []
    assert "No rank is set apart by this evidence" in finding.message


def test_pystack_dumps_are_read_outermost_first_and_go_through_the_stack_rules(tmp_path: Path) -> None:
    repro = REPO / "playbooks" / "rank-conditional-collective" / "repro.py"
    torch_dir = "/opt/venv/lib/python3.11/site-packages/torch/distributed"

    def dump(thread: int, frames: list[tuple[str, int, str]]) -> str:
        lines = [f"Traceback for thread {thread} (python3) [Has the GIL] (most recent call last):"]
        for path, line, function in frames:
            lines += [f'    (Python) File "{path}", line {line}, in {function}', "        pass"]
        return "\n".join(lines) + "\n"

    call_line = line_in(repro, "dist.all_reduce(")
    barrier_line = line_in(repro, "dist.barrier()")
    waits = (f"{torch_dir}/c10d_logger.py", 81, "wrapper")
    waiting_in = {0: (call_line, "evaluate", 2806, "all_reduce"), 1: (barrier_line, "main", 4159, "barrier")}
    for rank, (line, function, torch_line, op) in waiting_in.items():
        frames = [(str(repro), line, function), waits, (f"{torch_dir}/distributed_c10d.py", torch_line, op)]
        (tmp_path / f"rank{rank}.txt").write_text(dump(500 + rank, frames))
    report = run_doctor_from([tmp_path / "rank0.txt", tmp_path / "rank1.txt"])
    (finding,) = report.findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE, finding
    assert finding.site is not None and finding.site.endswith(f"repro.py:{call_line}")


def test_the_world_an_all_gather_states_counts_a_silent_last_rank(tmp_path: Path) -> None:
    # ranks 0-2 timed out in an all-gather whose output is 4 inputs: a 4-rank job whose
    # rank 3, the highest, left nothing
    log = tmp_path / "job.log"
    log.write_text(
        "\n".join(
            f"[rank{r}]:[E1130 10:00:00.1 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=31, OpType=_ALLGATHER_BASE, "
            "NumelIn=10, NumelOut=40, Timeout(ms)=600000) ran for 600001 milliseconds before timing out."
            for r in (0, 1, 2)
        )
        + "\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_CRASHED, [0, 1, 2], [3])


def _watchdog(
    rank: int, seq: int, op: str, numel: int, enqueued: int, completed: int, started: str = ""
) -> str:
    """One rank's two watchdog lines as torch 2.4 and later print them."""
    pg = f"[rank{rank}]:[E227 23:07:54.322 ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg)"
    pg += f" Rank {rank}]"
    return (
        f"[rank{rank}]:[E227 23:07:54.322 ProcessGroupNCCL.cpp:629] [Rank {rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
        "Timeout(ms)=600000) ran for 600034 milliseconds before timing out.\n"
        f"{pg}  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: "
        f"{enqueued},{started} last completed work: {completed}\n"
    )


def test_the_progress_lines_of_every_torch_since_2_2_are_read(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 40, "ALLREDUCE", 8, 44, 39)
        + _watchdog(1, 40, "ALLREDUCE", 8, 41, 39, started=" last started work: 40 (ALLREDUCE),")
        + "[rank2]:[E1202 03:40:05.119 ProcessGroupNCCL.cpp:2167] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
        "Timeout at NCCL work: 40, last enqueued NCCL work: 40, last completed NCCL work: 39.\n"
    )
    job = read_leftovers([log])
    assert {
        r: (p.timed_out, p.last_enqueued, p.last_completed)
        for r in job.ranks
        for p in job.ranks[r].progress.values()
    } == {
        0: (40, 44, 39),
        1: (40, 41, 39),
        2: (40, 40, 39),
    }


def test_a_rank_that_completed_collectives_another_waits_in_proves_they_paired_different_calls(
    tmp_path: Path,
) -> None:
    # rank 0 waits in #725, an all-gather; rank 3 completed its own #725 and #726 and waits
    # in #727. Rank 0 enqueued more (#732) than rank 3 (#730): NCCL's calls return at once,
    # so that says nothing of who skipped what, and no rank is said to have "never issued"
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 725, "_ALLGATHER_BASE", 5400, 732, 724)
        + _watchdog(3, 727, "_REDUCE_SCATTER_BASE", 4096, 730, 726)
    )
    report = run_doctor_from([log])
    (finding,) = report.findings
    assert (finding.cause, finding.severity.value) == (Cause.COLLECTIVE_ORDER_MISMATCH, "error")
    assert (finding.ranks, finding.absent_ranks) == ([0], [3])
    assert "rank 3 completed its own #725 and #726 after it" in finding.message, finding.message
    assert "these numbers do not say (nothing here of ranks 1-2)" in finding.message
    assert "never issued" not in finding.message


def test_one_collective_completed_on_one_side_only_is_a_split_when_only_timeouts_are_seen(
    tmp_path: Path,
) -> None:
    # a transport failing mid-collective could leave #11 done on rank 0 only, but nothing
    # here shows one failing: every rank timed out
    log = tmp_path / "job.log"
    log.write_text(_watchdog(0, 12, "BROADCAST", 2000, 12, 11) + _watchdog(1, 11, "ALLREDUCE", 1, 11, 10))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity.value) == (Cause.COLLECTIVE_ORDER_MISMATCH, "error")
    assert "or the transport failed during #11" in finding.message
    assert "No line here reports a failing transport" in finding.message


def test_one_collective_completed_on_one_side_only_beside_a_transport_error_is_two_readings(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 12, "BROADCAST", 2000, 12, 11)
        + "[rank1]:node2:77:91 [1] NCCL WARN NET/IB : Got completion from peer 10.0.0.1<4500> with error 12\n"
        + _watchdog(1, 11, "ALLREDUCE", 1, 11, 10)
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity.value) == (Cause.COLLECTIVE_ORDER_MISMATCH, "warning")
    assert "report a failing transport or an NCCL error, the first at" in finding.message


def test_a_rank_that_never_enqueued_what_the_others_wait_in_is_behind(tmp_path: Path) -> None:
    # ranks 0-1 wait in #40; rank 2 enqueued up to #39 and completed it: it never issued #40
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 40, "ALLREDUCE", 8, 40, 39)
        + _watchdog(1, 40, "ALLREDUCE", 8, 40, 39)
        + "[rank2]:[E1202 03:40:05.119 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 2] "
        "Received a dump signal due to a collective timeout from rank 0 and we will try our best to dump the "
        "debug info. Last enqueued NCCL work: 39, last completed NCCL work: 39.\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0, 1],
        [2],
    )
    assert "ranks 0-1 issued #40 ALLREDUCE, 8 elements in on group 0 and waited; rank 2 never issued it" in (
        finding.message
    )


_TORCH = "/opt/conda/lib/python3.11/site-packages/torch"


def test_the_stack_trace_of_the_failed_collective_sites_the_call(tmp_path: Path) -> None:
    # torch 2.5+ with the Flight Recorder on prints where the timed-out collective was
    # called, innermost first; rank 1 stopped issuing before it
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 85, "ALLREDUCE", 1, 85, 84)
        + "[rank0]:[E709 17:05:38.162 ProcessGroupNCCL.cpp:670] Stack trace of the failed collective: \n"
        f"[rank0]:#0 all_reduce from {_TORCH}/distributed/distributed_c10d.py:2696\n"
        f"[rank0]:#1 wrapper from {_TORCH}/distributed/c10d_logger.py:83\n"
        "[rank0]:#2 evaluate from /home/user/train.py:88\n"
        "[rank0]:#3 main from /home/user/train.py:140\n"
        "[rank0]:[E709 17:05:38.162 ProcessGroupNCCL.cpp:2106] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
        "First PG on this rank to signal dumping.\n"
        "[rank1]:[E709 17:05:38.482 ProcessGroupNCCL.cpp:1746] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "Received a dump signal due to a collective timeout from rank 0. Last enqueued NCCL work: 84, "
        "last completed NCCL work: 84.\n"
    )
    job = read_leftovers([log])
    (call,) = job.ranks[0].calls
    assert (call.seq, call.group, call.site) == (85, "0", call.frames[2])
    assert call.frames[2].function == "evaluate" and len(call.frames) == 4
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        [1],
    )
    assert finding.site == "/home/user/train.py:88"
    assert any("it called #85 at /home/user/train.py:88 in evaluate()" in line for line in finding.evidence)


def test_a_missing_stack_trace_of_the_failed_collective_claims_no_site(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 85, "ALLREDUCE", 1, 85, 84)
        + "[rank0]:[E709 17:05:38.162 ProcessGroupNCCL.cpp:670] Stack trace of the failed collective not "
        "found, potentially because FlightRecorder is disabled. You can enable it by setting "
        "TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.\n" + _watchdog(1, 84, "ALLREDUCE", 1, 84, 83)
    )
    assert read_leftovers([log]).ranks[0].calls == []
    (finding,) = run_doctor_from([log]).findings
    assert finding.site is None


def test_a_rank_whose_watchdog_was_stuck_is_not_accused_for_its_silence(tmp_path: Path) -> None:
    # Ray's prefix before torchrun's; ranks 0, 2, 3 time out in one all-reduce; rank 1's own
    # lines hold no timeout, but its heartbeat monitor says its watchdog thread was blocked:
    # it could not have timed out, so its silence sets it apart from nothing
    timeout = (
        "(RayTrainWorker pid=41{r}, ip=10.0.0.3) [rank{r}]:[E1111 16:41:37.1 ProcessGroupNCCL.cpp:632] "
        "[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=14863, OpType=ALLREDUCE, "
        "NumelIn=148, NumelOut=148, Timeout(ms)=1800000) ran for 1800048 milliseconds before timing out.\n"
    )
    log = tmp_path / "job.log"
    log.write_text(
        "".join(timeout.format(r=r) for r in (0, 2, 3))
        + "(RayTrainWorker pid=411, ip=10.0.0.3) [rank1]:step 14862 loss 2.31\n"
        "(RayTrainWorker pid=411, ip=10.0.0.3) [rank1]:[E1111 17:10:53.1 ProcessGroupNCCL.cpp:1398] [PG ID 0 "
        "PG GUID 0(default_pg) Rank 1] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making "
        "progress in monitoring enqueued collectives.\n"
        "(RayTrainWorker pid=411, ip=10.0.0.3) [rank1]:[E1111 17:10:53.1 ProcessGroupNCCL.cpp:1390] [PG ID 0 "
        "PG GUID 0(default_pg) Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping "
        "debug info. workMetaList_.size()=1\n"
    )
    job = read_leftovers([log])
    assert sorted(job.ranks) == [0, 1, 2, 3] and job.ranks[1].watchdog_stuck is not None
    assert job.ranks[1].watchdog_stuck[0] == 480
    report = run_doctor_from([log])
    (finding,) = report.findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
    assert "rank 1 had its watchdog stuck in a NCCL or CUDA call" in finding.message, finding.message
    without = tmp_path / "silent.log"
    without.write_text(log.read_text().split("(RayTrainWorker pid=411, ip=10.0.0.3) [rank1]:[E1111")[0])
    # the same log without the heartbeat lines: rank 1 is heard and never timed out
    assert run_doctor_from([without]).findings[0].absent_ranks == [1]


def _coll(host: str, pid: int, comm: str, count: int, op: str, numel: int, nranks: int = 4) -> str:
    return (
        f"{host}:{pid}:{pid} [0] NCCL INFO {op}: opCount {count:x} sendbuff 0x7f8bccf79600 recvbuff 0x7f8b "
        f"count {numel} datatype 7 op 0 root 0 comm {comm} [nranks={nranks}] stream 0xac16b80\n"
    )


def _coll_job(last: dict[int, list[tuple[str, int]]]) -> str:
    """Four ranks on two hosts, each with its init line and its launches from op #0x2e on."""
    text = ""
    for rank, launches in last.items():
        host, pid, comm = f"node{rank // 2}", 5000 + rank, f"0x55{rank}0a00"
        text += f"{host}:{pid}:{pid} [{rank % 2}] NCCL INFO comm {comm} rank {rank} nRanks 4 nNodes 2\n"
        # a sub-communicator of two ranks: never compared across ranks
        text += _coll(host, pid, "0x77", 900, "Broadcast", 3, nranks=2)
        for index, (op, numel) in enumerate(launches):
            text += _coll(host, pid, comm, 0x2E + index, op, numel)
    return text


def test_nccls_coll_trace_sets_apart_the_rank_that_launched_less(tmp_path: Path) -> None:
    step = [("AllReduce", 4096), ("AllReduce", 1)]
    log = tmp_path / "nccl.log"
    log.write_text(
        _coll_job(
            {
                0: [*step, ("AllReduce", 4096)],
                1: [*step, ("AllReduce", 4096)],
                2: step,
                3: [*step, ("AllReduce", 4096)],
            }
        )
    )
    job = read_leftovers([log])
    assert {r: rec.issued["NCCL's COLL trace"][-1].position for r, rec in job.ranks.items()} == {
        0: 0x30,
        1: 0x30,
        2: 0x2F,
        3: 0x30,
    }
    assert job.world_said == 4
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0, 1, 3],
        [2],
    )
    assert "issued #48 AllReduce of 4096 elements of NCCL type 7 (NCCL's COLL trace)" in finding.message, (
        finding.message
    )
    assert "as far as its lines go" in finding.message


def test_nccls_coll_trace_at_one_count_with_other_ops_is_an_order_mismatch(tmp_path: Path) -> None:
    log = tmp_path / "nccl.log"
    same = [("AllReduce", 4096), ("AllReduce", 1)]
    log.write_text(
        _coll_job(
            {
                0: [*same, ("Broadcast", 20)],
                1: [*same, ("AllReduce", 4096)],
                2: [*same, ("AllReduce", 4096)],
                3: [*same, ("AllReduce", 4096)],
            }
        )
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.COLLECTIVE_ORDER_MISMATCH,
        [0],
        [1, 2, 3],
    )
    assert "rank 0 issued Broadcast of 20 elements of NCCL type 7; ranks 1-3 issued AllReduce of 4096" in (
        finding.message
    )


def test_nccls_coll_trace_without_init_lines_is_of_no_known_rank_unless_torchrun_prefixed_it(
    tmp_path: Path,
) -> None:
    bare = "".join(_coll("node0", 5000 + r, f"0x5{r}", 0x2E, "AllReduce", 8) for r in range(2))
    unowned = tmp_path / "bare.log"
    unowned.write_text(bare)
    report = run_doctor_from([unowned])  # read, its processes of no known rank: no rank set apart
    assert not report.findings
    assert any("processes of no known rank" in line for line in report.summary["read"])
    prefixed = tmp_path / "prefixed.log"
    prefixed.write_text(
        "".join(f"[rank{r}]:{line}\n" for r, line in enumerate(bare.splitlines()))
        + f"[rank0]:{_coll('node0', 5000, '0x50', 0x2F, 'AllReduce', 8)}"
    )
    (finding,) = run_doctor_from([prefixed]).findings
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])


def test_processes_of_no_known_rank_that_launch_other_ops_at_one_opcount_disagree_without_ranks(
    tmp_path: Path,
) -> None:
    # three processes on two hosts, no init line: at 0x41 one broadcasts, two all-reduce
    lines = [_coll(host, pid, comm, 0x40, "AllReduce", 64) for host, pid, comm in _PROCS]
    lines += [
        _coll(host, pid, comm, 0x41, "Broadcast" if pid == 7002 else "AllReduce", 64)
        for host, pid, comm in _PROCS
    ]
    log = tmp_path / "coll.log"
    log.write_text("".join(lines))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([], [])  # no rank is known: none is named
    assert (
        "opCount 0x41" in finding.message
        and "gpu-b pid 7002 (device [0]) launched Broadcast" in finding.message
    )
    # the same sizes and ops throughout: nothing disagrees, nothing is claimed
    log.write_text("".join(_coll(host, pid, comm, 0x40, "AllReduce", 64) for host, pid, comm in _PROCS))
    assert not run_doctor_from([log]).findings


_PROCS = [("gpu-a", 7000, "0x7a"), ("gpu-a", 7001, "0x7b"), ("gpu-b", 7002, "0x7c")]


def test_details_fingerprint_lines_set_apart_the_rank_with_other_tensors(tmp_path: Path) -> None:
    # TORCH_DISTRIBUTED_DEBUG=DETAIL with TORCH_CPP_LOG_LEVEL=INFO: every rank's fingerprint
    # before each collective; at #38 rank 2 all-reduces [77, 1], the others [100, 1]
    line = (
        "[rank{r}]:[I1017 19:34:58.9 ProcessGroupWrapper.cpp:587] [Rank {r}] Running collective: "
        "CollectiveFingerPrint(SequenceNumber={seq}, OpType=ALLREDUCE, TensorShape=[{rows}, 1], "
        "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda))\n"
    )
    log = tmp_path / "detail.log"
    log.write_text(
        "".join(line.format(r=r, seq=37, rows=5) for r in range(4))
        + "".join(line.format(r=r, seq=38, rows=77 if r == 2 else 100) for r in range(4))
    )
    job = read_leftovers([log])
    assert [c.position for c in job.ranks[2].issued["DETAIL's fingerprints"]] == [37, 38]
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.COLLECTIVE_SHAPE_MISMATCH,
        [2],
        [0, 1, 3],
    )
    assert "rank 2 issued ALLREDUCE of [77, 1] Float; ranks 0-1,3 issued ALLREDUCE of [100, 1] Float" in (
        finding.message
    )


def test_a_detail_mismatch_of_one_call_numbered_millions_apart_sets_no_rank_apart(tmp_path: Path) -> None:
    fingerprint = (
        "CollectiveFingerPrint(SequenceNumber={seq}, OpType=BROADCAST, TensorShape=[1], TensorDtypes=Long, "
        "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu))"
    )
    log = tmp_path / "error.log"
    log.write_text(
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 16 is running collective: "
        + fingerprint.format(seq=1977865401)
        + ", but Rank 1 is running collective: "
        + fingerprint.format(seq=54090078)
        + "\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", []), finding
    assert "The numbering differs, not the calls" in finding.message
    # a few calls apart is a drift the program made: a rank set apart
    log.write_text(log.read_text().replace("1977865401", "54090079"))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.severity.value, finding.cause) == ("error", Cause.COLLECTIVE_ORDER_MISMATCH)


def test_nccls_ras_report_places_the_listed_ranks_at_their_launch_count(tmp_path: Path) -> None:
    report = tmp_path / "ncclras.txt"
    report.write_text(
        "Communicators... (0.00s)\n=============\n\n"
        "#0-0 (fa93daea854b060b) MISMATCH\n"
        "  Communicator ranks have different AllGather operation counts\n"
        "  6 ranks have launched up to operation 640\n"
        "  2 ranks have launched up to operation 641\n"
        "  Rank 2 -- GPU 2 managed by process 3032 on node 10.0.0.4\n"
        "  Rank 5 -- GPU 5 managed by process 3035 on node 10.0.0.4\n"
    )
    job = read_leftovers([report])
    assert job.world_said == 8
    assert {r: rec.issued["NCCL's RAS report"][0].position for r, rec in job.ranks.items()} == {
        0: 640, 1: 640, 2: 641, 3: 640, 4: 640, 5: 641, 6: 640, 7: 640,
    }  # fmt: skip
    (finding,) = run_doctor_from([report]).findings
    assert (finding.ranks, finding.absent_ranks) == ([2, 5], [0, 1, 3, 4, 6, 7])
    assert "ranks 2,5 issued #641 AllGather (NCCL's RAS report); ranks 0-1,3-4,6-7 issued up to #640" in (
        finding.message
    )
    # a list that is not one count's group places no rank
    report.write_text(
        report.read_text().replace("  Rank 5 -- GPU 5 managed by process 3035 on node 10.0.0.4\n", "")
    )
    with pytest.raises(InputError):
        run_doctor_from([report])


def test_one_ranks_timeout_with_the_others_unseen_sets_no_rank_apart(tmp_path: Path) -> None:
    # a posted excerpt: rank 1's watchdog lines alone, on the job's first collective
    log = tmp_path / "console.log"
    log.write_text(
        "(RayWorker pid=8812) [rank1]:[E1118 20:32:23.9 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=1800000) ran for 1800024 milliseconds before timing out.\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.severity.value, finding.cause, finding.absent_ranks) == (
        "warning",
        Cause.TRANSPORT_HANG,
        [],
    )
    assert finding.message.startswith(
        "rank 1 timed out in ALLREDUCE #1 of group 0 (the job's first collective"
    )
    assert "`ncclcheck probe`" in finding.fix


def _said_of_one_dump(tmp_path: Path, text: str) -> str:
    dump = tmp_path / "one_process.txt"
    dump.write_text(text)
    (said,) = run_doctor_from([dump]).summary["stacks_of_no_known_rank"]
    return said


def test_torch_cuda_synchronize_in_a_library_frame_is_a_device_sync_point(tmp_path: Path) -> None:
    # faulthandler's shape: a library prefetching a module's weights waits on its stream
    said = _said_of_one_dump(
        tmp_path,
        "Thread 0x00007f00aa000740 (most recent call first):\n"
        '  File "/opt/env/lib/python3.10/site-packages/torch/cuda/streams.py", line 102 in synchronize\n'
        '  File "/opt/env/lib/python3.10/site-packages/shardlib/prefetch.py", line 77 in wait_gather\n'
        '  File "/opt/env/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1750 in _call_impl\n'
        '  File "/srv/job/model.py", line 40 in forward\n',
    )
    assert said.startswith(
        "1 dump (one_process.txt): a device sync point: a CUDA stream's or event's synchronize()"
    )
    plain = _said_of_one_dump(
        tmp_path,
        "Thread 0x00007f00aa000740 (most recent call first):\n"
        '  File "/opt/env/lib/python3.10/site-packages/torch/cuda/__init__.py", line 985 in synchronize\n'
        '  File "/srv/job/bench.py", line 12 in timed_step\n',
    )
    assert "a device sync point: torch.cuda.synchronize()" in plain


def test_an_active_user_line_whose_source_is_absent_is_not_said_to_be_compute_only(tmp_path: Path) -> None:
    # py-spy shows a native call as its Python line: without the source, a .item() there
    # (a GPU rank spinning at a sync point) and a matrix multiply look the same
    active = 'Thread 4001 (active): "MainThread"\n    train (trainer/loop.py:915)\n    <module> (run.py:20)\n'
    said = _said_of_one_dump(tmp_path, active)
    assert "compute, I/O or a device sync point (the line's source is not here to tell" in said
    idle = active.replace("(active)", "(idle)")
    assert "compute or I/O at" in _said_of_one_dump(tmp_path, idle)


def test_an_active_library_gradient_hook_after_its_collectives_waits_for_the_device(tmp_path: Path) -> None:
    main = (
        'Thread 700 (idle): "MainThread"\n'
        "    _engine_run_backward (torch/autograd/graph.py:769)\n"
        "    backward (torch/autograd/__init__.py:289)\n"
        "    backward (torch/_tensor.py:521)\n"
        "    backward (deepspeed/runtime/engine.py:2020)\n"
        "    train_step (myproj/train.py:88)\n"
    )
    hook = (
        "    partition_grads (deepspeed/runtime/zero/stage3.py:1500)\n"
        "    __reduce_and_partition_ipg_grads (deepspeed/runtime/zero/stage3.py:1309)\n"
    )
    said = _said_of_one_dump(tmp_path, main + "Thread 812 (active)\n" + hook)
    assert "active in a native call with no collective frame: a device sync point" in said
    idle = _said_of_one_dump(tmp_path, main + "Thread 812 (idle)\n" + hook)
    assert "in a native call with no collective frame" in idle and "device sync point" not in idle


def test_stacks_summarised_a_line_per_thread_are_read_as_stacks(tmp_path: Path) -> None:
    # as a forum post summarises py-spy: a thread, then its calls from the innermost out
    (tmp_path / "rank0.txt").write_text(
        "what py-spy showed on the two ranks after 20 minutes:\n\n"
        "* `MainThread`: `torch.distributed.all_reduce` from `evaluate` (`trainer/loop.py:88`) "
        "from `fit` (`trainer/loop.py:140`)\n"
        "* `Thread-3`: `wait` (`threading.py:324`) from `run` (`tqdm/_monitor.py:60`)\n"
    )
    (tmp_path / "rank1.txt").write_text(
        "- MainThread: `dist.broadcast` <- `save_checkpoint` (`trainer/ckpt.py:31`) "
        "<- `fit` (`trainer/loop.py:151`)\n"
        "- `batch_size`: `32`\n- `optimizer`: `AdamW`\n"
    )
    job = read_leftovers([tmp_path / "rank0.txt", tmp_path / "rank1.txt"])
    main0, main1 = (job.ranks[r].stack.main for r in (0, 1))  # type: ignore[union-attr]
    assert main0 is not None and main1 is not None
    assert [(f.function, f.file, f.line) for f in main0.frames] == [
        ("all_reduce", "torch/distributed/distributed_c10d.py", 0),
        ("evaluate", "trainer/loop.py", 88),
        ("fit", "trainer/loop.py", 140),
    ]
    assert [f.function for f in main1.frames] == ["broadcast", "save_checkpoint", "fit"]
    assert len(job.ranks[1].stack.threads) == 1  # type: ignore[union-attr]  # settings are no threads
    report = run_doctor_from([tmp_path / "rank0.txt", tmp_path / "rank1.txt"])
    assert any("stack summaries (a line per thread)" in r for r in report.summary["read"])
    # the ranks parted; with the source elsewhere and one rank on each side, neither is set apart
    (finding,) = report.findings
    assert finding.severity.value == "warning" and finding.absent_ranks == []
    assert "as many ranks are on each side, so these stacks set neither apart" in finding.message


def test_a_settings_list_in_backticks_is_not_a_stack(tmp_path: Path) -> None:
    notes = tmp_path / "rank0.txt"
    notes.write_text("- `num_workers`: `8`\n- `backend`: `nccl`\n- `model`: `Llama.from_pretrained`\n")
    assert not read_leftovers([notes]).usable


def test_stacks_of_no_known_rank_inside_a_library_say_what_it_asks_of_every_rank(tmp_path: Path) -> None:
    # no rank is known, so no cause is named; the library's own rule is still worth saying
    dump = tmp_path / "worker_dump.txt"
    dump.write_text(
        'Thread 91 (active): "MainThread"\n'
        "    _all_gather_base (torch/distributed/distributed_c10d.py:2380)\n"
        "    _unshard (torch/distributed/fsdp/_runtime_utils.py:330)\n"
        "    _pre_forward_unshard (torch/distributed/fsdp/_runtime_utils.py:410)\n"
        "    forward (proj/model.py:52)\n"
    )
    report = run_doctor_from([dump])
    assert not report.findings
    said = report.summary["unexplained"]
    assert (
        "They wait inside FSDP unsharding parameters or reducing gradients, which asks this of every rank"
        in said
    )


def test_a_watchdog_line_cut_mid_field_is_no_other_op_or_size(tmp_path: Path) -> None:
    # posted excerpts end mid-word: "OpType=ALLR" is ALLREDUCE cut short, not another op
    whole = (
        "[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=77, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds "
        "before timing out.\n"
    )
    log = tmp_path / "job.log"
    log.write_text(
        "".join(whole.format(r=r) for r in (1, 2, 3))
        + "[E ProcessGroupNCCL.cpp:737] [Rank 5] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=77, OpType=ALLR"
    )
    job = read_leftovers([log])
    assert job.ranks[5].timeouts[0].op == ""
    (finding,) = run_doctor_from([log]).findings
    assert finding.severity.value == "warning" and finding.absent_ranks == []
    assert "ranks 1-3,5 timed out in the same collective, ALLREDUCE #77" in finding.message
    sized = tmp_path / "sized.log"
    sized.write_text(
        "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLGATHER, NumelIn=4096, NumelOut=81"
    )
    (cut,) = read_leftovers([sized]).ranks[0].timeouts
    assert (cut.op, cut.numel_in) == ("ALLGATHER", None)  # NumelOut=81 may be 8192 cut short


def _unanswered(rank: int) -> str:
    return (
        f"[rank{rank}]:[E ProcessGroupGloo.cpp:138] Rank {rank} successfully reached monitoredBarrier, but "
        "received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n"
    )


def test_ranks_unanswered_at_a_monitored_barrier_make_its_coordinator_the_first_suspect(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text("epoch 3 | step 1200 | loss 2.31\n" + _unanswered(2) + _unanswered(5))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([2, 5], [0])
    assert "rank 0 is the first suspect" in finding.message
    assert finding.fix is not None and finding.fix.startswith("What decides: rank 0's own log")
    # rank 0's own line names the rank that did not come: that rank, not rank 0
    log.write_text(
        _unanswered(2)
        + "[rank0]:[E ProcessGroupGloo.cpp:136] Rank 6 failed to pass monitoredBarrier in 1800000 ms\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.absent_ranks == [6], finding.message


def _no_unique_id(rank: int, error: str) -> str:
    return (
        f"[rank{rank}]: torch.distributed.DistBackendError: [{rank}] is setting up NCCL communicator and "
        f"retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got "
        f"error: {error}\n"
    )


def test_ranks_that_never_got_the_nccl_id_set_apart_the_rank_that_publishes_it(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(_no_unique_id(r, "Socket Timeout") for r in (1, 2, 3)))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([1, 2, 3], [0])
    assert "rank 0 never reached that collective" in finding.message
    # the store gone: the job was torn down, rank 0's failure the likely reason; the waiting
    # ranks' own errors are waits given up, never their own failure
    log.write_text(_no_unique_id(1, "Connection reset by peer"))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [0])


def _timed_out_after_preprocessing(tmp_path: Path, bar: str) -> Path:
    log = tmp_path / "job.log"
    log.write_text(
        "".join(
            f"[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=4, OpType=BROADCAST, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
            "1800421 milliseconds before timing out.\n"
            for r in (0, 1, 3)
        ).replace("[E ProcessGroupNCCL", bar + "[E ProcessGroupNCCL", 1)
    )
    return log


def test_an_unfinished_progress_bar_as_the_others_waited_names_the_silent_rank_busy(tmp_path: Path) -> None:
    running = "Map (num_proc=8):  41%|████      | 1000/2400 [25:10<36:00, 0.66 examples/s]"
    (finding,) = run_doctor_from([_timed_out_after_preprocessing(tmp_path, running)]).findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 3], [2])
    assert "'Map (num_proc=8)' at 1000/2400 after 25:10" in finding.message
    # a bar that ran for a moment, or one that finished, held nobody for the timeout
    for bar in (
        "Map (num_proc=8):  41%|████      | 1000/2400 [00:30<36:00, 0.66 examples/s]",
        running + "\rMap (num_proc=8): 100%|██████████| 2400/2400 [61:10<00:00, 0.66 examples/s]",
    ):
        (finding,) = run_doctor_from([_timed_out_after_preprocessing(tmp_path, bar)]).findings
        assert (finding.severity.value, finding.absent_ranks) == ("warning", []), bar


def _waited_after(tmp_path: Path, before: str, waited: tuple[int, ...], world: int | None) -> Path:
    """A 2.4-style log: the job's own lines, then a timeout of each rank in `waited` at one
    all-reduce; the world size stated by the launcher's banner where `world` is given."""
    log = tmp_path / "job.log"
    banner = f"launcher: WORLD_SIZE={world}\n" if world else ""
    log.write_text(
        banner
        + before
        + "".join(
            f"[rank{r}]:[E1130 10:32:00.5 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank {r}] "
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=212, OpType=ALLREDUCE, "
            "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800093 milliseconds before timing out.\n"
            for r in waited
        )
    )
    return log


def test_work_the_job_announced_before_the_timeout_names_the_one_silent_rank_busy(tmp_path: Path) -> None:
    # untagged, in a launcher's word order or a logger's; or tagged by the silent rank itself
    for before, world in (
        ("2026-11-30 10:01:57 INFO indexer: Building IVF index over 48000000 passages (nlist=65536)\n", 4),
        ("[2026-11-30 10:01:57] Starting k-means on 48M vectors\n", None),
        ("[rank0]: Saving checkpoint shards to /ckpt/step_3000 ...\n", 4),
    ):
        log = _waited_after(tmp_path, "epoch 3 step 2999 loss 0.412\n" + before, (1, 2, 3), world)
        (finding,) = run_doctor_from([log]).findings
        assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error"), before
        assert (finding.ranks, finding.absent_ranks) == ([1, 2, 3], [0]), before
        assert "the likely reading: rank 0 was busy" in finding.message.lower(), before


def test_output_that_opens_no_work_or_could_be_any_of_several_ranks_sets_no_one_apart(tmp_path: Path) -> None:
    step = "epoch 3 step 2999 loss 0.412 lr 3.0e-04\n"
    # a step's log says where a rank was, not that it was busy: the world stated, the one
    # silent rank stays the crash suspicion it was; the world not stated, an undecided warning
    (finding,) = run_doctor_from([_waited_after(tmp_path, step, (1, 2, 3), 4)]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [0])
    (finding,) = run_doctor_from([_waited_after(tmp_path, step, (1, 2, 3), None)]).findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
    # the work announced by a rank that then timed out itself: nobody outside was busy with it
    tagged = "[rank2]: Running evaluation on 1200 batches\n"
    (finding,) = run_doctor_from([_waited_after(tmp_path, tagged, (1, 2, 3), None)]).findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
    # two ranks silent of eight: which of them printed an untagged line, it cannot say
    work = "Tokenizing train split (num_proc=16)\n"
    (finding,) = run_doctor_from([_waited_after(tmp_path, work, (1, 2, 3, 4, 5, 6), 8)]).findings
    assert finding.absent_ranks != [0] and finding.absent_ranks != [7]
    assert finding.cause is not Cause.STRAGGLER or finding.severity.value == "warning"


def _bucket_timeouts(sizes: dict[int, int], seq: int = 940) -> str:
    return "".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={n}, NumelOut={n}, Timeout(ms)=900000) ran for "
        "900120 milliseconds before timing out.\n"
        for r, n in sizes.items()
    )


def test_one_size_on_fewer_ranks_at_one_number_sets_those_ranks_apart(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    # five ranks with one size, one with a size close to it: one call with another tensor,
    # and that rank is odd on the numbers' face
    log.write_text(_bucket_timeouts({0: 4096, 1: 4096, 2: 4096, 3: 4000, 4: 4096, 5: 4096}))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([3], [0, 1, 2, 4, 5])
    # one element against 4096 in an all-reduce: two calls (a flag's, a bucket's), not one
    log.write_text(_bucket_timeouts({0: 4096, 1: 4096, 2: 4096, 3: 1, 4: 4096, 5: 4096}))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([3], [0, 1, 2, 4, 5])
    # two against two: nothing says which side parted
    log.write_text(_bucket_timeouts({0: 4096, 1: 4096, 2: 4000, 3: 4000}))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.COLLECTIVE_SHAPE_MISMATCH, [])
    log.write_text(_bucket_timeouts({0: 4096, 1: 4096, 2: 1, 3: 1}))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.COLLECTIVE_ORDER_MISMATCH, [])
    # a rank not in the files could hold either size: none set apart
    log.write_text("WORLD_SIZE=8\n" + _bucket_timeouts({0: 4096, 1: 4096, 2: 1}))
    (finding,) = run_doctor_from([log]).findings
    assert finding.absent_ranks == [] and finding.ranks != [2]


def test_the_odd_sized_rank_that_said_it_skipped_a_step_skipped_it(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    said = "[rank1]: it 8812: dropping this batch, every target is padding (loss=nan)\n"
    log.write_text(said + _bucket_timeouts({0: 2_359_296, 1: 1, 2: 2_359_296}))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.DATA_DEPENDENT_BRANCH, [1])
    assert "dropping this batch" in finding.message
    # said after the timeouts (the rank's own shutdown), it explains nothing
    log.write_text(_bucket_timeouts({0: 2_359_296, 1: 1, 2: 2_359_296}) + said)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH and finding.ranks == [1]


def test_a_rank_that_said_it_stopped_training_left_the_loop_the_others_stayed_in(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    waited = _bucket_timeouts({0: 2_359_296, 2: 2_359_296, 3: 2_359_296})
    # its loop ended: its stream ran dry first
    log.write_text("[r1] ep 4 it 310: my shard of the webdataset ran out, leaving the loop\n" + waited)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_EARLY_EXIT, [1])
    # an early stop: a decision on its own values; its stack past the loop, in a barrier
    log.write_text("[rank1] val_f1 did not improve (patience 5/5): early stopping\n" + waited)
    dump = tmp_path / "rank1.txt"
    dump.write_text(
        'Thread 4242 (idle): "MainThread"\n'
        "    barrier (torch/distributed/distributed_c10d.py:4159)\n"
        "    wrapper (torch/distributed/c10d_logger.py:83)\n"
        "    shutdown (/work/seg/engine.py:97)\n"
        "    main (/work/seg/engine.py:130)\n"
    )
    (finding,) = run_doctor_from([log, dump]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.UNSYNCHRONIZED_DECISION, [1])
    assert "shutdown() at /work/seg/engine.py:97" in finding.message
    # printed by a rank that waited with the others, or after they gave up: not a stop
    for text in (
        "[rank2] early stopping counter 1 of 5\n" + waited,
        waited + "[rank1] exiting after the watchdog's abort\n",
        # an exit that failed: a crash, not a loop left
        "[rank1] loader worker 3 exited with exit code 1\n" + waited,
    ):
        log.write_text(text)
        (finding,) = run_doctor_from([log]).findings
        assert finding.cause not in (Cause.RANK_EARLY_EXIT, Cause.UNSYNCHRONIZED_DECISION), text


def test_work_announced_by_a_rank_whose_stack_waits_in_a_collective_does_not_make_it_busy(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank1] Saving the EMA weights to /ckpt/ema_step900.safetensors\n"
        + _bucket_timeouts({0: 2_359_296, 2: 2_359_296, 3: 2_359_296})
    )
    dump = tmp_path / "rank1.txt"
    dump.write_text(
        'Thread 977 (idle): "MainThread"\n'
        "    all_gather_object (torch/distributed/distributed_c10d.py:2942)\n"
        "    wrapper (torch/distributed/c10d_logger.py:83)\n"
        "    consolidate (/work/seg/ema.py:41)\n"
        "    main (/work/seg/engine.py:120)\n"
    )
    for files in ([log], [log, dump]):
        (finding,) = run_doctor_from(files).findings
        busy = finding.cause is Cause.STRAGGLER and "was busy with that work" in finding.message
        assert busy == (files == [log]), files


def _parted(ops: dict[int, tuple[str, int]]) -> str:
    return "".join(
        f"[rank{r}]:[E ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum=3310, OpType={op}, NumelIn={n}, NumelOut={n}, Timeout(ms)=600000) ran for "
        "600120 milliseconds before timing out.\n"
        for r, (op, n) in ops.items()
    )


def test_loops_of_other_lengths_in_the_jobs_output_make_a_parting_uneven_batches(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    parted = _parted({0: ("ALLREDUCE", 2), 1: ("ALLREDUCE", 2), 2: ("BROADCAST", 1)})
    # each rank's own count: the rank with the most batches is set apart
    counts = "".join(f"[rank{r}] validation: {n} batches of 32\n" for r, n in ((0, 57), (1, 57), (2, 58)))
    log.write_text(counts + parted)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.UNEVEN_EVAL_BATCHES, [0, 1], [2])
    assert "rank 2: 58; ranks 0-1: 57" in finding.message
    # untagged bars of one description with two totals: the smaller side of the parting
    bars = "".join(
        f"Validating: {p}%|#####     | {d}/{n} [00:{s}<00:00,  2.10it/s]\n"
        for p, d, n, s in ((100, 57, 57, 27), (100, 57, 57, 28), (98, 57, 58, 27))
    )
    log.write_text(bars + parted)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.UNEVEN_EVAL_BATCHES, [2])
    # one length everywhere: the loop is not what parted them
    log.write_text(bars.replace("/58", "/57") + parted)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is not Cause.UNEVEN_EVAL_BATCHES


def _raised_then_timed_out(closing: list[int], first_seen: str) -> str:
    """Rank 1 prints a KeyError while saving; ranks 0, 2, 3 time out; torchelastic stops the
    processes in ``closing`` and names ``first_seen`` (an exitcode line) as its root cause."""
    return (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/srv/asr/fit.py", line 210, in <module>\n'
        "[rank1]:     trainer.save_best()\n"
        '[rank1]:   File "/srv/asr/fit.py", line 164, in save_best\n'
        '[rank1]:     torch.save(self.ema_state["shadow"], path)\n'
        "[rank1]: KeyError: 'shadow'\n"
        + _bucket_timeouts({0: 2_359_296, 2: 2_359_296, 3: 2_359_296})
        + "".join(
            f"W1205 10:30:02.000000 700 torch/distributed/elastic/multiprocessing/api.py:897] Sending "
            f"process {pid} closing signal SIGTERM\n"
            for pid in closing
        )
        + "Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-05_10:30:02\n"
        f"  host      : box\n{first_seen}"
        "  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received by PID 701\n"
        "============================================================\n"
    )


def test_an_exception_the_launcher_never_saw_end_its_rank_is_one_the_rank_lived_through(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    aborted = "  rank      : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 701)\n"
    # the agent held all four processes and saw its first failure only at the watchdog's abort
    log.write_text(_raised_then_timed_out([702, 703, 704], aborted))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_EXCEPTION, [1])
    assert finding.site == "/srv/asr/fit.py:164"
    assert "did not exit" in finding.message
    # an agent that stopped one process of four: another node's ranks were not its to see
    # (an exception of the code's own, raised and not caught: rank-exception either way, sited
    # where it was raised; rank-crashed is for memory, the device and signals)
    log.write_text(_raised_then_timed_out([702], aborted))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_EXCEPTION, [1])
    assert "raised and did not catch (KeyError: 'shadow')" in finding.message
    assert finding.site == "/srv/asr/fit.py:164"
    # the same rank dying of its memory is a crash
    log.write_text(
        _raised_then_timed_out([702], aborted).replace(
            "KeyError: 'shadow'", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        )
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [1])


def test_a_rank_that_said_it_skipped_a_step_is_no_transport_where_every_rank_waits_at_one_number(
    tmp_path: Path,
) -> None:
    # torch 1.13's lines carry no sizes: one number and one op on every rank
    old = "".join(
        f"[E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=5120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800300 milliseconds "
        "before timing out.\n"
        for r in range(4)
    )
    log = tmp_path / "job.log"
    log.write_text("it 3999 | loss 1.93\nWARNING rank 2 dropped batch 4000: loss is inf\n" + old)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.DATA_DEPENDENT_BRANCH, [2])
    log.write_text("it 3999 | loss 1.93\n" + old)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.TRANSPORT_HANG


def test_srun_labels_are_the_ranks_where_a_line_names_none_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "slurm-77.out"
    log.write_text(
        " 1: [E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=88, OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for "
        "600100 milliseconds before timing out.\n"
        # srun started one launcher per node: the line's own rank wins over the task's label
        " 0: [E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=88, OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for "
        "600100 milliseconds before timing out.\n"
        " 3: Traceback (most recent call last):\n"
        ' 3:   File "/srv/det/train.py", line 77, in <module>\n'
        " 3:     boxes = load_boxes(path)\n"
        " 3: FileNotFoundError: [Errno 2] No such file or directory: 'ann/0007.json'\n"
    )
    job = read_leftovers([log])
    assert sorted(job.ranks) == [1, 2, 3]
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_EXCEPTION, [3])


def test_a_list_the_ranks_hold_in_other_orders_is_an_order_mismatch_at_its_loop(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "".join(
            f"[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum=612, OpType=ALLREDUCE, NumelIn={n}, NumelOut={n}, "
            "Timeout(ms)=600000) ran for 600200 milliseconds before timing out.\n"
            for r, n in ((0, 21), (1, 21), (2, 7))
        )
    )
    for rank, heads in ((0, "['boxes', 'masks', 'kpts']"), (2, "['kpts', 'boxes', 'masks']")):
        (tmp_path / f"rank{rank}.txt").write_text(
            f'Thread {900 + rank} (idle): "MainThread"\n'
            "    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
            "    reduce_heads (/srv/det/losses.py:140)\n"
            "        Locals:\n"
            f"            heads: {heads}\n"
            "            head: <str at 0x7f00aa>\n"
            "    train_step (/srv/det/train.py:61)\n"
        )
    (finding,) = run_doctor_from([log, tmp_path / "rank0.txt", tmp_path / "rank2.txt"]).findings
    assert (finding.cause, finding.site) == (Cause.COLLECTIVE_ORDER_MISMATCH, "/srv/det/losses.py:140")
    assert (finding.ranks, finding.absent_ranks) == ([2], [0, 1])  # the sizes set rank 2 apart
    assert "`heads`" in finding.message
    # the same elements: no order to blame
    (tmp_path / "rank2.txt").write_text((tmp_path / "rank0.txt").read_text().replace("900", "902"))
    (finding,) = run_doctor_from([log, tmp_path / "rank0.txt", tmp_path / "rank2.txt"]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH


def test_a_rank_that_never_issued_it_whose_stack_computes_is_busy_not_elsewhere(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(_bucket_timeouts({1: 1, 2: 1, 3: 1}) + "[rank0]: epoch 7 validation begins\n")
    dump = tmp_path / "rank0.txt"
    dump.write_text(
        'Thread 311 (active): "MainThread"\n'
        "    conv2d (torch/nn/functional.py:120)\n"
        "    forward (/srv/gan/nets.py:52)\n"
        "    inception_score (/srv/gan/metrics.py:33)\n"
        "    on_epoch_end (/srv/gan/train.py:140)\n"
    )
    (finding,) = run_doctor_from([log, dump]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.STRAGGLER, [1, 2, 3], [0])
    assert "compute or I/O in forward() at /srv/gan/nets.py:52" in finding.message
    # in a collective of its own: another path, not busy
    dump.write_text(
        'Thread 311 (idle): "MainThread"\n'
        "    all_gather (torch/distributed/distributed_c10d.py:2947)\n"
        "    inception_score (/srv/gan/metrics.py:41)\n"
        "    on_epoch_end (/srv/gan/train.py:140)\n"
    )
    (finding,) = run_doctor_from([log, dump]).findings
    assert finding.cause is not Cause.STRAGGLER


def test_a_line_every_rank_printed_together_before_and_only_one_side_printed_last_is_their_decision(
    tmp_path: Path,
) -> None:
    def said(ranks: tuple[int, ...], step: int) -> str:
        return "".join(
            f"2026-12-01 04:{step % 60:02d}:1{r} | eval.py | [rank{r}] wall clock {1800 + r}.5 s, "
            f"running the periodic eval at step {step}\n"
            for r in ranks
        )

    parted = _parted(
        {0: ("ALLREDUCE", 2048), 1: ("ALLREDUCE", 2048), 2: ("BROADCAST", 1), 3: ("ALLREDUCE", 2048)}
    )
    log = tmp_path / "job.log"
    log.write_text(said((0, 1, 2, 3), 1200) + said((2,), 2400) + parted)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [2],
        [0, 1, 3],
    )
    assert "running the periodic eval at step 2400" in finding.message
    # every rank said it the last time too: the line explains no parting
    log.write_text(said((0, 1, 2, 3), 1200) + said((0, 1, 2, 3), 2400) + parted)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is not Cause.UNSYNCHRONIZED_DECISION


def test_a_dump_of_no_known_rank_waiting_on_its_dataloader_is_held_by_its_pipeline(tmp_path: Path) -> None:
    dump = tmp_path / "worker.txt"
    dump.write_text(
        "Process 5511: /usr/bin/python3 train.py --config big.yaml\n\n"
        'Thread 5511 (idle): "MainThread"\n'
        "    poll (multiprocessing/connection.py:257)\n"
        "    get (multiprocessing/queues.py:113)\n"
        "    _try_get_data (torch/utils/data/dataloader.py:1133)\n"
        "    _next_data (torch/utils/data/dataloader.py:1330)\n"
        "    __next__ (torch/utils/data/dataloader.py:633)\n"
        "    run_epoch (/srv/asr/train.py:412)\n"
    )
    report = run_doctor_from([dump])
    (finding,) = report.findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([], [])  # no rank is known: none is named
    assert "waits for its next batch from its data pipeline (at /srv/asr/train.py:412 in run_epoch)" in (
        finding.message
    )


_WAITING_FOR_A_BATCH = (
    'Thread {pid} (idle): "MainThread"\n'
    "    poll (multiprocessing/connection.py:257)\n"
    "    get (multiprocessing/queues.py:113)\n"
    "    _try_get_data (torch/utils/data/dataloader.py:1133)\n"
    "    __next__ (torch/utils/data/dataloader.py:633)\n"
    "    evaluate (/srv/seg/loop.py:88)\n"
)
_IN_A_BROADCAST = (
    'Thread {pid} (idle): "MainThread"\n'
    "    broadcast (torch/distributed/distributed_c10d.py:2824)\n"
    "    wrapper (torch/distributed/c10d_logger.py:83)\n"
    "    share_batch (/srv/seg/loop.py:71)\n"
    "    evaluate (/srv/seg/loop.py:90)\n"
)
_SLEEPING = 'Thread {pid} (idle): "MainThread"\n    sleep (/srv/seg/loop.py:140)\n'


@pytest.mark.parametrize(
    ("third", "said"),
    [
        (_WAITING_FOR_A_BATCH, "pid7003.txt (pid 7003) waits for the next batch from its data pipeline"),
        # a dump outside any collective and outside its pipeline: another reading fits too
        (_SLEEPING, None),
    ],
    ids=["loader", "sleep"],
)
def test_dumps_of_no_known_rank_in_collectives_beside_one_held_by_its_loader_name_that_one(
    tmp_path: Path, third: str, said: str | None
) -> None:
    """Two processes in a broadcast, one waiting for its next batch: the broadcast waits for
    a peer, and the one process seen elsewhere is held by its own loader. No rank is known,
    so none is named."""
    dumps = []
    for pid, body in ((7001, _IN_A_BROADCAST), (7002, _IN_A_BROADCAST), (7003, _WAITING_FOR_A_BATCH)):
        if pid == 7003:
            body = third
        dump = tmp_path / f"pid{pid}.txt"
        dump.write_text(f"Process {pid}: /usr/bin/python3 loop.py\n\n" + body.format(pid=pid))
        dumps.append(dump)
    report = run_doctor_from(dumps)
    if said is None:
        assert not [f for f in report.findings if f.cause == Cause.STRAGGLER], report.findings
        return
    (finding,) = report.findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([], [])
    assert said in finding.message, finding.message
    assert "while the other dumps wait in collectives (broadcast)" in finding.message


def _gloo_abort_log(before: str = "", after: str = "") -> str:
    """A 2-rank CPU job whose ranks' calls stopped matching: gloo's receive on rank 1 got more
    bytes than its call expected and gloo aborted it; rank 0's read then failed."""
    return (
        before + "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:456] "
        "op.preamble.length <= op.nbytes. 2304 vs 8\n"
        + after
        + "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "/home/me/proj/fit.py", line 88, in <module>\n'
        "[rank0]:     loss.backward()\n"
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
        "[127.0.0.1]:40122: Connection reset by peer\n"
        "E1205 10:00:03.000000 900 torch/distributed/elastic/multiprocessing/api.py:900] failed\n"
        "Failures:\n"
        "[1]:\n"
        "  time      : 2026-12-05_10:00:03\n"
        "  host      : box\n"
        "  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -15 (pid: 901)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 15 (SIGTERM) received by PID 901\n"
        "Root Cause (first observed failure):\n"
        "[0]:\n"
        "  time      : 2026-12-05_10:00:03\n"
        "  host      : box\n"
        "  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -6 (pid: 902)\n"
        "  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 902\n"
    )


def test_gloos_size_check_is_a_mismatch_of_the_calls_not_a_transport_and_sets_no_rank_apart(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text(_gloo_abort_log())
    report = run_doctor_from([log])
    finding = report.findings[0]
    assert report.verdict.value == "crash"
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH, finding
    assert finding.absent_ranks == []  # which rank parted, these lines do not say
    assert "rank 1's call expected 8 bytes and its peer's sent 2,304" in finding.message
    assert "rank 0's call, as its traceback ends: /home/me/proj/fit.py:88 in <module>" in finding.evidence
    assert finding.fix.startswith("What decides")


@pytest.mark.parametrize(
    ("said", "cause"),
    [
        ("[rank1]: skipping batch 41: loss is nan\n", Cause.DATA_DEPENDENT_BRANCH),
        ("12:00:01 WARNING rank 1 dropped a batch (ValueError: empty record)\n", Cause.RANK_EXCEPTION),
        # an out-of-memory caught and the batch skipped: an error swallowed, not a test of the data
        ("[rank1]: WARNING: ran out of memory (max len 3391), skipping batch\n", Cause.RANK_EXCEPTION),
    ],
)
def test_a_rank_that_said_it_skipped_a_step_before_the_mismatch_is_the_likely_odd_one(
    tmp_path: Path, said: str, cause: Cause
) -> None:
    log = tmp_path / "job.log"
    log.write_text(_gloo_abort_log(before="[rank0]: epoch 0 step 40 loss 0.71\n" + said))
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is cause, finding
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])
    assert "the likely reading is that rank 1 skipped that step's collectives" in finding.message


_SKIPS_A_MALFORMED_BATCH = """\
import logging

log = logging.getLogger(__name__)


def train(loader, model, rank):
    for lines in loader:
        try:
            batch = encode(lines)
        except ({caught}) as exc:
            log.warning("rank %d: {printed} (%s)", rank, exc)
            continue
        loss = model(batch)
        loss.backward()
"""


@pytest.mark.parametrize(
    ("caught", "printed", "cause"),
    [
        # fresh w05: the message of the ValueError, not its name, is in the line
        ("ValueError, KeyError", "skipping malformed batch", Cause.RANK_EXCEPTION),
        # the line printed elsewhere: the handler in the loop is not what said it
        ("ValueError, KeyError", "retrying the decode", Cause.DATA_DEPENDENT_BRANCH),
    ],
    ids=["printed-by-the-handler", "printed-elsewhere"],
)
def test_a_skip_printed_by_an_except_that_continues_around_the_call_is_a_swallowed_error(
    tmp_path: Path, caught: str, printed: str, cause: Cause
) -> None:
    """gloo's size check, and rank 1's own line before it: `skipping malformed batch (not
    enough values to unpack ...)`. With the source of rank 0's last call at hand, the
    `except` in the loop around that call, which goes on to the next pass, prints that
    line: a swallowed error (rank-exception), not a test of the data."""
    source = tmp_path / "fit.py"
    source.write_text(_SKIPS_A_MALFORMED_BATCH.format(caught=caught, printed=printed))
    said = (
        "12:00:01 WARNING rank 1: skipping malformed batch (not enough values to unpack (expected 2, got 1))"
    )
    log = tmp_path / "job.log"
    log.write_text(
        _gloo_abort_log(before=f"[rank0]: epoch 0 step 40 loss 0.71\n{said}\n").replace(
            '"/home/me/proj/fit.py", line 88, in <module>', f'"{source}", line 14, in train'
        )
    )
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is cause, finding
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])
    handler = [line for line in finding.evidence if line.startswith("the line is printed by the `except")]
    assert len(handler) == (cause is Cause.RANK_EXCEPTION)
    if handler:
        assert f"`except (ValueError, KeyError)` at {source}:10" in handler[0]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        # a loss scaler's skip is agreed on every rank, printed by one
        ("[2026-12-05 10:00:01] [INFO] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536\n", ""),
        # what a rank did after the calls parted is a consequence, not the reason
        ("", "[rank0]: dropping batch 9 after an error\n"),
    ],
    ids=["loss-scaler", "after-the-failure"],
)
def test_a_skip_that_is_agreed_or_comes_after_the_mismatch_sets_no_rank_apart(
    tmp_path: Path, before: str, after: str
) -> None:
    log = tmp_path / "job.log"
    log.write_text(_gloo_abort_log(before=before, after=after))
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert finding.absent_ranks == []


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "node3:4411:4502 [0] transport/net_ib.cc:1038 NCCL WARN NET/IB : req 0/1 tag 7 peer "
            "10.0.0.2<4242> collective mismatch error, local size 1024 remote size 4096",
            "a call expected 1,024 bytes and its peer's sent 4,096",
        ),
        (
            "node3:4411:4411 [2] init.cc:1247 NCCL WARN Mismatched collective detected, please check your "
            "collective calls at and around rank 5. You can use NCCL_DEBUG=INFO",
            "at and around rank 5",
        ),
    ],
    ids=["net-ib", "nccl-check"],
)
def test_nccls_own_reports_of_mismatched_calls_are_no_failing_network(
    tmp_path: Path, line: str, said: str
) -> None:
    log = tmp_path / "job.log"
    log.write_text(line + "\n")
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH, finding
    assert said in finding.message
    assert finding.absent_ranks == []


def _pg_watchdog_line(rank: int, seq: int, op: str, numel: int) -> str:
    return (
        f"[rank{rank}]:[E1204 22:01:13.504000000 ProcessGroupNCCL.cpp:616] [PG ID 0 PG GUID 0(default_pg) "
        f"Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, "
        f"NumelIn={numel}, NumelOut={numel}, Timeout(ms)=1800000) ran for 1800083 milliseconds "
        "before timing out."
    )


def test_ranks_timed_out_one_collective_later_had_completed_the_one_a_rank_still_waits_in(
    tmp_path: Path,
) -> None:
    # no progress line: each rank's watchdog names its oldest unfinished collective, so ranks
    # 1-3, timed out in #1841, had completed #1840, which rank 0 never did
    log = tmp_path / "job.log"
    lines = [_pg_watchdog_line(r, 1841, "ALLREDUCE", 1) for r in (1, 2, 3)]
    lines.append(_pg_watchdog_line(0, 1840, "BROADCAST", 4096))
    log.write_text("\n".join(lines) + "\n")
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH, finding
    assert (finding.ranks, finding.absent_ranks) == ([0], [1, 2, 3])
    assert "ranks 1-3 completed their own #1840" in finding.message
    assert any("from their watchdog's timeout in the next one" in line for line in finding.evidence)


def test_ranks_all_timed_out_in_one_collective_are_not_said_to_have_completed_it(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("\n".join(_pg_watchdog_line(r, 1840, "ALLREDUCE", 1) for r in (0, 1)) + "\n")
    findings = run_doctor_from([log]).findings
    assert not findings or findings[0].cause is not Cause.COLLECTIVE_ORDER_MISMATCH


SKIPS_ITS_BACKWARD = """\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fit(model, loader, optimizer):
    model = DDP(model)
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if not torch.isfinite(loss):
            continue
        loss.backward()
        optimizer.step()
"""


@pytest.mark.parametrize("at_the_backward", [True, False])
def test_a_mismatch_at_a_call_the_source_skips_under_a_branch_names_that_branch(
    tmp_path: Path, at_the_backward: bool
) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SKIPS_ITS_BACKWARD)
    line = 12 if at_the_backward else 13  # loss.backward(), or optimizer.step(): no collective
    log = tmp_path / "job.log"
    log.write_text(_gloo_abort_log().replace('"/home/me/proj/fit.py", line 88', f'"{script}", line {line}'))
    finding = run_doctor_from([log]).findings[0]
    if not at_the_backward:
        assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
        return
    assert finding.cause is Cause.DATA_DEPENDENT_BRANCH, finding
    assert finding.site is not None and finding.site.endswith("fit.py:10")
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])
    assert "The likely reading is that rank 1 took it" in finding.message


def test_ranks_the_files_say_nothing_of_are_not_set_apart_with_the_one_the_transport_found(
    tmp_path: Path,
) -> None:
    # four ranks print; only rank 0's traceback and rank 1's abort say where a call was
    script = tmp_path / "fit.py"
    script.write_text(SKIPS_ITS_BACKWARD)
    others = "".join(f"[rank{r}]: epoch 0 step 40 loss 0.7\n" for r in (2, 3))
    log = tmp_path / "job.log"
    log.write_text(
        _gloo_abort_log(before=others).replace('"/home/me/proj/fit.py", line 88', f'"{script}", line 12')
    )
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.DATA_DEPENDENT_BRANCH, finding
    assert (finding.ranks, finding.absent_ranks) == ([0], [1])


def test_srun_saying_how_its_tasks_ended_names_the_rank_the_oom_killer_took(tmp_path: Path) -> None:
    log = tmp_path / "slurm-9120.out"
    log.write_text(
        "srun --label --kill-on-bad-exit=0 python -u fit.py --launcher slurm\n"  # no rank said it stopped
        + "".join(f"{r}: [init] rank {r}/4 ready\n" for r in range(4))
        + "slurmstepd: error: Detected 1 oom_kill event in StepId=9120.0.\n"
        "srun: error: node-a: task 1: Out Of Memory\n"
        + "".join(
            f"{r}: [E ProcessGroupNCCL.cpp:737] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5120, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1800412 milliseconds "
            "before timing out.\n"
            for r in (0, 2, 3)
        )
        + "srun: error: node-a: tasks 0,2-3: Aborted (core dumped)\n"
    )
    job = read_leftovers([log])
    assert job.ranks[1].ending is not None and job.ranks[1].ending.exit_code == -9
    assert all(job.ranks[r].ending.exit_code == -6 for r in (0, 2, 3))  # type: ignore[union-attr]
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_CRASHED, [0, 2, 3], [1])
    assert "Out Of Memory" in finding.message
    # a task that exited with a code of its own is a failure too, not a watchdog's abort
    log.write_text(log.read_text().replace("task 1: Out Of Memory", "task 1: Exited with exit code 3"))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [1])
    assert "exit code 3" in finding.message


def test_one_rank_in_another_op_inside_a_phase_its_stack_shows_is_the_likely_rank_test(
    tmp_path: Path,
) -> None:
    """The watchdog lines part rank 1 (BROADCAST) from the others (ALLREDUCE); rank 1's dump is in
    export_previews() called from fit(), rank 2's at another line of fit() in no such phase."""
    log = tmp_path / "train.log"
    log.write_text(
        _watchdog(1, 900, "BROADCAST", 1024, 900, 899)
        + "".join(_watchdog(r, 900, "ALLREDUCE", 4_194_304, 905, 899) for r in (0, 2, 3))
    )

    lone = tmp_path / "rank1_pyspy.txt"
    lone.write_text(
        _pyspy_dump(
            41,
            ["export_previews (gan/visuals.py:31)", "fit (gan/loop.py:120)", "<module> (fit.py:9)"],
            "idle",
        )
    )
    other = tmp_path / "rank2_pyspy.txt"
    other.write_text(
        _pyspy_dump(
            42, ["train_step (gan/loop.py:77)", "fit (gan/loop.py:104)", "<module> (fit.py:9)"], "idle"
        )
    )
    (finding,) = run_doctor_from([log, lone, other]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [1],
        [0, 2, 3],
    )
    assert finding.site == "gan/loop.py:120" and "likely reading" in finding.message
    # without the dumps, the numbers alone say where the ranks parted, not why
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH


def test_the_fewer_side_alone_announcing_a_save_is_the_likely_rank_test(tmp_path: Path) -> None:
    """Ranks 0 and 2 (local rank 0 of two nodes) printed that they export the model and time
    out in an all-gather; ranks 1 and 3 in an all-reduce at the same number, silent."""
    log = tmp_path / "job.log"
    announced = "".join(f"[rank{r}]: exporting model weights to /ckpt/step_900\n" for r in (0, 2))
    timeouts = "".join(_watchdog(r, 611, "_ALLGATHER_BASE", 1_048_576, 611, 610) for r in (0, 2)) + "".join(
        _watchdog(r, 611, "ALLREDUCE", 2, 611, 610) for r in (1, 3)
    )
    log.write_text(announced + timeouts)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0, 2],
        [1, 3],
    )
    assert "likely reading" in finding.message and "exporting model weights" in finding.message
    # a rank of the other side said it too: the announcement does not part them
    log.write_text(announced + "[rank1]: exporting model weights to /ckpt/step_900\n" + timeouts)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is not Cause.RANK_CONDITIONAL_COLLECTIVE


def test_counts_of_batches_as_key_value_pairs_named_by_rank_in_the_text_are_loop_lengths(
    tmp_path: Path,
) -> None:
    """'eval split: rank=2 samples=3199 batches=50' with no prefix: the text's rank owns it, and
    the count is the batches', not the samples' before it."""
    log = tmp_path / "run.log"
    log.write_text(
        "".join(f"eval split: rank={r} samples={3136 + 5 * r} batches={49 + (r == 2)}\n" for r in range(3))
        + "".join(_watchdog(r, 77, "ALLGATHER", 1, 77, 76) for r in (0, 1))
        + _watchdog(2, 77, "ALLREDUCE", 1, 77, 76)
    )
    job = read_leftovers([log])
    assert sorted((x.rank, x.total) for x in job.loop_lengths) == [(0, 49), (1, 49), (2, 50)]
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.UNEVEN_EVAL_BATCHES, [0, 1], [2])


def test_a_rank_a_step_ahead_whose_last_shared_line_holds_a_zero_skipped_on_its_data(tmp_path: Path) -> None:
    """Every rank logs each step; rank 2 alone logged one more, and its line of the step
    before holds tokens=0 where the others' do not: it skipped that step's collective."""
    log = tmp_path / "out.log"
    steps = "".join(
        f"[rank{r}]: it {n} tokens={0 if (r, n) == (2, 41) else 900 + r} loss=2.{r}\n"
        for n in (40, 41)
        for r in range(4)
    )
    log.write_text(steps + "[rank2]: it 42 tokens=913 loss=2.2\n")
    dump = tmp_path / "rank1_pyspy.txt"
    dump.write_text(
        'Process 71: python lm.py\n\nThread 71 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
        "    step (lm/loop.py:64)\n"
        "    <module> (lm.py:10)\n"
    )
    (finding,) = run_doctor_from([log, dump]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.DATA_DEPENDENT_BRANCH,
        [0, 1, 3],
        [2],
    )
    assert "tokens=0" in finding.message and "likely reading" in finding.message
    # no field of its own stands out: the lines alone say it is ahead, not why
    log.write_text(steps.replace("tokens=0 ", "tokens=902 ") + "[rank2]: it 42 tokens=913 loss=2.2\n")
    (finding,) = run_doctor_from([log, dump]).findings
    assert finding.cause is not Cause.DATA_DEPENDENT_BRANCH


def test_the_side_of_a_parting_that_said_it_stopped_early_left_the_loop(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank1]: [rank 1] val_loss has not improved for 4 epochs, early stopping\n"
        + "".join(_watchdog(r, 3301, "BROADCAST", 40, 3301, 3300) for r in (0, 2, 3))
        + _watchdog(1, 3301, "ALLREDUCE", 1, 3301, 3300)
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [0, 2, 3],
        [1],
    )


def _worker_error_log(exits: str, timed_out: tuple[int, ...] = (0, 2)) -> str:
    """A job of three srun tasks whose unprefixed output holds one traceback that reached the
    script's top: a DataLoader worker's error, re-raised in the rank that owned the worker."""
    return (
        "[init] world of 3 ready\n"
        "Traceback (most recent call last):\n"
        '  File "/work/seg/train.py", line 140, in <module>\n'
        "    run(cfg)\n"
        '  File "/work/seg/train.py", line 118, in run\n'
        "    for images, masks in loader:\n"
        '  File "/opt/py/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1465, '
        "in _next_data\n"
        "    return self._process_data(data)\n"
        '  File "/opt/py/lib/python3.11/site-packages/torch/_utils.py", line 733, in reraise\n'
        "    raise exception\n"
        "KeyError: Caught KeyError in DataLoader worker process 2.\n"
        "Original Traceback (most recent call last):\n"
        '  File "/opt/py/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py", line 349, '
        "in _worker_loop\n"
        "    data = fetcher.fetch(index)\n"
        '  File "/work/seg/data.py", line 77, in __getitem__\n'
        '    mask = self.masks[record["mask_id"]]\n'
        "KeyError: 'mask_id'\n"
        "\n"
        + exits
        + "".join(
            f"[rank{r}]:[E1203 02:11:09.118000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=7731, OpType=ALLREDUCE, NumelIn=2359296, "
            "NumelOut=2359296, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n"
            for r in timed_out
        )
    )


def test_one_unowned_traceback_and_one_task_that_exited_with_a_code_are_likely_one_death(
    tmp_path: Path,
) -> None:
    """srun says task 1 exited with code 1 and the others time out; the one traceback no
    prefix owns reached the script's top: the likely reading is rank 1's uncaught error, at
    the line the DataLoader worker raised it (its original traceback), said as likely. Two
    tasks that exited leave the traceback unassigned."""
    log = tmp_path / "slurm-3301.out"
    log.write_text(_worker_error_log("srun: error: node-c: task 1: Exited with exit code 1\n"))
    finding = run_doctor_from([log]).findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_EXCEPTION, [0, 2], [1])
    assert finding.site == "/work/seg/data.py:77", finding
    assert "KeyError: 'mask_id'" in finding.message and "likely" in finding.message, finding.message
    log.write_text(
        _worker_error_log(
            "srun: error: node-c: task 1: Exited with exit code 1\n"
            "srun: error: node-c: task 2: Exited with exit code 1\n",
            timed_out=(0,),
        )
    )
    finding = run_doctor_from([log]).findings[0]
    assert finding.site != "/work/seg/data.py:77", finding


def test_rank_0_alone_at_an_earlier_line_of_the_function_the_others_wait_further_in(tmp_path: Path) -> None:
    """Rank 0's watchdog line is an all-gather, ranks 1-3's an all-reduce at the same number.
    One file, named for two ranks, holds two dumps: its name places neither; rank 0's pid is
    tied by torchelastic's line, the other is a dump of no known rank, in a barrier at a
    later line of the function rank 0 waits in (export_weights at line 77, the barrier at 81):
    the others went past line 77 without its collective, rank 0 alone took it, the likely
    rank test, said as likely and sited at rank 0's line."""
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 3120, "_ALLGATHER_BASE", 8_388_608, 3120, 3119)
        + "".join(_watchdog(r, 3120, "ALLREDUCE", 1, 3120, 3119) for r in (1, 2, 3))
        + "run.py FAILED\n"
        "Failures:\n  <NO_OTHER_FAILURES>\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  time      : 2025-01-05_10:00:00\n  host      : gpu-7\n  rank      : 0 (local_rank: 0)\n"
        "  exitcode  : -6 (pid: 7001)\n  error_file: <N/A>\n"
        "  traceback : Signal 6 (SIGABRT) received by PID 7001\n"
    )

    both = tmp_path / "stacks_rank0_rank2.txt"
    both.write_text(
        _pyspy_dump(
            7001,
            [
                "all_gather_into_tensor (torch/distributed/distributed_c10d.py:2897)",
                "_unshard (torch/distributed/fsdp/_runtime_utils.py:326)",
                "state_dict (torch/nn/modules/module.py:1866)",
                "export_weights (run.py:77)",
                "main (run.py:140)",
                "<module> (run.py:150)",
            ],
        )
        + "\n"
        + _pyspy_dump(
            7003,
            [
                "barrier (torch/distributed/distributed_c10d.py:3702)",
                "export_weights (run.py:81)",
                "main (run.py:140)",
                "<module> (run.py:150)",
            ],
        )
    )
    finding = run_doctor_from([log, both]).findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        [1, 2, 3],
    )
    assert finding.site == "run.py:77" and "likely reading" in finding.message, finding
    # the dump of no known rank is never said to be rank 0's or rank 2's
    assert "rank 0's stack is at run.py:77" in finding.message.lower() and "no known rank" in finding.message


def test_a_watchdog_line_whose_rank_is_its_groups_is_no_position_of_the_default_group(tmp_path: Path) -> None:
    """`[rank9]:... [Rank 1] Watchdog caught ...`: rank 9's line gives its rank in the group of
    the work, so that work is on a group the line does not name, and its number (#412) is
    that group's: no position of the default group's #90311 that ranks 0-3 time out at. No
    order mismatch is read from the two numbers. Rank 9's NCCL reported its transport failing
    before the timeouts: the network, rank 9 the rank the evidence is about."""

    def timeout(prefix: int, inner: int, seq: int, op: str, numel: int) -> str:
        return (
            f"[rank{prefix}]:[E ProcessGroupNCCL.cpp:563] [Rank {inner}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
            "Timeout(ms)=600000) ran for 600100 milliseconds before timing out.\n"
        )

    lines = timeout(9, 1, 412, "_REDUCE_SCATTER_BASE", 65536) + "".join(
        timeout(r, r, 90311, "ALLREDUCE", 4096) for r in range(4)
    )
    log = tmp_path / "job.log"
    log.write_text(lines)
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is not Cause.COLLECTIVE_ORDER_MISMATCH, finding
    log.write_text(
        "[rank9]:[E ProcessGroupNCCL.cpp:1316] [PG 3 Rank 1] NCCL watchdog thread terminated with "
        "exception: NCCL error: remote process exited or there was a network error, NCCL version 2.21.5\n"
        + lines
    )
    finding = run_doctor_from([log]).findings[0]
    assert (finding.cause, finding.ranks) == (Cause.TRANSPORT_HANG, [9]), finding
    assert "transport failing on rank 9" in finding.message


def test_sizes_of_their_own_against_a_majority_set_those_ranks_apart(tmp_path: Path) -> None:
    """Five ranks at one all-gather: three with 4096 elements, rank 2 with 2992, rank 4 with
    3376. One size on more than half the ranks: the two others are the odd ones on the
    numbers' face. Two with 4096 of four, the other two each with a size of its own: no size
    on a majority, no rank set apart."""
    log = tmp_path / "job.log"
    sizes = {0: 4096, 1: 4096, 2: 2992, 3: 4096, 4: 3376}
    log.write_text("".join(_watchdog(r, 1873, "ALLGATHER", n, 1873, 1872) for r, n in sizes.items()))
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([2, 4], [0, 1, 3]), finding
    sizes = {0: 4096, 1: 4096, 2: 2992, 3: 3376}
    log.write_text("".join(_watchdog(r, 1873, "ALLGATHER", n, 1873, 1872) for r, n in sizes.items()))
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH
    assert finding.absent_ranks == [], finding


def test_the_oom_killers_pid_is_the_rank_a_launcher_or_a_line_ties_it_to(tmp_path: Path) -> None:
    """dmesg says the OOM killer took pid 60417; DeepSpeed's launcher on node-b (node rank 1
    of 2, four processes each) started pid 60417 as local rank 2: rank 6, killed, while the
    others timed out waiting. Without the launcher's lines, a `rank 6 pid 60417` line ties
    it the same way; with neither, nothing names the rank."""
    launcher = tmp_path / "launcher.log"
    launcher.write_text(
        "".join(
            f"{host}: [2025-02-01 08:00:01,000] [INFO] [launch.py:152:main] nnodes=2, num_local_procs=4, "
            f"node_rank={node}\n"
            + "".join(
                f"{host}: [2025-02-01 08:00:02,000] [INFO] [launch.py:256:main] process {pid0 + local} "
                f"spawned with command: ['/usr/bin/python', '-u', 'train.py', '--local_rank={local}']\n"
                for local in range(4)
            )
            for host, node, pid0 in (("node-a", 0, 30100), ("node-b", 1, 60415))
        )
        + "".join(_watchdog(r, 5120, "ALLREDUCE", 1048576, 5120, 5119) for r in (0, 1, 2, 3, 4, 5, 7))
    )
    dmesg = tmp_path / "dmesg.txt"
    dmesg.write_text(
        "[Sat Feb  1 09:12:40 2025] Out of memory: Killed process 60417 (python) total-vm:98765432kB, "
        "anon-rss:87654321kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:170000kB oom_score_adj:0\n"
    )
    finding = run_doctor_from([launcher, dmesg]).findings[0]
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [6]), finding
    assert "OOM killer" in finding.message
    tied = tmp_path / "job.log"
    tied.write_text(
        "rank 6 pid 60417\n"
        + "".join(_watchdog(r, 5120, "ALLREDUCE", 1048576, 5120, 5119) for r in (0, 1, 2, 3, 4, 5, 7))
    )
    finding = run_doctor_from([tied, dmesg]).findings[0]
    assert (finding.cause, finding.absent_ranks) == (Cause.RANK_CRASHED, [6]), finding
    tied.write_text(
        "".join(_watchdog(r, 5120, "ALLREDUCE", 1048576, 5120, 5119) for r in (0, 1, 2, 3, 4, 5, 7))
    )
    finding = run_doctor_from([tied, dmesg]).findings[0]
    assert finding.cause is not Cause.RANK_CRASHED, finding


def test_a_rank_that_never_issued_it_waiting_on_its_own_gpu_is_the_likely_straggler(tmp_path: Path) -> None:
    """Ranks 0, 1 and 3 time out in the barrier's all-reduce; rank 2 left no watchdog line
    (no collective of its own pending) and its dump is in torch.cuda.synchronize() under the
    script's timer: it waits for its own GPU, not a peer. A straggler on its own device, the
    likely reading, not a collective skipped under a test."""
    log = tmp_path / "job.log"
    log.write_text("".join(_watchdog(r, 337508, "ALLREDUCE", 1, 337508, 337507) for r in (0, 1, 3)))
    dump = tmp_path / "rank2_pyspy.txt"
    dump.write_text(
        'Process 9102: python train.py\n\nThread 9102 (active): "MainThread"\n'
        "    synchronize (torch/cuda/__init__.py:954)\n"
        "    stop (utils/timing.py:22)\n"
        "    train_step (train.py:238)\n"
        "    main (train.py:301)\n"
        "    <module> (train.py:330)\n"
    )
    finding = run_doctor_from([log, dump]).findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.STRAGGLER, [0, 1, 3], [2]), finding
    assert "its own GPU's work" in finding.message and "likely" in finding.message


def test_a_servers_how_to_quit_line_is_no_rank_saying_it_stopped(tmp_path: Path) -> None:
    """Rank 0 serves: its last line before the timeouts is uvicorn's "(Press CTRL+C to quit)",
    how to stop the server, not a stop; the ops at #37 differ. Not rank-early-exit."""
    log = tmp_path / "serve.log"
    log.write_text(
        "[rank0]: INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n"
        + _watchdog(0, 37, "BROADCAST", 1, 39, 36)
        + "".join(_watchdog(r, 37, "ALLREDUCE", 64, 38, 36) for r in (1, 2, 3))
    )
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is not Cause.RANK_EARLY_EXIT, finding
    assert "stopped" not in finding.message, finding


def test_a_rank_its_launcher_stopped_before_the_timeouts_is_not_set_apart_by_its_silence(
    tmp_path: Path,
) -> None:
    """Node B's rank 5 reports its IB transport failing and aborts; node B's agent stops its
    other processes (rank 4 among them, which printed its step lines) before node A's ranks
    0-3 time out. Rank 4's lines without a timeout do not say it never issued the collective:
    it was stopped before its watchdog could fire. The network, rank 5 the rank it is about."""
    log = tmp_path / "job.log"
    log.write_text(
        "[rank4]: step 900 loss 2.31\n"
        "[rank5]:[E ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0 Rank 5] Process group watchdog thread "
        "terminated with exception: NCCL error: remote process exited or there was a network error\n"
        "W0212 03:05:11.208000 901 torch/distributed/elastic/multiprocessing/api.py:897] Sending process "
        "9904 closing signal SIGTERM\n"
        + "".join(_watchdog(r, 7712, "ALLREDUCE", 4194304, 7713, 7711) for r in range(4))
    )
    finding = run_doctor_from([log]).findings[0]
    assert (finding.cause, finding.ranks) == (Cause.TRANSPORT_HANG, [5]), finding
    assert 4 not in finding.absent_ranks


def test_rank_0_in_an_evaluation_and_another_process_in_the_training_loop_is_the_likely_rank_test(
    tmp_path: Path,
) -> None:
    """Rank 0's watchdog line is a 3-element all-reduce, ranks 1-3's a broadcast at the same
    number. Rank 0's dump (its pid tied by a line) is in evaluate() called from fit() at line
    167; another process's dump, tied to no rank and in no collective (at a line whose
    source is not here), is at line 161 of fit(): with rank 0 alone on its side and dumped,
    that process is one of the others. evaluate() under a rank test, as the likely reading."""
    log = tmp_path / "job.log"
    log.write_text(
        "rank 0 pid 52214\n"
        + _watchdog(0, 12011, "ALLREDUCE", 3, 12011, 12010)
        + "".join(_watchdog(r, 12011, "BROADCAST", 53120, 12011, 12010) for r in (1, 2, 3))
    )

    dumps = tmp_path / "pyspy_two.txt"
    dumps.write_text(
        _pyspy_dump(
            52214,
            [
                "all_reduce (torch/distributed/distributed_c10d.py:2050)",
                "evaluate (train.py:115)",
                "fit (train.py:167)",
                "<module> (train.py:249)",
            ],
        )
        + "\n"
        + _pyspy_dump(52215, ["fit (train.py:161)", "<module> (train.py:249)"])
    )
    finding = run_doctor_from([log, dumps]).findings[0]
    assert (finding.cause, finding.ranks, finding.site) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        "train.py:167",
    )
    assert "another process: one of ranks 1-3" in finding.message


def test_the_same_names_printed_in_another_order_on_each_rank_are_an_order_mismatch(tmp_path: Path) -> None:
    """Two ranks all-reduce 1024 elements at #9, two others 65536: two calls. Each rank
    printed the list of metrics it syncs, the same four names in its own order: the calls
    differ because the order does, and the lists say so. Without the printed lists, or with
    the same order printed on every rank, the sizes part the ranks but no order is read
    from lists, and two against two sets no rank apart."""

    def run(orders: dict[int, list[str]]) -> tuple[Cause, str, list[int]]:
        log = tmp_path / "job.log"
        log.write_text(
            "".join(f"[rank{r}]: syncing metrics {names!r}\n" for r, names in orders.items())
            + "".join(_watchdog(r, 9, "ALLREDUCE", 1024 if r in (0, 3) else 65536, 9, 8) for r in range(4))
        )
        finding = run_doctor_from([log]).findings[0]
        return finding.cause, finding.message, finding.absent_ranks

    names = ["loss_sum", "hist", "area_union", "count"]
    cause, message, _ = run({r: names[r:] + names[:r] for r in range(4)})
    assert cause is Cause.COLLECTIVE_ORDER_MISMATCH and "syncing metrics" in message
    for orders in ({}, {r: names for r in range(4)}):
        cause, message, apart = run(orders)
        assert (cause, apart) == (Cause.COLLECTIVE_ORDER_MISMATCH, []) and "syncing metrics" not in message


def test_numbers_far_apart_and_point_to_point_ops_are_of_other_groups_than_the_lines_say(
    tmp_path: Path,
) -> None:
    """Older watchdog lines name no group. Ranks 0-1 time out in a SEND at #3712901, ranks 2-3
    in a one-element ALLREDUCE at #14, ranks 4-5 in an ALLREDUCE at #7425802: within one group
    every rank's number moves with the others', so numbers millions apart are of different
    groups, and a send moves only its own rank's. No rank completed collectives another
    never made: no order is read from these numbers."""

    def line(rank: int, seq: int, op: str, numel: int) -> str:
        return (
            f"{rank:2d}: [E ProcessGroupNCCL.cpp:828] [Rank {rank}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel}, "
            "Timeout(ms)=600000) ran for 600312 milliseconds before timing out.\n"
        )

    log = tmp_path / "slurm-88.out"
    log.write_text(
        line(0, 3712901, "SEND", 16777216)
        + line(1, 3712901, "SEND", 16777216)
        + line(2, 14, "ALLREDUCE", 1)
        + line(3, 14, "ALLREDUCE", 1)
        + line(4, 7425802, "ALLREDUCE", 16777216)
        + line(5, 7425802, "ALLREDUCE", 16777216)
    )
    for finding in run_doctor_from([log]).findings:
        assert "completed their own" not in finding.message, finding
        assert finding.cause is not Cause.COLLECTIVE_ORDER_MISMATCH, finding


def _srun_watchdog(rank: int, seq: int, numel: int) -> str:
    """One rank's watchdog line as torch 2.1 prints it, under srun's task label."""
    return (
        f"{rank}: [E ProcessGroupNCCL.cpp:475] [Rank {rank}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=1800000) "
        "ran for 1800412 milliseconds before timing out.\n"
    )


def test_ranks_that_said_they_stopped_and_wait_in_a_collective_of_their_own_left_the_loop(
    tmp_path: Path,
) -> None:
    log = tmp_path / "slurm-811.out"
    steps = "".join(f"0: step {n} | loss 2.{n % 7} | 1.9 s/it\n" for n in range(870, 880))
    # ranks 3 and 5 each read their own clock; the rest trained on into the next step's buckets
    stops = "".join(
        f"{r}: [rank {r}] time budget of 4h used up at step 880: stopping training\n" for r in (3, 5)
    )
    theirs = _srun_watchdog(3, 31, 1) + _srun_watchdog(5, 31, 1)
    others = "".join(_srun_watchdog(r, 90112, 2_359_296) for r in (0, 1, 2, 4, 6, 7))
    log.write_text(steps + stops + others + theirs)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [3, 5],
        [0, 1, 2, 4, 6, 7],
    )
    assert "ALLREDUCE #31" in finding.message and "time budget" in finding.message
    # one rank whose loop ended, no decision's words: its loop's length
    log.write_text(
        steps
        + "3: [rank 3] shard exhausted at step 880, leaving the loop\n"
        + "".join(_srun_watchdog(r, 90112, 2_359_296) for r in (0, 1, 2))
        + _srun_watchdog(3, 31, 1)
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks) == (Cause.RANK_EARLY_EXIT, [3])
    # a rank that said nothing waits beside them: the words do not part the ranks
    log.write_text(steps + stops + others.replace("SeqNum=90112", "SeqNum=31", 1) + theirs)
    for finding in run_doctor_from([log]).findings:
        assert finding.ranks != [3, 5], finding.message


def test_torchruns_local_prefixes_on_a_second_node_are_its_ranks_from_the_nodes_first(tmp_path: Path) -> None:
    """`--tee`'s `[defaultN]:` is the local rank: on the second node of four processes each,
    a line that pairs it with the rank's own prefix (`[default0]:[rank4]:`) gives the node's
    first rank, and the process that said it had nothing to do and returned is rank 7."""
    node = tmp_path / "node1.log"
    node.write_text(
        "[default2]: step 0 loss 2.31\n"
        "[default3]: shard list empty for this process, nothing to do -> returning\n"
        + "".join(
            f"[default{local}]:[rank{4 + local}]:[E1112 08:41:55.29 ProcessGroupNCCL.cpp:616] "
            f"[Rank {4 + local}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=10485760, NumelOut=10485760, Timeout(ms)=600000) "
            "ran for 600085 milliseconds before "
            "timing out.\n"
            for local in range(3)
        )
    )
    job = read_leftovers([node])
    assert sorted(r for r, rec in job.ranks.items() if rec.timeouts) == [4, 5, 6]
    assert [o.rank for o in job.stop_lines] == [7]
    # no line pairs the two: the prefix reads as the rank (one node, as most posts are)
    node.write_text("[default3]: shard list empty for this process, nothing to do -> returning\n")
    assert [o.rank for o in read_leftovers([node]).stop_lines] == [3]


def _watchdog_1_13(rank: int, seq: int, op: str) -> str:
    """torch 1.13's watchdog line, no sizes, under a logger's rank tag."""
    return (
        f"rank{rank} | [E ProcessGroupNCCL.cpp:821] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, Timeout(ms)=1800000) ran for 1800310 milliseconds "
        "before timing out.\n"
    )


def test_ranks_that_said_they_stopped_at_one_number_with_the_others_made_another_call(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    scores = "".join(f"[rank{r}] epoch 11 dev_acc=0.8{r} best=0.8{r}\n" for r in range(4))
    stops = "[rank1] no gain in 5 evals, stopping early\n[rank3] no gain in 5 evals, stopping early\n"
    timeouts = "".join(_watchdog_1_13(r, 9120, "ALLREDUCE") for r in range(4))
    log.write_text(scores + stops + "[rank0] epoch 12 step 0\n" + timeouts)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [1, 3],
        [0, 2],
    )
    # ranks 0 and 2 print nothing of their own: their silence on the stop says nothing
    log.write_text("[rank1] no gain in 5 evals, stopping early\n" + timeouts)
    assert all(f.ranks != [1] for f in run_doctor_from([log]).findings)


def test_ranks_that_never_issued_a_call_for_no_reason_shown_are_a_rank_test_only_where_one_could_pick_them(
    tmp_path: Path,
) -> None:
    """The numbers alone: some ranks issued a collective, the others never did, and nothing
    here says why. Rank 0 alone apart: a call under a rank test is the likely reading (an
    error, with how to find the reason). Ranks 1 and 2 of 4 apart: no rank test picks them,
    so no cause is said as found (a warning that says where the ranks parted)."""
    log = tmp_path / "job.log"
    log.write_text(
        "".join(_watchdog(r, 9001, "ALLREDUCE", 1024, 9001, 9000) for r in (1, 2, 3)) + "[rank0]: step 5\n"
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        Severity.ERROR,
        [0],
    )
    log.write_text(
        "".join(_watchdog(r, 9001, "ALLREDUCE", 1024, 9001, 9000) for r in (0, 3))
        + "[rank1]: step 5\n[rank2]: step 5\n"
    )
    findings = run_doctor_from([log]).findings
    assert all(f.severity is not Severity.ERROR for f in findings), [f.message for f in findings]


def test_a_lone_rank_that_said_it_skipped_a_batch_is_the_side_that_issued_another_op(tmp_path: Path) -> None:
    """torch 1.13's lines, no sizes: ranks 0-2 all-reduce at #5120, rank 3 broadcasts
    (DDP's buffers at its next forward): it said it skipped a batch before."""
    log = tmp_path / "train.log"
    log.write_text(
        "rank3 | skipping batch 812: loss is nan\n"
        + "".join(_watchdog_1_13(r, 5120, "ALLREDUCE") for r in range(3))
        + _watchdog_1_13(3, 5120, "BROADCAST")
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.DATA_DEPENDENT_BRANCH, [3])


def test_the_side_that_said_it_stopped_is_found_whichever_side_it_is(tmp_path: Path) -> None:
    """One rank against one: rank 1 stopped early and waits in its final barrier (one
    element), rank 0 in the next epoch's bucket: rank 1's words set it apart."""
    log = tmp_path / "train.log"
    log.write_text(
        "[rank1]: patience exhausted, early stopping at epoch 9\n"
        + _watchdog(0, 8801, "ALLREDUCE", 2_359_296, 8801, 8800)
        + _watchdog(1, 8801, "ALLREDUCE", 1, 8801, 8800)
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.UNSYNCHRONIZED_DECISION, [1])


def test_a_bar_behind_a_loggers_rank_tag_and_a_label_behind_a_timestamp_are_read(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text(
        "".join(
            f"{r}: [rank{r}] validate: 100%|██████████| {61 if r else 62}/{61 if r else 62} [00:31<00:00]\n"
            for r in range(2)
        )
        + "09:14:02 1: Traceback (most recent call last):\n"
        + '09:14:02 1:   File "/srv/fit.py", line 40, in <module>\n'
        + "09:14:02 1: ValueError: bad crop\n"
    )
    job = read_leftovers([log])
    assert sorted((x.rank, x.total) for x in job.loop_lengths) == [(0, 62), (1, 61)]
    ending = job.ranks[1].ending
    assert ending is not None and ending.error == "ValueError: bad crop"


def test_a_rank_dumped_in_the_collective_the_others_timed_out_in_waits_with_them(tmp_path: Path) -> None:
    """Ranks 1 and 2 timed out in the first barrier's all-reduce; rank 3 was dumped in that
    barrier (its own line not pasted) and rank 0 tokenizing: rank 0 alone never issued it,
    and its stack says it was busy."""
    log = tmp_path / "job.log"
    log.write_text("WORLD_SIZE=4\n" + "".join(_watchdog(r, 2, "ALLREDUCE", 1, 2, 1) for r in (1, 2)))
    (tmp_path / "rank_3.txt").write_text(
        'Thread 7 (idle): "MainThread"\n    barrier (torch/distributed/distributed_c10d.py:4159)\n'
        "    main_process_first (transformers/training_args.py:2409)\n    main (prep.py:50)\n"
    )
    (tmp_path / "rank_0.txt").write_text(
        'Thread 5 (active): "MainThread"\n    encode (tokenizers/implementations/base.py:90)\n'
        "    tokenize (prep.py:31)\n    main (prep.py:52)\n"
    )
    (finding,) = run_doctor_from([log, tmp_path / "rank_3.txt", tmp_path / "rank_0.txt"]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.STRAGGLER, [0])


def test_a_startup_line_that_says_the_jobs_size_ties_its_pid_to_its_rank(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_text("[2024-02-07 12:01:55] rank 2 | world_size=4 pid=31209 device=cuda:2\n")
    assert read_leftovers([log]).ranks[2].pid == 31209
