"""record/starters.py: torch's start_processes is recognised where a process starts,
whoever called it and however it was imported; other processes start untouched. Run in
a fresh interpreter: the hook patches multiprocessing for the whole process."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = r"""
import json, multiprocessing
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import start_processes as bound_at_import
from ncclcheck.record import starters

seen = []

class Refused(BaseException):
    pass

def refuse(process, start):
    seen.append([start.launcher, start.index, start.nprocs, start.fn.__name__, list(start.args)])
    raise Refused()

def rank_fn(index, word):
    pass

starters.on_rank_start(refuse)
for call in (
    lambda: mp.spawn(rank_fn, args=("a",), nprocs=3),
    lambda: bound_at_import(rank_fn, args=("b",), nprocs=2, start_method="fork"),
):
    try:
        call()
    except Refused:
        pass
helper = multiprocessing.get_context("fork").Process(target=print, args=("helper ran",))
helper.start()
helper.join()
print(json.dumps({"seen": seen, "helper": helper.exitcode}))
"""


def test_torchs_ranks_are_recognised_at_their_start_and_other_processes_are_not() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {
        "seen": [
            ["torch.multiprocessing.spawn", 0, 3, "rank_fn", ["a"]],
            ["torch.multiprocessing.start_processes", 0, 2, "rank_fn", ["b"]],
        ],
        "helper": 0,
    }
    assert "helper ran" in done.stdout
