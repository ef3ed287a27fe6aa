"""Stacks as NCCL jobs hang, read as pure analysis: ranks at a device sync point with no
torch.distributed frame, collectives on the autograd engine's threads, native CUDA frames,
and two looks that tell a job that moves from one that is stuck. Each stack is shaped after
dumps people posted of hung NCCL jobs (pytorch, DeepSpeed and transformers issue threads)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from ncclcheck.commands.doctor import diagnose_ranks
from ncclcheck.evidence import device, gpus, movement
from ncclcheck.evidence.classes import merge_stacks
from ncclcheck.evidence.movement import Usage
from ncclcheck.evidence.processes import RankProcess
from ncclcheck.evidence.stacks import ProcessStack, ThreadStack, blocking
from ncclcheck.explain.rules.stacks import explain_classes
from ncclcheck.model import Frame

from .factories import TORCH, diagnoser, line_of, script, stack, waiting_in

EVAL_ONLY_ON_RANK_0 = """
    import torch
    import torch.distributed as dist


    def evaluate(model, loader):
        total = torch.zeros(2)
        for x, y in loader:
            total += torch.stack([model(x).sum(), torch.tensor(1.0)])
        dist.all_reduce(total)
        return (total[0] / total[1]).item()


    def main(model, loader):
        rank = dist.get_rank()
        if rank == 0:
            print(evaluate(model, loader))
        dist.barrier()
    """


def test_the_device_sync_point_on_a_line(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        loss_value = loss.item()
        print(f"loss {loss}")
        print(f"{loss.item():.3f}")
        n = float(len(batch))
        torch.cuda.synchronize()
        preds = logits.argmax(-1).cpu().numpy()
        x = y + 1
        """,
    )
    said = [device.sync_point(path, line) for line in range(1, 8)]
    assert said == [".item()", "print()", ".item()", None, "torch.cuda.synchronize()", ".cpu()", None]


def test_the_collective_enqueued_before_a_read(tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        import torch.distributed as dist


        def mean_across_ranks(value):
            value = value.clone()
            dist.all_reduce(value)
            return value / dist.get_world_size()


        def validate(model, loader):
            losses = []
            for x in loader:
                loss = mean_across_ranks(model(x))
                losses.append(loss.item())
            return losses


        def train(model, loader):
            for x in loader:
                print(x.sum().item())
                dist.broadcast(x, src=0)
        """,
    )
    read = Frame(path, line_of(path, "losses.append(loss.item())"), "validate")
    found = device.enqueued_before([Frame(path, 30, "main"), read])
    assert found is not None and found.op == "all_reduce"
    assert [(f.function, f.line) for f in found.frames] == [
        ("main", 30),
        ("validate", line_of(path, "loss = mean_across_ranks")),
        ("mean_across_ranks", line_of(path, "dist.all_reduce(value)")),
    ]
    # in a loop, what comes after the read ran on the pass before
    looped = device.enqueued_before([Frame(path, line_of(path, "print(x.sum().item())"), "train")])
    assert looped is not None and looped.op == "broadcast"
    assert looped.frames[-1].line == line_of(path, "dist.broadcast(x")


def test_a_rank_waiting_at_item_after_an_all_reduce_only_it_ran(tmp_path: Path) -> None:
    """The common NCCL shape: rank 0's all_reduce returned at once and rank 0 waits at the
    .item() after it, with no torch.distributed frame; rank 1 waits in the barrier."""
    path = script(tmp_path, EVAL_ONLY_ON_RANK_0)
    item_line = line_of(path, ".item()")
    dumps = {
        0: stack(
            (path, item_line, "evaluate"),
            (path, line_of(path, "print(evaluate("), "main"),
        ),
        1: waiting_in("barrier", (path, line_of(path, "dist.barrier()"), "main")),
    }
    where = blocking(dumps[0])
    assert (where.sync, where.waits_for_peers) == (".item()", True)
    explanation = explain_classes(diagnoser(tmp_path), merge_stacks(dumps), 2, [0, 1])
    assert explanation.cause == "rank-conditional-collective"
    assert explanation.site is not None and explanation.site.endswith(
        f":{line_of(path, 'dist.all_reduce(total)')}"
    )
    assert (explanation.ranks, explanation.absent_ranks) == ([0], [1])
    assert "at a device sync point (.item() at " in explanation.message
    assert f"train.py:{item_line}, after all_reduce)" in explanation.message


def test_native_frames_confirm_the_device_wait(tmp_path: Path) -> None:
    """py-spy --native: CUDA's synchronize under the user's .item() line."""
    path = script(tmp_path, EVAL_ONLY_ON_RANK_0)
    item_line = line_of(path, ".item()")
    rank0 = stack(
        ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0, "cuStreamSynchronize"),
        ("/opt/conda/lib/libcudart.so.12", 0, "cudaStreamSynchronize"),
        ("/opt/conda/lib/libtorch_cuda.so", 0, "at::native::_local_scalar_dense_cuda(at::Tensor const&)"),
        (path, item_line, "evaluate"),
        (path, line_of(path, "print(evaluate("), "main"),
    )
    where = blocking(rank0)
    assert (where.sync, where.native) == (".item()", "cuStreamSynchronize")
    # without a readable line, the native frames alone still say it waits for the device
    unreadable = stack(
        ("/opt/conda/lib/libcudart.so.12", 0, "cudaStreamSynchronize"),
        ("/opt/conda/lib/python3.10/site-packages/transformers/trainer_pt_utils.py", 140, "nested_numpify"),
    )
    assert blocking(unreadable).what == "a device sync point (cudaStreamSynchronize, in native frames)"


def test_gradscalers_step_reading_its_found_inf_flags_is_a_device_sync_point() -> None:
    """No native frames, no .item() frame: GradScaler.step's _maybe_opt_step (its genexpr
    `sum(v.item() for v in found_inf_per_device.values())`) is innermost, a read on the host
    behind whatever the stream runs (an all-reduce that does not complete). Another library
    function there is not one."""
    scaler = "/opt/conda/lib/python3.8/site-packages/torch/cuda/amp/grad_scaler.py"
    rank0 = stack(
        (scaler, 288, "<genexpr>"),
        (scaler, 288, "_maybe_opt_step"),
        (scaler, 338, "step"),
        ("/workspace/s2t/train.py", 170, "train_epoch"),
    )
    where = blocking(rank0)
    assert (where.waits_for_peers, where.sync) == (True, "GradScaler's found_inf .item()")
    other = stack((scaler, 301, "unscale_"), ("/workspace/s2t/train.py", 170, "train_epoch"))
    assert blocking(other).sync is None


ZERO3_TRAIN = """
    def train(engine, loader):
        for step, batch in enumerate(loader):
            if batch["input_ids"].numel() == 0:  # everything was filtered out
                continue
            loss = engine(batch["input_ids"])
            engine.backward(loss)
            engine.step()
    """
SITE = "/opt/conda/lib/python3.10/site-packages"
ZERO3_GATHER = [  # innermost first: DeepSpeed's ZeRO-3 parameter gather, down to torch
    (f"{TORCH}/distributed/distributed_c10d.py", 3800, "all_gather_into_tensor"),
    (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
    (f"{SITE}/deepspeed/comm/torch.py", 227, "all_gather_into_tensor"),
    (f"{SITE}/deepspeed/comm/comm.py", 117, "log_wrapper"),
    (f"{SITE}/deepspeed/runtime/zero/partition_parameters.py", 1131, "_all_gather_dtype"),
    (f"{SITE}/deepspeed/runtime/zero/partition_parameters.py", 1160, "all_gather_coalesced"),
    (f"{SITE}/deepspeed/runtime/zero/partitioned_param_coordinator.py", 413, "fetch_sub_module"),
    (f"{SITE}/deepspeed/runtime/zero/parameter_offload.py", 460, "pre_sub_module_backward_function"),
]


def _thread(name: str, frames: list[tuple[str, int, str]], user_path: str) -> ThreadStack:
    return ThreadStack(
        7 if name != "MainThread" else 1,
        name,
        [Frame(*f) for f in frames],
        user=[f[0] == user_path for f in frames],
    )


def test_a_zero3_gather_on_the_autograd_thread_while_another_rank_skipped_a_forward(tmp_path: Path) -> None:
    """Rank 0 is in backward: its MainThread sits in autograd's engine, an autograd worker
    thread waits in ZeRO-3's parameter gather. Rank 1 skipped the batch with `continue`
    and waits in the next forward's gather on its main thread."""
    path = script(tmp_path, ZERO3_TRAIN)
    backward = line_of(path, "engine.backward(loss)")
    forward = line_of(path, "loss = engine(")
    rank0 = ProcessStack(
        2000,
        [
            _thread(
                "MainThread",
                [
                    (f"{TORCH}/autograd/graph.py", 824, "_engine_run_backward"),
                    (f"{TORCH}/autograd/__init__.py", 347, "backward"),
                    (f"{TORCH}/_tensor.py", 581, "backward"),
                    (f"{SITE}/deepspeed/runtime/engine.py", 2020, "backward"),
                    (path, backward, "train"),
                ],
                path,
            ),
            _thread("Dummy-3", ZERO3_GATHER, path),
        ],
        "running",
    )
    rank1 = ProcessStack(
        2001,
        [
            _thread(
                "MainThread",
                [
                    *ZERO3_GATHER[:-1],
                    (f"{SITE}/deepspeed/runtime/zero/parameter_offload.py", 350, "_pre_forward_module_hook"),
                    (f"{TORCH}/nn/modules/module.py", 1773, "_call_impl"),
                    (path, forward, "train"),
                ],
                path,
            )
        ],
        "running",
    )
    where = blocking(rank0)
    assert where.waits_for_peers and where.thread == "Dummy-3"
    assert (
        where.what == "all_gather_into_tensor (DeepSpeed ZeRO-3 gathering a module's parameters) (on Dummy-3)"
    )
    explanation = explain_classes(diagnoser(tmp_path), merge_stacks({0: rank0, 1: rank1}), 2, [0, 1])
    assert explanation.cause == "data-dependent-branch", explanation
    assert any("every rank must run the same forwards and backwards" in e for e in explanation.evidence)


def _looked(step: str, line: int) -> ProcessStack:
    main = ThreadStack(1, "MainThread", [Frame("/job/train.py", line, "main")], locals=[{"step": step}])
    main.user = [True]
    return ProcessStack(3000, [main])


def test_two_looks_tell_a_moving_job_from_a_stuck_one() -> None:
    first = {0: _looked("41", 20), 1: _looked("41", 22)}
    moving = movement.compare(first, {0: _looked("42", 20), 1: _looked("41", 20)}, 1.0, {}, {}, "/job")
    assert moving.everyone_moved
    assert moving.moved == {
        0: "step in main() went from 41 to 42",
        1: "its stack changed (train.py:22 -> train.py:20)",
    }
    stuck = movement.compare(
        first, {0: _looked("41", 20), 1: _looked("41", 22)}, 1.0, {0: Usage(5.0)}, {0: Usage(6.0)}, "/"
    )
    assert (stuck.moved, stuck.still, stuck.cores) == ({}, [0, 1], {0: 1.0})
    assert stuck.decided().startswith("no rank moved between two looks 1 s apart")
    assert any("CPU decides only for a process with no CUDA or NCCL loaded" in line for line in stuck.lines())


def test_a_rank_on_cpu_that_used_the_cpu_computed_where_its_stack_did_not_move() -> None:
    # DDP's backward at one line, both looks: on gloo a waiting rank sleeps, so 0.7 of a
    # core is work; the same CPU where CUDA is loaded decides nothing (NCCL spins)
    same = {0: _looked("41", 20), 1: _looked("41", 20)}
    cpu_before, cpu_after = {0: Usage(5.0), 1: Usage(5.0)}, {0: Usage(5.7), 1: Usage(5.01)}
    on_cpu = movement.compare(same, same, 1.0, cpu_before, cpu_after, "/job", frozenset({0, 1}))
    assert list(on_cpu.moved) == [0] and on_cpu.still == [1]
    assert "0.70 of a core with no CUDA or NCCL loaded" in on_cpu.moved[0]
    on_gpu = movement.compare(same, same, 1.0, cpu_before, cpu_after, "/job", frozenset())
    assert on_gpu.moved == {} and on_gpu.still == [0, 1]


def test_a_rank_that_moves_bytes_or_waits_for_the_disk_works_on_any_backend() -> None:
    # rank 0 writes a checkpoint (40 MB through write(2)) where both looks catch one line;
    # rank 1 sits in fsync (state D); rank 2 waits for them and moves a log line's bytes
    same = {rank: _looked("41", 20) for rank in range(3)}
    before = {0: Usage(io_bytes=10_000_000), 1: Usage(), 2: Usage(io_bytes=500)}
    after = {0: Usage(io_bytes=50_000_000), 1: Usage(main_state="disk-sleep"), 2: Usage(io_bytes=900)}
    looked = movement.compare(same, same, 1.0, before, after, "/job")  # CUDA loaded: CPU says nothing
    assert (sorted(looked.moved), looked.still) == ([0, 1], [2])
    assert "read or wrote 40.0 MB" in looked.moved[0]
    assert "waiting for the disk at a look (state D)" in looked.moved[1]


def test_a_computing_rank_on_a_loaded_machine_is_told_by_its_run_time_not_its_share() -> None:
    # two cores shared by eight processes: rank 0 computes with 0.1 of a core, its main
    # thread ready to run the whole second; rank 1 sleeps in gloo's wait
    same = {0: _looked("41", 20), 1: _looked("41", 20)}
    before = {0: Usage(5.0, main_runnable_seconds=3.0), 1: Usage(5.0, main_runnable_seconds=2.0)}
    after = {0: Usage(5.1, main_runnable_seconds=3.97), 1: Usage(5.001, main_runnable_seconds=2.002)}
    on_cpu = movement.compare(same, same, 1.0, before, after, "/job", frozenset({0, 1}))
    assert (list(on_cpu.moved), on_cpu.still) == ([0], [1])
    assert "running or ready to run 97% of the 1 s (it got 0.10 of a core" in on_cpu.moved[0]
    # where CUDA is loaded, a main thread ready to run may be spinning in NCCL's wait
    on_gpu = movement.compare(same, same, 1.0, before, after, "/job", frozenset())
    assert on_gpu.still == [0, 1]


def test_the_counters_of_real_processes_tell_a_writer_from_a_sleeper(tmp_path: Path) -> None:
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os\nwhile True:\n    open({str(tmp_path / 'f')!r}, 'wb').write(os.urandom(1 << 20))",
        ]
    )
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        pids = {0: writer.pid, 1: sleeper.pid}
        before = movement.usage(pids)
        time.sleep(1.0)
        after = movement.usage(pids)
        still = {0: _looked("41", 20), 1: _looked("41", 20)}
        looked = movement.compare(still, still, 1.0, before, after, "/job")
        assert (list(looked.moved), looked.still) == ([0], [1]), looked.moved
    finally:
        for process in (writer, sleeper):
            process.kill()
            process.wait(timeout=10)


class _Nvml:
    """A stand-in for pynvml: two GPUs spinning in NCCL kernels, one idle."""

    class _Process:
        def __init__(self, pid: int) -> None:
            self.pid, self.usedGpuMemory = pid, 20 * 2**30

    class _Rates:
        def __init__(self, gpu: int) -> None:
            self.gpu = gpu

    busy: ClassVar[dict[int, int]] = {0: 100, 1: 0, 2: 100}

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int:
        return 3

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Rates:
        return self._Rates(self.busy[handle])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[_Process]:
        return [self._Process(5000 + handle)]


def test_the_idle_gpu_names_the_odd_rank_when_stacks_look_alike(tmp_path: Path) -> None:
    reading = gpus.read({0: 5000, 1: 5001, 2: 5002, 3: 9999}, nvml=_Nvml())
    assert reading is not None
    assert reading.used == {0: (0, 100, 20.0), 1: (1, 0, 20.0), 2: (2, 100, 20.0)}
    assert reading.odd_ones() == ([1], [0, 2])
    assert reading.note == "rank 3: no GPU process with their pid (a container's pid namespace?)"
    assert "the GPUs of rank 1 idle while those of ranks 0,2 spin at 100%" in (reading.verdict() or "")


def test_a_job_without_cuda_reads_no_gpu(tmp_path: Path) -> None:
    import os

    assert gpus.read({0: os.getpid()}) is None  # this CPU process maps no CUDA library


def test_alike_stacks_with_an_idle_gpu_are_a_collective_apart_not_the_transport(tmp_path: Path) -> None:
    """Every rank at the same .item(): the stacks alone say transport; the idle GPU says
    rank 1 never launched the collective the others spin in."""
    path = script(tmp_path, EVAL_ONLY_ON_RANK_0)
    item_line = line_of(path, ".item()")
    stacks = {r: stack((path, item_line, "evaluate"), (path, 16, "main")) for r in range(3)}
    ranks = [RankProcess(5000 + r, r, 3) for r in range(3)]
    alike = diagnose_ranks(ranks, stacks)
    assert alike.findings[0].cause == "transport-hang"
    reading = gpus.read({r: 5000 + r for r in range(3)}, nvml=_Nvml())
    told = diagnose_ranks(ranks, stacks, devices=reading)
    finding = told.findings[0]
    assert (finding.cause, finding.ranks, finding.absent_ranks) == ("collective-order-mismatch", [0, 2], [1])
    assert "decided by the GPUs' utilisation (NVML), not by the stacks" in finding.evidence
    assert told.summary["gpus"][1] == "rank 1: GPU 1 at 0% utilisation, 20.0 GiB"


def test_an_async_checkpoint_thread_waiting_in_its_collective_is_what_the_rank_waits_for(
    tmp_path: Path,
) -> None:
    """DCP's async_save plans the save with collectives on a thread of its own while the
    main thread trains on (here: in its DataLoader)."""
    path = script(tmp_path, ZERO3_TRAIN)
    dcp = f"{TORCH}/distributed/checkpoint"
    rank = ProcessStack(
        4000,
        [
            _thread(
                "MainThread",
                [
                    (f"{TORCH}/utils/data/dataloader.py", 1448, "_next_data"),
                    (path, line_of(path, "for step, batch"), "train"),
                ],
                path,
            ),
            _thread(
                "AsyncCheckpointExecutor_0",
                [
                    (f"{TORCH}/distributed/distributed_c10d.py", 3100, "gather_object"),
                    (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
                    (f"{dcp}/utils.py", 150, "_DistWrapper.gather_object"),
                    (f"{dcp}/utils.py", 210, "_DistWrapper.reduce_scatter"),
                    (f"{dcp}/state_dict_saver.py", 290, "_save_state_dict"),
                    (f"{TORCH}/../concurrent/futures/thread.py", 58, "run"),
                ],
                path,
            ),
        ],
        "sleeping",
    )
    where = blocking(rank)
    assert where.waits_for_peers and where.thread == "AsyncCheckpointExecutor_0"
    assert where.what == (
        "gather_object (torch.distributed.checkpoint coordinating a save or load across the ranks) "
        "(on AsyncCheckpointExecutor_0)"
    )


SAVE_ON_RANK_0 = """
    import torch
    import torch.distributed as dist


    def save(state, path):
        for copy in range(12):
            torch.save(state, path)


    def main(state, path):
        if dist.get_rank() == 0:
            save(state, path)
        dist.barrier()
    """


def test_ranks_waiting_on_a_rank_that_works_are_a_job_in_progress_not_a_hang(tmp_path: Path) -> None:
    """Rank 0 saves a checkpoint (its stack moves between the looks) while rank 1 waits in
    the barrier after it: progressing, with rank 0 named as the one waited for and what it
    does; a hang only if the still rank is not in a collective or the mover merely vanished."""
    path = script(tmp_path, SAVE_ON_RANK_0)
    barrier = (path, line_of(path, "dist.barrier()"), "main")
    called = line_of(path, "        save(state, path)")
    writes = line_of(path, "torch.save(")
    saving = [stack((path, line, "save"), (path, called, "main")) for line in (writes, writes - 1)]
    waiting = waiting_in("barrier", barrier)
    ranks = [RankProcess(5000 + r, r, 2) for r in range(2)]
    first, second = {0: saving[0], 1: waiting}, {0: saving[1], 1: waiting}
    moved = movement.compare(first, second, 1.0, {}, {}, str(tmp_path))
    assert moved.working == [0] and moved.still == [1]
    report = diagnose_ranks(ranks, first, moved)
    assert (report.verdict.value, report.exit_code) == ("progressing", 0)
    finding = report.findings[0]
    assert (finding.cause, finding.severity.value, finding.ranks, finding.absent_ranks) == (
        "straggler",
        "warning",
        [1],
        [0],
    )
    assert "rank 1 waits in barrier at " in finding.message, finding.message
    assert "seen working between the looks: rank 0 (at " in finding.message, finding.message
    assert "in save). The job is progressing" in finding.message, finding.message
    assert "run doctor again in a few minutes" in finding.message
    assert [r.state.value for r in report.ranks] == ["running", "in-collective"]

    # the saving rank stopped moving (a slow or frozen file system): it waits on its disk,
    # not on a rank, and rank 1 waits for it; no hang of the collectives until the wait
    # nears the timeout, which two looks cannot time
    frozen = diagnose_ranks(ranks, first, movement.compare(first, first, 1.0, {}, {}, str(tmp_path)))
    assert (frozen.verdict.value, frozen.exit_code) == ("waiting", 0)
    held = frozen.findings[0]
    assert (held.cause, held.severity.value, held.ranks, held.absent_ranks) == (
        "straggler",
        "warning",
        [1],
        [0],
    )
    assert "Not a hang of the collectives: rank 0 waits on something that is not a rank" in held.message
    assert [r.state.value for r in frozen.ranks] == ["running", "in-collective"]
    # the mover only vanished between the looks: nothing was seen working
    vanished = movement.compare(first, {1: waiting}, 1.0, {}, {}, str(tmp_path))
    assert vanished.gone == [0] and vanished.working == []
    assert diagnose_ranks(ranks, first, vanished).verdict.value == "hang"
    # a still rank outside any collective is stuck itself, whatever the others do
    sleeping = stack((path, writes, "save"), (path, called, "main"))
    still_outside = {0: saving[0], 1: sleeping}
    moved_again = movement.compare(still_outside, {0: saving[1], 1: sleeping}, 1.0, {}, {}, str(tmp_path))
    assert diagnose_ranks(ranks, still_outside, moved_again).verdict.value == "hang"


def test_in_backward_the_engine_threads_hook_says_what_the_rank_does() -> None:
    main = _thread(
        "MainThread",
        [(f"{TORCH}/autograd/graph.py", 769, "_engine_run_backward"), ("/job/train.py", 41, "main")],
        "/job/train.py",
    )
    monitor = _thread(
        "Thread-1",
        [(f"{SITE}/tqdm/_monitor.py", 60, "run"), ("threading.py", 1016, "_bootstrap_inner")],
        "",
    )
    busy_logger = _thread(
        "Thread-2",
        [("/job/log.py", 9, "flush"), ("threading.py", 1016, "run"), ("threading.py", 973, "_bootstrap")],
        "/job/log.py",
    )
    zero_hook = _thread(
        "",
        [
            (f"{SITE}/deepspeed/runtime/zero/stage3.py", 1500, "partition_grads"),
            (f"{SITE}/deepspeed/runtime/zero/stage3.py", 1309, "__reduce_and_partition_ipg_grads"),
        ],
        "",
    )
    own_hook = _thread("", [("/job/hooks.py", 12, "clip_hook")], "/job/hooks.py")
    # a ZeRO-3 gradient hook on the engine's thread: the library's reduce, not DDP's buckets
    said = blocking(ProcessStack(1, [main, monitor, busy_logger, zero_hook]))
    assert said.what.startswith("DeepSpeed ZeRO-3 reducing gradients in backward (on the autograd engine's")
    assert "deepspeed/runtime/zero/stage3.py:1500 in partition_grads" in said.what and said.waits_for_peers
    # a hook of the user's own: work, not a wait for the other ranks
    own = blocking(ProcessStack(1, [main, monitor, own_hook]))
    assert (own.what, own.waits_for_peers) == (
        "a backward hook (on the autograd engine's thread, at /job/hooks.py:12 in clip_hook)",
        False,
    )
    # no Python frame on the engine's threads (the program's own threads aside): DDP's
    # reducer, native
    assert blocking(ProcessStack(1, [main, monitor, busy_logger])).what == (
        "all_reduce (DDP gradient buckets, in backward)"
    )


def test_ranks_absent_from_this_host_are_crashed_only_where_this_host_was_to_run_them() -> None:
    from ncclcheck.evidence.processes import _local_world_size, on_other_hosts

    def rank(r: int, local: int, node: int, local_world: int) -> RankProcess:
        return RankProcess(
            pid=100 + r, rank=r, world_size=8, local_rank=local, group_rank=node, local_world_size=local_world
        )

    # node 1 of two runs ranks 4-7; rank 6 is gone: it died here; ranks 0-3 run elsewhere
    seen = [rank(4, 0, 1, 4), rank(5, 1, 1, 4), rank(7, 3, 1, 4)]
    assert on_other_hosts(seen) == [0, 1, 2, 3]
    # the node's size unsaid: no absent rank can be placed, none is on this host for sure
    assert on_other_hosts([rank(4, 0, 1, 0), rank(5, 1, 1, 0)]) == [0, 1, 2, 3, 6, 7]
    assert _local_world_size({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert _local_world_size({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "3"}) == 1
    assert _local_world_size({"SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_NODEID": "1"}) == 2
    assert _local_world_size({}) == 0
