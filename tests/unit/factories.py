"""Synthetic evidence for the rules: calls as a trace records them, stacks as py-spy
dumps them, source files the rules read. No ranks are started."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from ncclcheck.evidence.stacks import ProcessStack, ThreadStack
from ncclcheck.evidence.traces import RankTrace
from ncclcheck.explain.context import Context, Evidence
from ncclcheck.model import CollectiveCall, Frame

# frames of the installed torch, which frames.py tells from the user's own code
TORCH = str(Path(torch.__file__).parent)


def script(tmp_path: Path, body: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return str(path)


def line_of(path: str, fragment: str) -> int:
    lines = Path(path).read_text().splitlines()
    (number,) = [i for i, line in enumerate(lines, 1) if fragment in line]
    return number


def call(
    rank: int,
    path: str,
    line: int,
    *,
    op: str = "all_reduce",
    function: str = "main",
    seq: int = 0,
    group: str = "0",
    shape: int = 2,
    stack: list[Frame] | None = None,
) -> CollectiveCall:
    """A call as the recorder writes it; ``stack`` (outermost first) defaults to the site."""
    site = Frame(path, line, function)
    return CollectiveCall(
        rank=rank,
        seq=seq,
        op=op,
        group=group,
        group_ranks=[0, 1],
        shapes=[[shape]],
        dtypes=["float32"],
        site=site,
        user_stack=[*(stack or []), site] if stack is not None else [site],
        time=float(seq),
    )


def trace(rank: int, calls: list[CollectiveCall], world_size: int = 2) -> RankTrace:
    return RankTrace(
        rank=rank, host="node", pid=100 + rank, world_size=world_size, initialised=True, calls=calls
    )


def thread(*frames: tuple[str, int, str], name: str = "MainThread") -> ThreadStack:
    """A thread's stack, innermost first as py-spy prints it: (file, line, function)."""
    return ThreadStack(1, name, [Frame(file, line, function) for file, line, function in frames])


def stack(*frames: tuple[str, int, str], status: str = "sleeping") -> ProcessStack:
    return ProcessStack(pid=1000, threads=[thread(*frames)], status=status)


def waiting_in(
    op: str, *user: tuple[str, int, str], torch_file: str = "distributed/distributed_c10d.py"
) -> ProcessStack:
    """A rank waiting in torch.distributed's ``op``, called from the user's frames
    (innermost first)."""
    return stack((f"{TORCH}/{torch_file}", 2500, op), *user)


def diagnoser(tmp_path: Path, world_size: int = 2, **evidence: object) -> Context:
    return Context(Evidence(world_size=world_size, cwd=str(tmp_path), **evidence))  # type: ignore[arg-type]
