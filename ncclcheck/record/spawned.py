"""The bootstrap of a script that starts its own ranks (preflight --launcher spawn):
``python -m ncclcheck.record.spawned SCRIPT ARGS`` runs the script once, as a plain
process, the way its users run it (the PyTorch DDP tutorial: ``mp.spawn(main,
args=(world_size,), nprocs=world_size)``), and every process it starts through
``torch.multiprocessing.spawn`` or ``start_processes`` becomes a recorded rank.

spawn hands each process its index and the arguments; the rank function is wrapped so
that it first starts this rank's recorder (rank = the index, world size = nprocs,
the same recorder, budget and stop as a torchrun rank's) and then runs as it would.
The wrapper is a function of this module and the user's function travels as its
argument, so the spawn start method pickles both by reference as it does without
ncclcheck. The parent itself records nothing: it runs no collective.

Not covered: a child imports the script (as ``__mp_main__``) before its recorder is
installed, so a collective bound at import (``from torch.distributed import
all_reduce``) escapes it; ranks started with plain ``multiprocessing.Process``.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from typing import Any

from ncclcheck.record import starters
from ncclcheck.record.bootstrap import find_module_file, run_guarded, start_recorder

_SCRIPT = "NCCLCHECK_SPAWN_SCRIPT"  # the script's path, for each rank's hello


def rank_entry(index: int, fn: Callable[..., Any], nprocs: int, args: tuple[Any, ...]) -> None:
    """What spawn runs in each process it starts: this rank's recorder, then the script's
    function with the index and arguments spawn would have passed."""
    recorder = start_recorder(index, os.environ[_SCRIPT], world_size=nprocs, local_rank=index)
    recorder.outermost_frame = sys._getframe()
    run_guarded(recorder, lambda: fn(index, *args))


def _record_started_ranks() -> None:
    """Every rank torch's start_processes starts (mp.spawn, Lightning's ddp_spawn, ...)
    runs ``rank_entry`` with the rank function as its argument, whoever called it
    (record/starters.py); spawn's own refusal inside a rank is the rank's recorder's
    business."""
    # this module runs as __main__ (python -m): its importable twin's function is the one
    # the spawn start method can pickle by name
    from ncclcheck.record.spawned import rank_entry as entry

    def record(process: Any, start: starters.RankStart) -> None:
        if start.fn is entry:
            return
        # start_processes' frame names nprocs, unless it starts them from a thread pool
        # (forkserver, TORCH_MP_PARALLEL_START=1): then each rank says index + 1 and the
        # report's world size, the largest a rank said, is still nprocs
        nprocs = start.nprocs or int(os.environ.get("WORLD_SIZE", "0")) or start.index + 1
        wrap_args = process._args
        process._args = (entry, start.index, (start.fn, nprocs, start.args), *wrap_args[3:])

    starters.on_rank_start(record)


def main() -> None:
    module = None
    if len(sys.argv) > 2 and sys.argv[1] == "-m":
        module = sys.argv.pop(2)
    if len(sys.argv) < 2:
        print("usage: python -m ncclcheck.record.spawned [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        sys.exit(2)
    script = (find_module_file(module, os.getcwd()) or module) if module else os.path.abspath(sys.argv[1])
    os.environ[_SCRIPT] = script
    _record_started_ranks()
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.getcwd() if module is not None else os.path.dirname(script)
    if module is not None:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
