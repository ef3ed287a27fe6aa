"""doctor --from on what people paste: excerpts of stack dumps with no header, other
launchers' prefixes, multi-line log records, a failed collective's stack trace cut from
its timeout line. The fixtures are written here, in the shapes posted evidence takes."""

from __future__ import annotations

from pathlib import Path

from ncclcheck.causes import Cause
from ncclcheck.commands.doctor import run_doctor_from
from ncclcheck.evidence.aftermath import FR_ROWS
from ncclcheck.evidence.dumps import is_user_path
from ncclcheck.evidence.logs import read_leftovers
from ncclcheck.evidence.stacks import blocking

# py-spy's frames, innermost first, cut from a dump: no Process or Thread line, padded
# with trailing spaces, with a frame elided ("... ") and the poster's note on one
PY_SPY_EXCERPT = (
    "wait (torch/distributed/distributed_c10d.py:4120)   \n"  # padded, as copied from a terminal
    """barrier (torch/distributed/distributed_c10d.py:4101)
    ... save_best (trainer/checkpoint.py:88)   <-- rank 0 never gets here
run_epoch (trainer/loop.py:142)
main (train.py:61)
<module> (train.py:80)
"""
)


def test_a_py_spy_excerpt_with_no_header_is_one_thread_of_one_process(tmp_path: Path) -> None:
    unnamed = tmp_path / "stuck.txt"
    unnamed.write_text(PY_SPY_EXCERPT)
    job = read_leftovers([unnamed])
    (unplaced,) = job.unplaced  # no rank in its name or lines: a process of no known rank
    main = unplaced.stack.main
    assert main is not None
    assert [f.function for f in main.frames] == [
        "wait",
        "barrier",
        "save_best",
        "run_epoch",
        "main",
        "<module>",
    ]
    assert main.frames[2].file.endswith("trainer/checkpoint.py") and main.frames[2].line == 88
    named = tmp_path / "rank_5.txt"
    named.write_text(PY_SPY_EXCERPT)
    assert read_leftovers([named]).ranks[5].stack is not None


def test_an_excerpt_drawn_as_a_tree_is_read_outermost_first(tmp_path: Path) -> None:
    tree = tmp_path / "tree.txt"
    tree.write_text(
        "train (fit.py:30)\n"
        "  └─ validate (fit.py:55)\n"
        "      └─ gather_metrics (metrics.py:12)\n"
        "          └─ all_gather (torch/distributed/distributed_c10d.py:3300)  (blocked)\n"
    )
    (unplaced,) = read_leftovers([tree]).unplaced
    assert unplaced.stack.main is not None
    assert [f.function for f in unplaced.stack.main.frames] == [
        "all_gather",
        "gather_metrics",
        "validate",
        "train",
    ]


def test_a_traceback_cut_from_a_stack_dump_is_a_stack_and_one_with_its_exception_a_crash(
    tmp_path: Path,
) -> None:
    frames = (
        'File "/srv/app/train.py", line 70, in <module>\n'
        "    fit()\n"
        '  File "/srv/app/train.py", line 41, in fit\n'
        "    sync_metrics(m)\n"
        '  File "/opt/venv/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2501, '
        "in all_reduce\n"
        "    work.wait()\n"
    )
    stack = tmp_path / "rank2_pystack.txt"
    stack.write_text(frames + "(the other ranks were already in the next epoch)\n")
    record = read_leftovers([stack]).ranks[2]
    assert record.ending is None  # the poster's words are no exception
    assert record.stack is not None and record.stack.main is not None
    assert record.stack.main.frames[0].function == "all_reduce"  # innermost first, as every stack
    crashed = tmp_path / "rank2_error.txt"
    crashed.write_text(frames + "RuntimeError: Connection closed by peer\n")
    record = read_leftovers([crashed]).ranks[2]
    assert record.ending is not None and record.ending.error == "RuntimeError: Connection closed by peer"


def test_other_launchers_prefixes_name_the_rank(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank=1] || Traceback (most recent call last):\n"
        '[rank=1] ||   File "/w/train.py", line 12, in <module>\n'
        "[rank=1] || ValueError: empty batch\n"
        "[Rank 3] Traceback (most recent call last):\n"
        '[Rank 3]   File "/w/train.py", line 19, in <module>\n'
        "[Rank 3] KeyError: 'image'\n"
        # Open MPI's mpirun --tag-output: [job,rank]<stream>:
        "[1,2]<stderr>:Traceback (most recent call last):\n"
        '[1,2]<stderr>:  File "/w/train.py", line 30, in <module>\n'
        "[1,2]<stderr>:OSError: truncated image\n"
    )
    job = read_leftovers([log])
    assert job.ranks[1].ending is not None and job.ranks[1].ending.error == "ValueError: empty batch"
    assert job.ranks[3].ending is not None and job.ranks[3].ending.error == "KeyError: 'image'"
    assert job.ranks[2].ending is not None and job.ranks[2].ending.error == "OSError: truncated image"


def test_a_workers_exception_and_its_live_stack_are_an_exception_it_lived_through(tmp_path: Path) -> None:
    """A serving engine's worker logs its exception under a prefix on the first line only
    and goes on; a py-spy dump of the same pid shows it alive, idle in its loop."""
    error = tmp_path / "worker1.log"
    error.write_text(
        "(Worker_TP1 pid=4242) ERROR 03-02 11:00:01 [executor.py:310] step failed\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/engine/runner.py", line 90, in execute\n'
        "    out = self.model(batch)\n"
        '  File "/srv/engine/kernels.py", line 14, in launch\n'
        "    torch.cuda.synchronize()\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    dump = tmp_path / "worker1_pyspy.txt"
    dump.write_text("Process 4242: python -m engine.worker\n    recv_loop (engine/ipc.py:51)\n")
    waiting = tmp_path / "worker0_pyspy.txt"
    waiting.write_text(
        "Process 4241: python -m engine.worker\n    all_reduce (torch/distributed/distributed_c10d.py:2501)\n"
    )
    report = run_doctor_from([error, dump, waiting])
    (finding,) = report.findings
    assert finding.cause is Cause.RANK_EXCEPTION
    assert finding.absent_ranks == [1]
    assert "lived on" in finding.message and "recv_loop()" in finding.message


def test_a_worker_that_died_of_its_exception_stays_a_crash(tmp_path: Path) -> None:
    error = tmp_path / "worker1.log"
    error.write_text(
        "(Worker_TP1 pid=4242) ERROR 03-02 11:00:01 [executor.py:310] step failed\n"
        "Traceback (most recent call last):\n"
        '  File "/srv/engine/runner.py", line 90, in execute\n'
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    (finding,) = run_doctor_from([error]).findings  # no stack of it: nothing says it lived
    assert finding.cause is Cause.RANK_CRASHED


def test_dumps_of_no_known_rank_one_in_backward_one_after_the_loop_read_as_uneven_batches(
    tmp_path: Path,
) -> None:
    ahead = tmp_path / "group_a.txt"
    ahead.write_text(
        "_engine_run_backward (torch/autograd/graph.py:825)\n"
        "backward (torch/autograd/__init__.py:347)\n"
        "backward (torch/_tensor.py:581)\n"
        "training_step (model.py:77)\n"
    )
    behind = tmp_path / "group_b.txt"
    behind.write_text(
        "all_reduce (torch/distributed/distributed_c10d.py:2501)\nvalidation_epoch_end (model.py:120)\n"
    )
    (finding,) = run_doctor_from([ahead, behind]).findings
    assert finding.cause is Cause.UNEVEN_EVAL_BATCHES
    assert (finding.ranks, finding.absent_ranks) == ([], [])  # no rank is known: none is named
    assert "group_a.txt in a training step's backward" in finding.message
    assert "likely reading" in finding.message
    # both in the same collective: no divergence between them, no cause
    behind.write_text(ahead.read_text())
    assert not run_doctor_from([ahead, behind]).findings


def test_a_failed_collectives_stack_trace_under_a_damaged_prefix_is_read(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank5[]:[E1102 10:00:00.1 ProcessGroupNCCL.cpp:733] Stack trace of the failed collective: \n"
        "#0 all_gather_into_tensor from "
        "/env/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:3790\n"
        "#1 wrapper from /env/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:83\n"
        "#2 gather_kv from /env/lib/python3.12/site-packages/servelib/parallel.py:211\n"
        "#3 step from /env/lib/python3.12/site-packages/servelib/worker.py:90\n"
    )
    report = run_doctor_from([log])
    (state,) = [r for r in report.ranks if r.rank == 5]
    assert "all_gather_into_tensor" in state.where and "servelib/parallel.py:211" in state.where
    assert "no watchdog timeout" not in state.where


def _timeout(rank: int, seq: int) -> str:
    return (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
        "timeout: "
        f"WorkNCCL(SeqNum={seq}, OpType=BARRIER, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for "
        "1800087 milliseconds before timing out.\n"
    )


def test_a_ranks_bar_spliced_with_anothers_watchdog_line_sets_the_busy_rank_apart(tmp_path: Path) -> None:
    """Rank 1 tokenizes (its bar, unfinished) while ranks 0, 2 and 3 time out in a
    barrier; rank 2's watchdog line was written into the middle of rank 1's bar."""
    log = tmp_path / "train.log"
    log.write_text(
        "[rank1]:Tokenizing train split:  41%|████      | 41000/100000 [29:50<42:57, 22.9 ex/s]"
        + _timeout(2, 7)
        + _timeout(0, 7)
        + _timeout(3, 7)
    )
    report = run_doctor_from([log])
    (finding,) = report.findings
    assert finding.cause is Cause.STRAGGLER
    assert (finding.ranks, finding.absent_ranks) == ([0, 2, 3], [1])
    assert "Tokenizing train split" in finding.message
    assert report.summary["spliced"] == [
        f"{log}:1: two ranks' output in one line, each rank's part read as its own line"
    ]


def test_work_announced_before_a_lone_timeout_is_the_likely_straggler_only_where_one_rank_is_unseen(
    tmp_path: Path,
) -> None:
    log = tmp_path / "train.log"
    building = "Building the retrieval index over 48000000 passages ..."
    # rank 1 timed out, rank 0 left nothing and the line untagged before it opens long work:
    # rank 0 busy with it is the likely reading, said as such, with what would confirm it
    log.write_text(f"epoch 3 done\n{building}\n" + _timeout(1, 12))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.severity.value) == (Cause.STRAGGLER, "error")
    assert (finding.ranks, finding.absent_ranks) == ([1], [0])
    assert f"'{building}'" in finding.message
    assert "rank 0's stack or its own log confirms it" in finding.message
    # rank 2's timeout: ranks 0 and 1 unseen, and which printed the line, nothing says
    log.write_text(f"epoch 3 done\n{building}\n" + _timeout(2, 12))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", [])
    assert f"'{building}'" in finding.message and "likely reading (a straggler)" in finding.message
    # nothing opened before the timeout: one rank's timeout sets no rank apart
    log.write_text("epoch 3 done\nstep 12000 loss 1.873\n" + _timeout(1, 12))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.severity.value, finding.absent_ranks) == ("warning", [])


def _watchdog(rank: int, seq: int, op: str, numel: int) -> str:
    return (
        f"[rank{rank}]:[E ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation "
        f"timeout: WorkNCCL(SeqNum={seq}, OpType={op}, NumelIn={numel}, NumelOut={numel * 4}, "
        "Timeout(ms)=600000) ran for 600099 milliseconds before timing out.\n"
    )


def test_other_sizes_in_a_collective_issued_for_the_parameters_read_as_other_modules_run(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "".join(_watchdog(r, 811, "_REDUCE_SCATTER_BASE", 4096 if r == 2 else 1024) for r in range(4))
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.DATA_DEPENDENT_BRANCH
    assert "ran other modules" in finding.message and "likely reading" in finding.message


def test_other_sizes_in_a_users_small_all_reduce_stay_a_shape_mismatch(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(_watchdog(r, 40, "ALLREDUCE", 3 if r == 1 else 5) for r in range(4)))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH


def test_details_check_on_gradient_buckets_of_other_sizes_reads_as_other_modules_run(tmp_path: Path) -> None:
    line = (
        "[rank{r}]: RuntimeError: Detected mismatch between collectives on ranks. Rank {r} is running "
        "collective: CollectiveFingerPrint(SequenceNumber=77, OpType=ALLREDUCE, TensorShape=[{mine}], "
        "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda)), but "
        "Rank {o} is running collective: CollectiveFingerPrint(SequenceNumber=77, OpType=ALLREDUCE, "
        "TensorShape=[{theirs}], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float "
        "(default), device=cuda)).\n"
    )
    log = tmp_path / "detail.log"
    log.write_text(
        line.format(r=0, o=1, mine=6553600, theirs=2359296)
        + line.format(r=1, o=0, mine=2359296, theirs=6553600)
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.DATA_DEPENDENT_BRANCH
    assert "gradient bucket" in finding.message
    assert finding.absent_ranks == []  # two ranks, two sizes: neither is the odd one


def test_a_timeout_said_twice_is_one_and_what_follows_a_timeout_is_no_phase(tmp_path: Path) -> None:
    said = (
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=BROADCAST, "
        "Timeout(ms)=1800000) ran for 1800500 milliseconds before timing out."
    )
    log = tmp_path / "rank1.log"
    log.write_text(
        f"[E ProcessGroupNCCL.cpp:828] {said}\nterminate called after throwing\n  what():  {said}\n"
    )
    job = read_leftovers([log])
    assert len(job.ranks[1].timeouts) == 1
    assert job.output_before == []  # nothing of the job's own came before the timeout


def test_a_rank_in_uninterruptible_sleep_while_the_others_wait_is_the_straggler(tmp_path: Path) -> None:
    listing = tmp_path / "ps_node3.txt"
    listing.write_text(
        "  PID STAT     TIME CMD\n"
        " 9101 D+   01:10:02 python train.py\n"
        " 9102 R+   01:02:40 python train.py\n"
        " 9103 R+   01:02:41 python train.py\n"
    )
    failed = tmp_path / "rank24_pid9101.txt"
    failed.write_text(
        "$ py-spy dump --pid 9101\nError: Failed to suspend process\nReason: EPERM: Operation not permitted\n"
    )
    waiting = tmp_path / "pid9102.txt"
    waiting.write_text(
        'Thread 9102 (active): "MainThread"\n'
        "    barrier (torch/distributed/distributed_c10d.py:4101)\n"
        "    save (train.py:210)\n"
    )
    (finding,) = run_doctor_from([listing, failed, waiting]).findings
    assert finding.cause is Cause.STRAGGLER
    assert finding.absent_ranks == [24]
    assert any("STAT D+" in line for line in finding.evidence)
    # the same rank running (R): nothing says it is held outside; no rank is set apart for it
    listing.write_text(listing.read_text().replace(" 9101 D+", " 9101 R+"))
    assert all(24 not in f.absent_ranks for f in run_doctor_from([listing, failed, waiting]).findings)


def test_a_rank_in_backward_beside_idle_threads_named_as_py_spy_0_4_names_them_waits_on_its_peers(
    tmp_path: Path,
) -> None:
    """py-spy 0.4 prints methods with their class (`Condition.wait`, `Thread._bootstrap`):
    a DataLoader's idle queue feeder beside a main thread in backward is no backward hook."""
    from ncclcheck.evidence.stacks import blocking

    dump = tmp_path / "rank0.txt"
    dump.write_text(
        'Thread 11 (idle): "MainThread"\n'
        "    _engine_run_backward (torch/autograd/graph.py:979)\n"
        "    Tensor.backward (torch/_tensor.py:623)\n"
        "    train_one_epoch (train.py:34)\n"
        'Thread 12 (idle): "QueueFeederThread"\n'
        "    Condition.wait (threading.py:327)\n"
        "    Queue._feed (multiprocessing/queues.py:231)\n"
        "    Thread.run (threading.py:982)\n"
        "    Thread._bootstrap (threading.py:1002)\n"
    )
    stack = read_leftovers([dump]).ranks[0].stack
    assert stack is not None
    waits = blocking(stack)
    assert waits.waits_for_peers and "DDP gradient buckets" in waits.what


def test_one_dumped_rank_above_zero_sets_no_rank_apart(tmp_path: Path) -> None:
    """The dump of rank 2 alone: the ranks below it were not dumped, not gone (no process list
    says so), and nothing here says where they are."""
    dump = tmp_path / "rank2_pyspy.txt"
    dump.write_text(
        "Process 5120: python -u run.py --dist\nPython v3.10.12 (/usr/bin/python3.10)\n\n"
        'Thread 5120 (idle): "MainThread"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n"
        "    average_meters (lib/meters.py:58)\n"
        "    step (lib/engine.py:140)\n"
        "    <module> (run.py:33)\n"
    )
    (finding,) = run_doctor_from([dump]).findings
    assert finding.severity.value == "warning", finding
    assert finding.absent_ranks == [] and finding.cause is not Cause.RANK_CRASHED, finding
    assert "not running on this host" not in finding.message


def _store_bt(pid: int) -> str:
    """gdb's `bt` of a rank blocked in a c10d store's get, with a frame wrapped onto two lines."""
    return (
        f"(gdb) attach {pid}\n(gdb) bt\n"
        "#0  0x00007f2a1c91e9cf in __libc_recv (fd=41, buf=0x55d0, len=8, flags=0) at ../sysdeps/recv.c:28\n"
        "#1  0x00007f2a0a3b1d2e in c10d::tcputil::recvBytes<unsigned char>(int, unsigned char*, "
        "unsigned long) ()\n"
        "   from /opt/venv/lib/python3.10/site-packages/torch/lib/libtorch_cpu.so\n"
        "#2  0x00007f2a0a3af8a0 in c10d::TCPStore::doWait(c10::ArrayRef<std::string>, "
        "std::chrono::duration<long, std::ratio<1l, 1000l> >) () from /opt/venv/lib/libtorch_cpu.so\n"
        "#3  0x00007f2a0a3afd10 in c10d::TCPStore::get(std::string const&) () "
        "from /opt/venv/lib/libtorch_cpu.so\n"
    )


def test_ranks_blocked_in_a_stores_get_wait_for_rank_0_where_it_is_not_among_them(tmp_path: Path) -> None:
    one = tmp_path / "rank_2_bt.txt"
    one.write_text(_store_bt(811))
    job = read_leftovers([one])
    frames = job.ranks[2].stack.main.frames  # type: ignore[union-attr]
    assert frames[1].file.endswith("libtorch_cpu.so")  # the wrapped line's library is its frame's
    assert [f.function.split("(")[0] for f in frames[2:]] == ["c10d::TCPStore::doWait", "c10d::TCPStore::get"]
    (finding,) = run_doctor_from([one]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_CRASHED, [2], [0])
    assert "likely reading" in finding.message and "What decides" in finding.message
    # rank 0 waits there too: a key every rank adds; the ranks not seen decide, none set apart
    zero = tmp_path / "rank_0_bt.txt"
    zero.write_text(_store_bt(810))
    (finding,) = run_doctor_from([zero, one]).findings
    assert finding.severity.value == "warning" and finding.absent_ranks == [], finding


def _dump(pid: int, frames: list[str]) -> str:
    body = "".join(f"    {f}\n" for f in frames)
    return (
        f'--- pid {pid} ---\nProcess {pid}: python run_clm.py\n\nThread {pid} (idle): "MainThread"\n{body}\n'
    )


def test_one_dump_alone_in_a_collective_under_an_evaluation_is_the_likely_rank_test(tmp_path: Path) -> None:
    """Dumps of no known rank: one in a barrier under evaluate(), the others in the next step's
    all_reduce called from the same loop: a collective under a rank test, no rank named."""
    top = ["run (engine/runner.py:57)", "<module> (run_clm.py:12)"]
    alone = [
        "barrier (torch/distributed/distributed_c10d.py:4159)",
        "evaluate (engine/validate.py:40)",
        "run_epoch (engine/runner.py:98)",
        *top,
    ]
    others = [
        "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "average (engine/comm.py:15)",
        "run_epoch (engine/runner.py:84)",
        *top,
    ]
    dumps = tmp_path / "dumps.txt"
    dumps.write_text(_dump(700, alone) + "".join(_dump(pid, others) for pid in (701, 702, 703)))
    (finding,) = run_doctor_from([dumps]).findings
    assert finding.cause is Cause.RANK_CONDITIONAL_COLLECTIVE
    assert (finding.ranks, finding.absent_ranks) == ([], [])  # which rank each dump is, unknown
    assert finding.site == "engine/runner.py:98" and "likely reading" in finding.message
    # both paths through an evaluation: no phase tells them apart, no cause is named
    others[1] = "evaluate_step (engine/validate.py:22)"
    dumps.write_text(_dump(700, alone) + "".join(_dump(pid, others) for pid in (701, 702, 703)))
    assert run_doctor_from([dumps]).findings == []


def test_a_container_runtimes_json_lines_are_read_as_the_lines_they_hold(tmp_path: Path) -> None:
    """Docker's json-file format around torch's output, and a structured logger's records
    (`{"rank": 2, "msg": ..., "world_size": 4}`) inside it: read as the plain lines."""
    import json

    def wrapped(line: str) -> str:
        return json.dumps({"log": line + "\n", "stream": "stderr", "time": "2025-02-03T10:00:00.0Z"}) + "\n"

    app = [
        json.dumps({"ts": "t", "level": "info", "rank": r, "msg": "ready", "world_size": 4}) for r in (2, 3)
    ]
    summary = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2025-02-03_10:41:02",
        "  host      : trainer-worker-0",
        "  rank      : 3 (local_rank: 1)",
        "  exitcode  : -9 (pid: 77)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 77",
        "============================================================",
    ]
    pod = tmp_path / "pod_worker-0.log"
    pod.write_text("".join(wrapped(line) for line in [*app, *summary]))
    job = read_leftovers([pod])
    assert job.world_size == 4
    assert job.ranks[3].ending is not None and job.ranks[3].ending.exit_code == -9
    assert {2, 3} <= set(job.ranks)


_NATIVE_SYNC = """Process 4410: python -u finetune.py
Python v3.11.4 (/usr/bin/python3.11)

Thread 4410 (active): "MainThread"
    0x7f11aa02bc10 (libcuda.so.550.54.15)
    cudaStreamSynchronize (libcudart.so.12)
    at::native::item (libtorch_cpu.so)
    step (engine/loop.py:88)
    <module> (finetune.py:40)
Thread 4502 (idle): "Thread-3 (_pin_memory_loop)"
    do_futex_wait (libc.so.6)
    PyThread_acquire_lock_timed (python3.11)
    select (selectors.py:415)
    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:54)
    _bootstrap (threading.py:1002)
"""

_AT_THE_END = """Process 4412: python -u finetune.py
Python v3.11.4 (/usr/bin/python3.11)

Thread 4412 (idle): "MainThread"
    _shutdown (threading.py:1590)
Thread 4520 (idle): "telemetry"
    sleep (telemetry.py:21)
    run (threading.py:982)
    _bootstrap (threading.py:1002)
"""


def test_py_spy_native_frames_are_read_and_a_rank_past_its_scripts_end_is_the_one_that_left(
    tmp_path: Path,
) -> None:
    """py-spy --native's library frames are frames (the sync point in them is seen); a rank whose
    main thread waits in threading._shutdown left the script, and a traceback no rank owns is
    the likely reason."""
    waiting = tmp_path / "rank0_native.txt"
    waiting.write_text(_NATIVE_SYNC)
    ended = tmp_path / "rank1_pyspy.txt"
    ended.write_text(_AT_THE_END)
    job = read_leftovers([waiting])
    main = job.ranks[0].stack.main  # type: ignore[union-attr]
    assert main is not None and main.frames[1].function == "cudaStreamSynchronize"
    assert len(job.ranks[0].stack.threads) == 2  # type: ignore[union-attr]
    (finding,) = run_doctor_from([waiting, ended]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_EARLY_EXIT, [0], [1])
    terminal = tmp_path / "terminal.txt"
    terminal.write_text(
        "Traceback (most recent call last):\n"
        '  File "/srv/ft/finetune.py", line 40, in <module>\n'
        "    step(batch)\n"
        '  File "/srv/ft/engine/collate.py", line 12, in pad\n'
        "    raise KeyError(name)\n"
        "KeyError: 'attention_mask'\n"
    )
    (finding,) = run_doctor_from([waiting, ended, terminal]).findings
    assert (finding.cause, finding.absent_ranks, finding.site) == (
        Cause.RANK_EXCEPTION,
        [1],
        "/srv/ft/engine/collate.py:12",
    )
    assert "likely reading" in finding.message


def test_a_post_with_only_the_jobs_stopped_progress_is_read_and_decides_nothing(tmp_path: Path) -> None:
    post = tmp_path / "post.txt"
    post.write_text(
        "Training freezes after a few hours, no error. Last lines:\n"
        "step 4100 | loss 2.113 | lr 3.0e-4\n"
        "train:  43%|████▎     | 4123/9600 [2:01:40<2:41:38,  1.77s/it, loss=2.11]\n"
    )
    report = run_doctor_from([post])
    assert report.findings == []
    assert "the job's own output only" in report.summary["unexplained"]
    assert "4123/9600" in report.summary["unexplained"]


def test_source_beside_the_dumps_is_read_whatever_the_working_folder(tmp_path: Path) -> None:
    """A poster's folder: two py-spy dumps naming `loop.py` by its base name, and loop.py."""
    (tmp_path / "loop.py").write_text(
        "import torch.distributed as dist\n"
        "\n"
        "def save(rank):\n"
        "    dist.barrier()\n"
        "\n"
        "def fit(rank, steps):\n"
        "    for step in range(steps):\n"
        "        dist.all_reduce(step)\n"
        "        if rank == 0:\n"
        "            save(rank)\n"
    )

    def dump(pid: int, frames: str) -> str:
        return f'Process {pid}: python -u loop.py\n\nThread {pid} (idle): "MainThread"\n{frames}'

    (tmp_path / "rank0.txt").write_text(
        dump(
            10,
            "    barrier (torch/distributed/distributed_c10d.py:4159)\n"
            "    save (loop.py:4)\n"
            "    fit (loop.py:10)\n",
        )
    )
    (tmp_path / "rank1.txt").write_text(
        dump(11, "    all_reduce (torch/distributed/distributed_c10d.py:2501)\n    fit (loop.py:8)\n")
    )
    (finding,) = run_doctor_from([tmp_path / "rank0.txt", tmp_path / "rank1.txt"]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        [1],
    )
    assert finding.severity.value == "error" and "if rank == 0" in finding.message


def _unnumbered(rank: int, op: str, shape: str) -> str:
    """A watchdog line of torch 1.9 or 1.10: no SeqNum, the tensor's shape, torchrun's prefix."""
    return (
        f"{rank}: [E ProcessGroupNCCL.cpp:566] [Rank {rank}] Watchdog caught collective operation timeout: "
        f"WorkNCCL(OpType={op}, TensorShape=[{shape}], Timeout(ms)=1800000) ran for 1800{rank:03d} "
        "milliseconds before timing out.\n"
    )


def test_watchdog_lines_that_number_no_work_part_the_ranks_by_their_op(tmp_path: Path) -> None:
    """Old watchdog lines carry no sequence number: two ranks cannot be placed at one
    position, but ranks that time out in different ops wait in different collectives."""
    log = tmp_path / "slurm-4411.out"
    log.write_text(
        "".join(_unnumbered(r, "ALLREDUCE", "4096, 512") for r in (0, 1, 2, 4, 5, 6, 7))
        + _unnumbered(3, "ALLGATHER", "1")
    )
    job = read_leftovers([log])
    assert [w.seq for w in job.ranks[3].timeouts] == [None]
    assert job.ranks[0].timeouts[0].numel_in == 4096 * 512  # the shape's elements
    finding = run_doctor_from([log]).findings[0]
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([3], [0, 1, 2, 4, 5, 6, 7])
    assert "number no work" in finding.message


def test_one_op_in_lines_that_number_no_work_places_no_rank_at_one_position(tmp_path: Path) -> None:
    """Every rank timed out in an all-reduce, unnumbered: they may be at one all-reduce or at
    two (one step apart): nothing says which, so no transport is blamed as for one position."""
    log = tmp_path / "job.err"
    log.write_text("".join(_unnumbered(r, "ALLREDUCE", "1") for r in range(4)))
    report = run_doctor_from([log])
    assert all(f.cause is not Cause.TRANSPORT_HANG for f in report.findings)
    assert all(not f.ranks and not f.absent_ranks for f in report.findings)


def test_the_scripts_lines_pasted_beside_the_logs_are_not_what_it_printed(tmp_path: Path) -> None:
    listing = tmp_path / "snippet.txt"
    listing.write_text(
        "Here is the loop:\n"
        "141        if stale_evals >= cfg.patience:\n"
        '142            print(f"[rank {rank}] early stopping at epoch {epoch}")\n'
        '143            logger.info("rank %d stopping early", rank)\n'
        "144            break\n"
    )
    out = tmp_path / "out.log"
    out.write_text("[rank 2] early stopping at epoch 7\n" + _unnumbered(0, "BROADCAST", "1"))
    job = read_leftovers([listing, out])
    assert [(line.rank, line.source.path) for line in job.stop_lines] == [(2, str(out))]


# fr_trace -j as tabulate prints it (its "simple" format: a rule of dashes under the header,
# each column as wide as its widest cell), four ranks of four, each cell an entry as the
# analyser's Op prints it
def _entry_table(rows: list[list[str]]) -> str:
    header = [f"Rank {rank}" for rank in range(len(rows[0]))]
    width = max(len(cell) for row in rows for cell in row)
    lines = [header, ["-" * width] * len(header), *rows]
    return "$ python -m torch.distributed.flight_recorder.fr_trace dumps/ -j\n" + "".join(
        "  ".join(cell.ljust(width) for cell in line).rstrip() + "\n" for line in lines
    )


def _entry(op: str, size: int, state: str = "scheduled") -> str:
    return f"{op}(input_sizes=[[{size}]], state={state})"


_ENTRY_TABLE = _entry_table(
    [
        [_entry("broadcast", 1024, "completed")] * 4,
        [_entry("all_reduce", 3)] * 3 + [_entry("all_gather", 16)],
        [_entry("all_gather", 16)] * 3 + [_entry("all_reduce", 3)],
    ]
)


def test_a_flight_recorder_table_with_the_same_calls_in_another_order_is_an_order_mismatch(
    tmp_path: Path,
) -> None:
    table = tmp_path / "fr_table.txt"
    table.write_text(_ENTRY_TABLE)
    job = read_leftovers([table])
    assert [call.op for call in job.ranks[3].issued[FR_ROWS]] == ["broadcast", "all_gather", "all_reduce"]
    (finding,) = run_doctor_from([table]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    # every rank of the four is in the table: the one with the other order is set apart
    assert (finding.ranks, finding.absent_ranks) == ([3], [0, 1, 2])
    assert "same calls in another order" in finding.message and "row 2" in finding.message


def _fingerprints(shapes_by_seq: dict[int, tuple[str, str]]) -> str:
    """DETAIL's lines of ranks 0 and 1, each number's all-reduce with each rank's shape."""
    return "".join(
        f"[rank{rank}]:[I debug.cpp:42] [Rank {rank}] Running collective: CollectiveFingerPrint("
        f"SequenceNumber={seq}, OpType=ALLREDUCE, TensorShape=[{shape}], TensorDtypes=Float, "
        "TensorDeviceTypes=TensorOptions(dtype=float, device=cuda))\n"
        for seq, shapes in shapes_by_seq.items()
        for rank, shape in enumerate(shapes)
    )


def test_two_ranks_fingerprints_in_swapped_order_set_no_rank_apart(tmp_path: Path) -> None:
    """One rank against one: the sequences prove the swap, not which rank is odd."""
    log = tmp_path / "detail.log"
    log.write_text(_fingerprints({41: ("1", "1"), 42: ("10", "4"), 43: ("4", "10")}))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_ORDER_MISMATCH
    assert (finding.ranks, finding.absent_ranks) == ([], [])
    assert "collective #42" in finding.message


def test_other_sizes_that_are_no_swap_stay_a_shape_mismatch(tmp_path: Path) -> None:
    log = tmp_path / "detail.log"
    log.write_text(_fingerprints({42: ("10", "12"), 43: ("4", "4")}))
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.COLLECTIVE_SHAPE_MISMATCH


def test_a_transport_failing_on_ranks_before_the_others_timed_out_is_the_likely_transport_hang(
    tmp_path: Path,
) -> None:
    """Half of a 16-rank job's watchdog lines pasted, all at one collective; ranks 12 and 13
    printed only their set-up lines and NCCL's report of a failing socket, before the
    timeouts: their silence is no skipped call, and nothing sets a rank apart."""
    log = tmp_path / "node_logs.txt"
    log.write_text(
        "".join(
            f"[rank{r}]:node-c:{3300 + r}:{3400 + r} [{r % 8}] NCCL INFO comm 0x55d1 rank {r} nRanks 16 "
            "- Init COMPLETE\n"
            for r in (12, 13)
        )
        + "[rank0]:step 9000 | loss 1.83\n"
        + "".join(
            f"[rank{r}]:node-c:{3300 + r}:{3500 + r} [{r % 8}] misc/socket.cc:49 NCCL WARN NET/Socket : "
            "recv failed: Connection reset by peer\n"
            for r in (12, 13)
        )
        + "".join(
            f"[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
            f"timeout: WorkNCCL(SeqNum=77120, OpType=ALLREDUCE, NumelIn=25165824, NumelOut=25165824, "
            "Timeout(ms)=600000) ran for 600104 milliseconds before timing out.\n"
            for r in range(0, 8)
        )
    )
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.TRANSPORT_HANG
    assert not (finding.ranks and finding.absent_ranks)
    assert "ranks 12-13" in finding.message and "likely" in finding.message


def _py_spy(pid: int, innermost: str) -> str:
    return (
        f"Process {pid}: python train.py\nPython v3.10.12 (/usr/bin/python3.10)\n\n"
        f'Thread {pid} (active): "MainThread"\n'
        f"    {innermost}\n"
        "    build_index (prep/index.py:88)\n"
        "    main (train.py:40)\n"
        "    <module> (train.py:95)\n\n"
    )


def test_two_dumps_of_a_busy_rank_whose_frames_moved_confirm_the_straggler(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("".join(_watchdog(r, 5, "BROADCAST", 1) for r in (0, 1, 3)))
    dumps = tmp_path / "rank2_dumps.txt"
    dumps.write_text(
        _py_spy(4410, "encode (prep/tokenize.py:31)") + _py_spy(4410, "flush (prep/shards.py:12)")
    )
    (finding,) = run_doctor_from([log, dumps]).findings
    assert finding.cause is Cause.STRAGGLER
    assert (finding.ranks, finding.absent_ranks) == ([0, 1, 3], [2])
    assert "moved between two dumps" in finding.message and "one snapshot" not in finding.message
    dumps.write_text(_py_spy(4410, "encode (prep/tokenize.py:31)") * 2)
    (finding,) = run_doctor_from([log, dumps]).findings
    assert "one snapshot" in finding.message  # the same place twice confirms nothing


def test_a_line_that_ties_pids_to_ranks_places_the_dumps_of_no_known_rank(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps.txt"
    dumps.write_text(
        "worker pids: rank 1 pid 5123; pid=5122 (rank 0), and 5130 -> cuda:2 (rank 2)\n\n"
        + _py_spy(5122, "all_gather (torch/distributed/distributed_c10d.py:3001)")
        + _py_spy(5123, "barrier (torch/distributed/distributed_c10d.py:4101)")
        + _py_spy(5130, "barrier (torch/distributed/distributed_c10d.py:4101)")
    )
    job = read_leftovers([dumps])
    assert not job.unplaced
    assert {r: rec.stack.pid for r, rec in job.ranks.items() if rec.stack} == {0: 5122, 1: 5123, 2: 5130}


def test_dumps_under_headings_with_rank_and_pid_are_those_ranks_and_their_timeouts_place_them(
    tmp_path: Path,
) -> None:
    """Ranks 1 and 3 dumped in compute after their collectives (an `.item()` on the norm):
    every rank's watchdog timed out in one reduce-scatter, so the stacks wait behind it,
    not outside communication."""
    log = tmp_path / "job.log"
    log.write_text("".join(_watchdog(r, 902, "_REDUCE_SCATTER_BASE", 4096) for r in range(4)))
    dumps = tmp_path / "py-spy.txt"
    thread = (
        'Thread {pid} (active): "MainThread"\n'
        "    clip_grad_norm_ (torch/nn/utils/clip_grad.py:99)\n"
        "    step (trainer/loop.py:210)\n"
        "    main (train.py:51)\n\n"
    )
    dumps.write_text(
        "--- rank 1 (pid 7101) ---\n"
        + thread.format(pid=7101)
        + "=== rank 3 (PID: 7103) ===\n"
        + thread.format(pid=7103)
    )
    job = read_leftovers([log, dumps])
    assert {r: (rec.pid, rec.stack is not None) for r, rec in job.ranks.items() if rec.stack} == {
        1: (7101, True),
        3: (7103, True),
    }
    (finding,) = run_doctor_from([log, dumps]).findings
    assert finding.cause is Cause.TRANSPORT_HANG


def test_an_all_gather_of_other_sizes_under_a_model_said_to_be_ddp_is_the_users_own(tmp_path: Path) -> None:
    """DDP gathers no parameters: an _ALLGATHER_BASE of other sizes is the script's own
    all_gather_into_tensor, a shape mismatch; where the post names FSDP, the likely reading
    stays the parameter all-gather of modules one rank did not run."""
    log = tmp_path / "eval.log"
    lines = "".join(_watchdog(r, 61, "_ALLGATHER_BASE", 8192 if r == 2 else 10240) for r in range(4))
    log.write_text(
        "model = DDP(model, device_ids=[local_rank]); the hang is in our gather of scores\n" + lines
    )
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks) == (Cause.COLLECTIVE_SHAPE_MISMATCH, [2])
    log.write_text("we wrap the model with FSDP (FULL_SHARD)\n" + lines)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks) == (Cause.DATA_DEPENDENT_BRANCH, [2])


def test_a_fatal_traceback_of_no_rank_is_likely_the_one_silent_ranks(tmp_path: Path) -> None:
    """Ranks 0, 2 and 3 timed out; rank 1 left no line; an unprefixed traceback that reached
    `<module>` (its process died of it) is likely rank 1's, said as likely. One that stops
    short of `<module>` was printed by a handler: a process that lived on, not that."""
    fatal = (
        "Traceback (most recent call last):\n"
        '  File "/srv/job/train.py", line 210, in <module>\n'
        "    main()\n"
        '  File "/srv/job/train.py", line 181, in main\n'
        "    batch = collate(samples)\n"
        '  File "/srv/job/data.py", line 44, in collate\n'
        "    lengths = [len(s['tokens']) for s in samples]\n"
        "KeyError: 'tokens'\n"
    )
    timeouts = "".join(_watchdog(r, 3310, "ALLREDUCE", 1048576) for r in (0, 2, 3))
    log = tmp_path / "job.log"
    log.write_text(fatal + timeouts)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (Cause.RANK_EXCEPTION, [0, 2, 3], [1])
    assert "likely" in finding.message and finding.site == "/srv/job/data.py:44"
    log.write_text(
        fatal.replace('  File "/srv/job/train.py", line 210, in <module>\n    main()\n', "") + timeouts
    )
    assert all(f.cause is not Cause.RANK_EXCEPTION for f in run_doctor_from([log]).findings)


def test_a_phase_announced_by_ranks_no_rank_test_picks_is_each_ranks_own_decision(tmp_path: Path) -> None:
    """Ranks 0, 1 and 3 announce a save and wait in its barrier; rank 2 waits in the next
    step's all-gather. No rank test picks ranks 0, 1 and 3: each decided on its own value.
    Announced by rank 0 alone, or by local rank 0 of each node, the rank test stays the
    likely reading."""
    log = tmp_path / "train.log"

    def job(announcing: list[int], world: int) -> str:
        return "".join(
            f"[rank{r}]:2024-05-02 10:00:01 INFO saving checkpoint to /ckpt/step_900\n" for r in announcing
        ) + "".join(
            _watchdog(
                r, 7731, "ALLREDUCE" if r in announcing else "_ALLGATHER_BASE", 1 if r in announcing else 4096
            )
            for r in range(world)
        )

    log.write_text(job([0, 1, 3], 4))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.UNSYNCHRONIZED_DECISION,
        [0, 1, 3],
        [2],
    )
    for announcing, world in (([0], 4), ([0, 4], 8)):
        log.write_text(job(announcing, world))
        (finding,) = run_doctor_from([log]).findings
        assert (finding.cause, finding.ranks) == (Cause.RANK_CONDITIONAL_COLLECTIVE, announcing)


def test_loops_of_other_lengths_split_as_the_sizes_split_are_uneven_loaders(tmp_path: Path) -> None:
    """Ranks 0 and 1 count 1201 batches, ranks 2 and 3 count 1200 (a script's own `[rN]`
    tags): at one number the longer side all-reduces its last batch's gradients while the
    shorter waits in its barrier (1 element). A training loop: its loader has no
    DistributedSampler; an evaluation's is uneven-eval-batches."""
    log = tmp_path / "train.log"

    def job(loop: str) -> str:
        counts = "".join(f"[r{r}] {loop} shard ready: {1201 if r < 2 else 1200} batches\n" for r in range(4))
        return counts + "".join(_watchdog(r, 2402, "ALLREDUCE", 2097152 if r < 2 else 1) for r in range(4))

    log.write_text(job("train"))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.MISSING_DISTRIBUTED_SAMPLER,
        [2, 3],
        [0, 1],
    )
    log.write_text(job("val"))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.UNEVEN_EVAL_BATCHES, [0, 1])


def test_a_rank_that_said_its_batch_held_none_is_the_data_branchs_side(tmp_path: Path) -> None:
    """An excerpt of an FSDP job's watchdog lines (ranks 0-3 and 5 of 8): rank 5 gathers
    other parameters. Half the job unseen, the sizes alone set no rank apart; rank 5's own
    line before the timeouts gives its batch no audio (`n_audio=0`): the branch on the data
    is its."""
    log = tmp_path / "fsdp.log"
    said = "[batch] rank=5 step=88 n_audio=0 n_text=32\n"
    lines = "".join(_watchdog(r, 512, "_ALLGATHER_BASE", 65536 if r == 5 else 4096) for r in (0, 1, 2, 3, 5))
    log.write_text("FSDP FULL_SHARD, 8 ranks\n" + lines)
    (finding,) = run_doctor_from([log]).findings
    assert finding.cause is Cause.DATA_DEPENDENT_BRANCH and not finding.absent_ranks
    log.write_text("FSDP FULL_SHARD, 8 ranks\n" + said + lines)
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.ranks, finding.absent_ranks) == (
        Cause.DATA_DEPENDENT_BRANCH,
        [5],
        [0, 1, 2, 3],
    )
    assert any("n_audio=0" in line for line in finding.evidence)


def _py_spy_threads(pid: int, threads: dict[str, list[str]]) -> str:
    text = f"Process {pid}: python -u fit.py\nPython v3.11.9 (/usr/bin/python3.11)\n\n"
    for index, (name, frames) in enumerate(threads.items()):
        text += f'Thread {pid + index} (idle): "{name}"\n' + "".join(f"    {f}\n" for f in frames)
    return text


def test_a_worker_whose_main_thread_runs_a_frameworks_event_loop_is_read_at_its_training_thread(
    tmp_path: Path,
) -> None:
    """A framework that runs the training function on a thread of its own (Ray Train's
    workers): the main thread only serves its event loop, and the thread that runs the
    user's code is the rank's."""
    loop = [
        "select (selectors.py:468)",
        "_run_once (asyncio/base_events.py:1898)",
        "run_forever (asyncio/base_events.py:608)",
        "serve (ray/_private/workers/default_worker.py:280)",
    ]
    training = [
        "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "average_metrics (fitlib/metrics.py:31)",
        "fit_one_epoch (fitlib/loop.py:77)",
        "run (threading.py:982)",
    ]
    dump = tmp_path / "rank_3.txt"
    dump.write_text(_py_spy_threads(5120, {"MainThread": loop, "Thread-7": training}))
    stack = read_leftovers([dump]).ranks[3].stack
    assert stack is not None and stack.main is not None and stack.main.name == "Thread-7"
    assert blocking(stack).what.startswith("all_reduce") and blocking(stack).waits_for_peers
    # a main thread past the script's end, waiting for a thread of the user's: that is where
    # the rank is (it left the script), whatever the other thread runs
    ended = ["_shutdown (threading.py:1583)"]
    dump.write_text(_py_spy_threads(5120, {"MainThread": ended, "Thread-7": training}))
    stack = read_leftovers([dump]).ranks[3].stack
    assert stack is not None and stack.main is not None and stack.main.name == "MainThread"


def test_paths_posted_dumps_print_below_a_libraries_site_packages_are_not_the_users() -> None:
    assert not is_user_path("transformers/trainer.py") and not is_user_path("deepspeed/runtime/engine.py")
    # a repository people run from a checkout, and the script itself, are the user's
    assert is_user_path("megatron/training.py") and is_user_path("fit.py")


def test_a_library_collective_waiting_on_its_event_is_a_device_sync_in_it(tmp_path: Path) -> None:
    dump = tmp_path / "rank_1.txt"
    dump.write_text(
        _py_spy_threads(
            77,
            {
                "MainThread": [
                    "synchronize (torch/cuda/streams.py:224)",
                    "_wait_for_unshard (torch/distributed/fsdp/_runtime_utils.py:331)",
                    "_pre_forward (torch/distributed/fsdp/_runtime_utils.py:431)",
                    "forward (torch/distributed/fsdp/fully_sharded_data_parallel.py:850)",
                    "step (fitlib/loop.py:52)",
                ]
            },
        )
    )
    stack = read_leftovers([dump]).ranks[1].stack
    assert stack is not None
    waits = blocking(stack)
    assert waits.waits_for_peers and waits.sync == "a CUDA stream's or event's synchronize()"


def test_the_phase_one_side_ran_may_be_the_library_call_its_code_made(tmp_path: Path) -> None:
    """Rank 0 inside a library's save called from the loop, the others at a later line of
    the loop: the library's entry point is the phase (not a frame of the user's)."""
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 4410, "ALLREDUCE", 1) + "".join(_watchdog(r, 4410, "BROADCAST", 40) for r in (1, 2, 3))
    )
    top = ["train (fit.py:120)", "<module> (fit.py:140)"]
    saving = [
        "barrier (torch/distributed/distributed_c10d.py:4159)",
        "_save_checkpoint (transformers/trainer.py:3021)",
        "save_model (transformers/trainer.py:2890)",
        "train (fit.py:101)",
        "<module> (fit.py:140)",
    ]
    stepping = [
        "_sync_buffers (torch/nn/parallel/distributed.py:1718)",
        "forward (torch/nn/parallel/distributed.py:1630)",
        *top,
    ]
    (tmp_path / "rank_0.txt").write_text(_py_spy_threads(900, {"MainThread": saving}))
    (tmp_path / "rank_2.txt").write_text(_py_spy_threads(902, {"MainThread": stepping}))
    (finding,) = run_doctor_from([log, tmp_path / "rank_0.txt", tmp_path / "rank_2.txt"]).findings
    assert (finding.cause, finding.ranks, finding.site) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        "fit.py:101",
    )
    assert "save_model()" in finding.message


def test_other_sizes_where_one_sides_stack_is_in_a_phase_the_other_is_past_is_a_rank_test(
    tmp_path: Path,
) -> None:
    """Other sizes at one number, as two different calls give: rank 0's stack inside a
    validation called from the loop, rank 1's at a later line of the same loop: rank 0's
    small reduce is the validation's, under a rank test. Both stacks at one line stay a
    shape mismatch."""
    log = tmp_path / "job.log"
    log.write_text(
        _watchdog(0, 7730, "ALLREDUCE", 4)
        + "".join(_watchdog(r, 7730, "ALLREDUCE", 2_359_296) for r in (1, 2))
    )
    top = ["<module> (fit.py:150)"]
    validating = [
        "all_reduce (torch/distributed/distributed_c10d.py:2501)",
        "validate (fit.py:61)",
        "fit (fit.py:122)",
        *top,
    ]
    stepping = ["fit (fit.py:109)", *top]
    (tmp_path / "rank_0.txt").write_text(_py_spy_threads(800, {"MainThread": validating}))
    (tmp_path / "rank_1.txt").write_text(_py_spy_threads(801, {"MainThread": stepping}))
    files = [log, tmp_path / "rank_0.txt", tmp_path / "rank_1.txt"]
    (finding,) = run_doctor_from(files).findings
    assert (finding.cause, finding.ranks, finding.site) == (
        Cause.RANK_CONDITIONAL_COLLECTIVE,
        [0],
        "fit.py:122",
    )
    (tmp_path / "rank_1.txt").write_text(_py_spy_threads(801, {"MainThread": validating}))
    assert run_doctor_from(files).findings[0].cause is Cause.COLLECTIVE_SHAPE_MISMATCH


def test_a_gathers_small_sizes_a_few_percent_apart_are_one_gather_of_each_ranks_own_length(
    tmp_path: Path,
) -> None:
    """_ALLGATHER_BASE is FSDP's parameter gather as often as a metric gather's; 4096
    elements against 3896 (generated tokens of another length) is one gather of per-rank
    lengths, not two modules' parameters."""
    log = tmp_path / "job.log"
    log.write_text("".join(_watchdog(r, 214, "_ALLGATHER_BASE", 3896 if r == 2 else 4096) for r in range(4)))
    (finding,) = run_doctor_from([log]).findings
    assert (finding.cause, finding.absent_ranks) == (Cause.COLLECTIVE_SHAPE_MISMATCH, [0, 1, 3])
