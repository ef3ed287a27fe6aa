"""The rank bootstrap: torchrun runs ``python -m ncclcheck.record.bootstrap SCRIPT ARGS``.

It installs the recorder, checks in with the other ranks through torchrun's
rendezvous store (a rank that never arrives is named instead of hanging), then
runs the user's script as ``__main__`` with its arguments, working directory
and ``sys.path[0]`` as ``python SCRIPT ARGS`` would have them.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import runpy
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from ncclcheck import frames
from ncclcheck.communicates import COLLECTIVES, P2P
from ncclcheck.record import (
    cpu_map,
    firing,
    frameworks,
    lines,
    nccl_timing,
    perturb,
    positions,
    preimport,
    rendezvous,
    rooted,
    starters,
    virtual,
)
from ncclcheck.record.launched import (
    ENV_LAUNCHER,
    LOCAL_RANK_ARGUMENT,
    give_back_user_tmpdir,
    slurm_task_environment,
)
from ncclcheck.record.loaders import DryRunComplete
from ncclcheck.record.recorder import (
    ENV_EVAL_PASSES,
    ENV_MAX_TRAIN_PASSES,
    ENV_TRACE_DIR,
    ENV_TRAIN_STEPS,
    OwnLauncher,
    Recorder,
)
from ncclcheck.record.tracefile import End
from ncclcheck.settings import Launcher

ENV_PROBE_TIMEOUT = "NCCLCHECK_PROBE_TIMEOUT"
PROBE_FAILED_EXIT = 75  # a rank whose peers never checked in


def install(recorder: Recorder) -> None:
    """Patch torch so that every collective, DDP bucket, phase change and batch is recorded."""
    _wrap_collectives(recorder)
    _track_phases_and_loaders(recorder)
    _hook_ddp_and_backward(recorder)
    _track_user_no_grad(recorder)
    _refuse_own_launchers()


def _wrap_collectives(recorder: Recorder) -> None:
    """Every collective and p2p call, group creation, and the process group's set-up and end."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for op in (*COLLECTIVES, *P2P):
        original = getattr(dist, op, None) or getattr(c10d, op, None)
        if original is None or hasattr(original, "__ncclcheck_wrapped__"):
            continue
        wrapped = recorder.wrap_collective(op, original)
        # Both namespaces: users call dist.x; torch's own helpers call c10d.x.
        for module in (dist, c10d):
            if getattr(module, op, None) is original:
                setattr(module, op, wrapped)

    original_new_group = dist.new_group
    if not hasattr(original_new_group, "__ncclcheck_wrapped__"):
        new_group = recorder.wrap_new_group(original_new_group)
        for module in (dist, c10d):
            if getattr(module, "new_group", None) is original_new_group:
                module.new_group = new_group

    original_init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original_init(*args, **kwargs)
        backend = str(dist.get_backend())
        recorder.write(
            {
                "t": "init",
                "backend": backend,
                "world_size": dist.get_world_size(),
                "timeout_s": _collective_timeout_s(args, kwargs, backend),
                "time": time.time(),
            }
        )
        return result

    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group

    original_destroy = dist.destroy_process_group

    def destroy_process_group(group: Any = None) -> Any:
        if group is None:  # the whole job: this rank can no longer wait on a collective
            recorder.write({"t": "destroy", "time": time.time()})
        return original_destroy(group)

    dist.destroy_process_group = destroy_process_group
    c10d.destroy_process_group = destroy_process_group


def _collective_timeout_s(args: tuple[Any, ...], kwargs: dict[str, Any], backend: str) -> float | None:
    """How long a collective of the job waits for its peers: the script's timeout, else the
    backend's default (a rank outside every collective that the others wait for longer
    than this fails the job, evidence/waits.py)."""
    import torch.distributed.distributed_c10d as c10d

    timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
    try:
        if timeout is None:
            timeout = c10d._get_default_timeout(backend)
        return float(timeout.total_seconds())
    except Exception:  # another torch's names: the wait is then judged without it
        return None


def _track_phases_and_loaders(recorder: Recorder) -> None:
    """Module.train()/eval() (the phase) and every DataLoader iteration (batches per pass)."""
    from torch import nn
    from torch.utils.data import DataLoader

    original_train = nn.Module.train
    in_train = [False]

    def train(self: nn.Module, mode: bool = True) -> nn.Module:
        if in_train[0]:  # train() recurses into children: only the outermost call counts
            return original_train(self, mode)
        in_train[0] = True
        try:
            result = original_train(self, mode)
        finally:
            in_train[0] = False
        recorder.set_module_mode(self)
        return result

    nn.Module.train = train

    original_iter = DataLoader.__iter__

    def dataloader_iter(self: DataLoader[Any]) -> Any:
        return recorder.track(self, lambda: original_iter(self), sys._getframe(1))

    DataLoader.__iter__ = dataloader_iter


def _hook_ddp_and_backward(recorder: Recorder) -> None:
    """DDP's gradient all-reduces, through a comm hook that chains to the user's, and
    backward() calls (where they come from)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    original_ddp_init = DistributedDataParallel.__init__
    original_register = DistributedDataParallel.register_comm_hook
    before = set(sys.modules)  # what a server imports before it forks ranks is noted against this

    def ddp_init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        original_ddp_init(self, *args, **kwargs)
        folder = os.environ.get(ENV_TRACE_DIR)
        if recorder.rank == 0 and before and folder:  # DDP imports torch._dynamo: a server will too
            preimport.note_new_imports(before, folder)
            before.clear()
        # DDP checks a hook's annotations; a lambda has none to trip over.
        original_register(self, self, lambda state, bucket: recorder.ddp_hook(state, bucket))
        self.__dict__["_ncclcheck_user_hook"] = None

    def register_comm_hook(self: DistributedDataParallel, state: Any, hook: Any) -> None:
        if "_ncclcheck_user_hook" in self.__dict__:
            self.__dict__["_ncclcheck_user_hook"] = (state, hook)  # our hook calls it
        else:
            original_register(self, state, hook)

    DistributedDataParallel.__init__ = ddp_init
    DistributedDataParallel.register_comm_hook = register_comm_hook

    original_backward = torch.autograd.backward

    def backward(*args: Any, **kwargs: Any) -> Any:
        recorder.note_backward(sys._getframe(1))
        recorder.in_backward += 1
        try:
            return original_backward(*args, **kwargs)
        finally:
            recorder.in_backward -= 1

    torch.autograd.backward = backward


def _refuse_own_launchers() -> None:
    """Ranks started inside a rank (torch.multiprocessing.spawn / start_processes, called
    by the script or by a framework such as Lightning's ddp_spawn): they would be new
    interpreters without the recorder, waiting on each other unseen. Found where the
    process starts (record/starters.py), not by the name the caller looked up."""

    def refuse(_process: Any, start: starters.RankStart) -> None:
        raise OwnLauncher(start.launcher)

    starters.on_rank_start(refuse)


# Frames of torch's context-manager machinery, between a `with torch.no_grad()` (or a
# `@torch.no_grad()` function) and the code that asked for it.
_GRAD_MODE_FILES = ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py")


def _track_user_no_grad(recorder: Recorder) -> None:
    """Count the no_grad / inference_mode blocks the user's own code opens.

    Evaluation is the user turning gradients off; libraries turn them off for their
    own reasons (FSDP all-gathers parameters under no_grad in the forward of a
    training step), and that is not evaluation.
    """
    import torch

    def user_initiated(frame: Any) -> bool:
        while frame is not None and frame.f_code.co_filename.replace("\\", "/").endswith(_GRAD_MODE_FILES):
            frame = frame.f_back
        return frame is not None and frames.is_user_code(frame.f_code)

    for cls in (torch.no_grad, torch.inference_mode):
        original_enter, original_exit = cls.__enter__, cls.__exit__

        # functools.wraps: TorchScript compiles no_grad as a class from its methods'
        # source (torch.distributed.optim's functional optimizers do, on import), and
        # inspect follows __wrapped__ to torch's own, which it can compile.
        @functools.wraps(original_enter)
        def enter(self: Any, _original: Any = original_enter) -> Any:
            user = user_initiated(sys._getframe(1))
            self._ncclcheck_user = user
            if user:
                recorder.user_no_grad += 1
            return _original(self)

        @functools.wraps(original_exit)
        def exit_(self: Any, *exc: Any, _original: Any = original_exit) -> Any:
            try:
                return _original(self, *exc)
            finally:
                if getattr(self, "_ncclcheck_user", False):
                    recorder.user_no_grad -= 1

        cls.__enter__ = enter
        cls.__exit__ = exit_


def check_in(recorder: Recorder, timeout_s: float) -> None:
    """Every rank announces itself in torchrun's store and waits for all the others.

    Ranks that never arrive are named with the host their node's other ranks
    reported, instead of the first collective hanging on them.
    """
    start = time.time()
    try:
        rendezvous.check_in("checkin", timeout_s)
    except rendezvous.CheckInFailed as failed:
        recorder.write(
            {
                "t": "probe",
                "ok": False,
                "missing": failed.missing,
                "present": {str(r): v for r, v in failed.present.items()},
                "waited": time.time() - start,
            }
        )
        recorder.close()
        print(
            f"ncclcheck: ranks {failed.missing} never checked in within {timeout_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        os._exit(PROBE_FAILED_EXIT)
    recorder.write({"t": "probe", "ok": True, "waited": time.time() - start})


def main() -> None:
    give_back_user_tmpdir()
    # torch.distributed.launch's --local-rank=N, put before the script: the script's, first
    legacy: list[str] = []
    if len(sys.argv) > 1 and LOCAL_RANK_ARGUMENT.match(sys.argv[1]):
        legacy.append(sys.argv.pop(1))
    module = None
    if len(sys.argv) > 2 and sys.argv[1] == "-m":
        module = sys.argv.pop(2)  # what stays in argv[1] is the script's place
    if len(sys.argv) < 2:
        print("usage: python -m ncclcheck.record.bootstrap [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        sys.exit(2)
    if module is not None:
        script = find_module_file(module, os.getcwd()) or module  # run_module says what is wrong
    else:
        script = os.path.abspath(sys.argv[1])
    recorder = start_recorder(int(os.environ.get("RANK", "0")), script, module)
    if os.environ.get(ENV_LAUNCHER) == Launcher.SLURM:  # the script sees what srun would have set
        task, gone = slurm_task_environment(dict(os.environ), socket.gethostname())
        for name in gone:
            del os.environ[name]
        os.environ.update(task)

    # As `python SCRIPT ARGS` (or `python -m MODULE ARGS`) would: argv, and sys.path[0]
    # the script's folder (the current folder for a module).
    sys.argv = [script, *legacy, *sys.argv[2:]]
    sys.path[0] = os.getcwd() if module is not None else os.path.dirname(script)
    recorder.outermost_frame = sys._getframe()
    # periodic actions fire once within the budget, decisions on a rank's own value are
    # watched, one is forced in a second run (record/firing.py)
    firing.install(
        lambda file, line, function, forced: recorder.write(
            {
                "t": "fired",
                "kind": "made to fire" if forced else "fired",
                "site": [file, line, function],
                "time": time.time(),
            }
        ),
        lambda file, line, function, taken, forced: recorder.write(
            {
                "t": "decided",
                "taken": taken,
                "forced": forced,
                "site": [file, line, function],
                "time": time.time(),
            }
        ),
        int(os.environ.get("RANK", "0")),
        lambda file, line, function, error, raised: recorder.write(
            {
                "t": "caught",
                "site": [file, line, function],
                "error": error,
                "raised": list(raised) if raised else None,
                "time": time.time(),
            }
        ),
        lambda file, line, count, digest, informative: recorder.write(
            {
                "t": "decision_read",
                "site": [file, line],
                "n": count,
                "read": digest,
                "informative": informative,
            }
        ),
    )
    # a replay for line evidence (explain/lines.py): installed last, nearest the script
    if os.environ.get(lines.ENV_LINES):
        lines.install(recorder, os.environ[lines.ENV_LINES], os.environ[ENV_TRACE_DIR])
    if module is not None:
        run_guarded(recorder, lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    else:
        run_guarded(recorder, lambda: runpy.run_path(script, run_name="__main__"))


def start_recorder(rank: int, script: str, module: str | None = None, **known: int) -> Recorder:
    """This rank's recorder, written to and installed in torch as the dry run's settings
    say; ``known``: what the launcher's environment does not say (a spawned rank's
    world size and local rank)."""
    env = os.environ
    recorder = Recorder(
        env[ENV_TRACE_DIR],
        rank,
        train_steps=int(env.get(ENV_TRAIN_STEPS, "5")),
        eval_passes=int(env.get(ENV_EVAL_PASSES, "1")),
        max_train_passes=int(env.get(ENV_MAX_TRAIN_PASSES, "10")),
    )
    recorder.hello(script, **known)
    frames.add_user_root(os.path.dirname(script))
    if module is not None:
        frames.add_user_root(os.getcwd())  # the package's other modules, from its root
    timing = env.get(nccl_timing.ENV_NCCL_TIMING) == "1"
    if timing:
        nccl_timing.install()  # under the recorder's wrappers: it records the call, then enqueues it
    if env.get(virtual.ENV_VIRTUAL):  # under the recorder's wrappers: it records, then the fake group runs
        virtual.install(env[virtual.ENV_VIRTUAL], rank, int(env.get("WORLD_SIZE", "1")))
    rooted.install(recorder)  # before the collectives are wrapped: it wraps reduce first
    install(recorder)
    if recorder.fast_forward is not None and recorder.fast_forward.train_end > 0:
        positions.install()  # enumerate() over a fast-forwarded train pass counts its positions
    frameworks.install(recorder)
    if env.get(cpu_map.ENV_CPU) == "1":
        cpu_map.install(recorder)
    if env.get(perturb.ENV_PERTURB) == "1":
        perturb.install(recorder, rank)
    if timing:
        nccl_timing.install_device_synchronize()  # over --cpu's no-op
    probe_timeout = float(env.get(ENV_PROBE_TIMEOUT, "0"))
    if probe_timeout > 0:
        check_in(recorder, probe_timeout)
    return recorder


def run_guarded(recorder: Recorder, body: Callable[[], Any]) -> None:
    """Run the rank's code and record how it ended: returned, the dry run's stop (the
    process ends there, before any atexit hook can issue a collective), an exit, an
    exception (raised on, as without ncclcheck)."""
    try:
        body()
        recorder.exit(End.RETURNED, 0)
    except DryRunComplete as complete:
        lines.finish("dry-run-complete", recorder.state.calls)
        recorder.exit(End.DRY_RUN_COMPLETE, 0, stack=_user_frames_of(complete))
        recorder.close()
        # Skip atexit hooks and destructors: they may issue collectives of their own.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except virtual.VirtualWorldRefused as exc:
        recorder.exit(End.VIRTUAL_REFUSED, 2, error=str(exc), site=_describe_exception(exc)[1])
        recorder.close()
        os._exit(2)
    except OwnLauncher as exc:
        _error, site = _describe_exception(exc)
        recorder.exit(End.OWN_LAUNCHER, 2, error=str(exc), site=site)  # error: the launcher's name
        recorder.close()
        os._exit(2)  # nothing was started: no collective, no cleanup to run
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        error, site = _describe_exception(exc)  # where it left
        recorder.exit(End.SYS_EXIT, code, error=error, site=site)
        raise
    except BaseException as exc:
        error, site = _describe_exception(exc)
        recorder.exit(End.EXCEPTION, 1, error=error, site=site)
        raise
    finally:
        lines.finish("exit", recorder.state.calls)
        recorder.close()


def find_module_file(name: str, cwd: str) -> str | None:
    """The file ``python -m name`` would run from ``cwd``, found without importing
    anything (a package's __init__ run before the recorder is installed would keep
    unrecorded collectives): name.py or name/__main__.py under cwd, PYTHONPATH, or this
    interpreter's path."""
    if not name or not all(part.isidentifier() for part in name.split(".")):
        return None
    relative = os.path.join(*name.split("."))
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for base in [cwd, *pythonpath, *(p for p in sys.path[1:] if p)]:
        for candidate in (relative + ".py", os.path.join(relative, "__main__.py")):
            path = os.path.join(base, candidate)
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


def _user_frames_of(exc: BaseException) -> list[list[Any]]:
    """The user's frames an exception passed through, as [file, line, function],
    outermost first."""
    return [
        [summary.filename, summary.lineno or 0, summary.name]
        for summary in traceback.extract_tb(exc.__traceback__)
        if frames.is_user_file(summary.filename)
    ]


def _describe_exception(exc: BaseException) -> tuple[str, list[Any] | None]:
    """The error as text (type, message, and where it left the user's code) and that
    place as [file, line, function]: the innermost user frame it passed through."""
    user = _user_frames_of(exc)
    site = user[-1] if user else None
    where = f" at {site[0]}:{site[1]} in {site[2]}" if site else ""
    return f"{type(exc).__name__}: {exc}{where}", site


def _draw_a_fresh_numpy_seed() -> None:
    """numpy's global generator is seeded from the OS at its import, so ranks that each
    started an interpreter draw differently; forked from one that imported it (torch
    does), every rank would draw the same numbers and a rank-local draw would never part
    them. Python's ``random`` reseeds itself in a fork child; torch's default seed is the
    same in every interpreter anyway."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


def run_forked(command: list[str], env: dict[str, str], log_path: str | None = None) -> NoReturn:
    """A rank forked from a server that imported torch already (launch/virtual.py,
    launch/replay.py): its ``env`` set and its output sent to ``log_path`` (kept where
    None), ``main`` with ``command`` (script or -m module, and the script's arguments)
    as its arguments, then the process ends as an interpreter would, its exit hooks
    run; whatever fails, even the set-up, it never returns into the server's code."""
    code = 1
    try:
        os.environ.update(env)
        _draw_a_fresh_numpy_seed()
        if log_path is not None:
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
        sys.argv = ["ncclcheck.record.bootstrap", *command]
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()  # what the rank's interpreter would run at its end
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
