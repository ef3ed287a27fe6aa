"""``preflight --world-size W``: ranks of a W-rank job on one machine, on torch's fake
process group (record/virtual.py), a few at a time.

A fork server (``python -m ncclcheck.launch.virtual``) imports torch once and
forks each rank from that process, so a rank costs its own dry run, not an
interpreter start and a torch import. Rank 0 runs first, alone: it is the reference
whose collective results the other ranks take, and its trace tells the eval sets'
sizes, from which the ranks where a hand split's count changes are chosen. Each rank
gets the environment torchrun would give it in the production layout (G ranks per
virtual node: LOCAL_RANK, GROUP_RANK, LOCAL_WORLD_SIZE) and writes its trace as any
dry-run rank does; nothing waits on another rank, so a divergence is read from the
traces when the ranks are done, never waited for.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ncclcheck.record import preimport

MAX_WORLD_SIZE = 16384
LOG_NAME = "virtual.log"


@dataclass(frozen=True)
class VirtualLayout:
    world_size: int
    per_node: int  # ranks per virtual node: the production --nproc-per-node

    def environment(self, rank: int) -> dict[str, str]:
        """What torchrun sets for ``rank`` in this layout."""
        node = rank // self.per_node
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(rank % self.per_node),
            "LOCAL_WORLD_SIZE": str(self.per_node),
            "GROUP_RANK": str(node),
            "NODE_RANK": str(node),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(self.world_size),
            "GROUP_WORLD_SIZE": str(-(-self.world_size // self.per_node)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "ncclcheck-virtual",
            "OMP_NUM_THREADS": "1",
        }


@dataclass(frozen=True)
class VirtualWorld:
    """``--world-size W``: the production layout, run on the fake process group."""

    layout: VirtualLayout
    named: tuple[int, ...] = ()  # --ranks
    all_ranks: bool = False


@dataclass
class Reference:
    """What rank 0's run tells about the world before the other ranks run."""

    dataset_sizes: list[int]  # the eval sets it iterated (the whole set behind a Subset)
    subgroups: list[tuple[int, ...]]  # the members of each group smaller than the world it called on


_SUBGROUPS_FOLLOWED = 8  # a layout of many groups (one per node) is covered by the first few


def chosen_ranks(
    layout: VirtualLayout,
    dataset_sizes: list[int],
    named: list[int],
    subgroups: Sequence[tuple[int, ...]] = (),
) -> dict[int, str]:
    """The default subset: what differs between ranks. Rank 0 and the last rank; the
    first and last rank of the first, second and last virtual nodes (local_rank and
    node-leader tests); where an eval set of N samples split over W ranks changes its
    count (ranks below N % W hold one sample more; with N < W, rank N is the first with
    none); for each group rank 0 called a collective on, its second and last member and
    the first rank outside it (a member the script's own test leaves out: a leaders'
    group built for another node size); and the ranks asked for. rank -> why, in words."""
    world, per_node = layout.world_size, layout.per_node
    why: dict[int, list[str]] = {}

    def add(rank: int, reason: str) -> None:
        if 0 <= rank < world:
            why.setdefault(rank, []).append(reason)

    add(0, "rank 0")
    add(world - 1, "the last rank")
    for node in sorted({0, 1, (world - 1) // per_node}):
        add(node * per_node, f"the first rank of node {node}")
        add(min(node * per_node + per_node, world) - 1, f"the last rank of node {node}")
    for size in sorted(set(dataset_sizes)):
        if size < world:
            add(size - 1, f"the last rank with a sample of an eval set of {size}")
            add(size, f"the first rank with no sample of an eval set of {size}")
        elif size % world:
            add(size % world - 1, f"the last rank with one sample more of an eval set of {size}")
            add(size % world, f"the first rank with one sample fewer of an eval set of {size}")
    for members in subgroups[:_SUBGROUPS_FOLLOWED]:
        if not members or len(members) >= world:
            continue
        shown = (
            ",".join(map(str, members))
            if len(members) <= 4
            else f"{members[0]},{members[1]},...,{members[-1]}"
        )
        if len(members) > 1:
            add(members[1], f"the second member of the group of ranks {shown}")
        add(members[-1], f"the last member of the group of ranks {shown}")
        inside = set(members)
        add(
            next((r for r in range(world) if r not in inside), world),
            f"the first rank outside the group of ranks {shown}",
        )
    for rank in named:
        add(rank, "asked for (--ranks)")
    return {rank: ", ".join(reasons) for rank, reasons in sorted(why.items())}


_GROUP_RANKS = re.compile(r'"group_ranks":\[([0-9, ]*)\]')


def reference_of(trace_dir: Path) -> Reference:
    """The eval sets rank 0 iterated and the subgroups it called on, from its trace (the
    groups from its call sites' lines, each written once, read without parsing them)."""
    sizes: list[int] = []
    groups: dict[tuple[int, ...], None] = {}  # in the order rank 0 first used them
    path = trace_dir / "rank-00000.jsonl"
    try:
        with path.open(encoding="utf-8") as trace:
            for line in trace:
                found = _GROUP_RANKS.search(line) if '"t":"site"' in line else None  # named once per site
                if found is not None:
                    groups.setdefault(tuple(int(r) for r in found.group(1).split(",") if r.strip()), None)
                if '"t":"pass"' not in line.replace(" ", ""):
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("role") == "eval" and isinstance(record.get("dataset_len"), int):
                    sizes.append(int(record["dataset_len"]))
    except OSError:
        pass
    return Reference(sizes, list(groups))


@dataclass
class VirtualRun:
    exits: dict[int, int]  # rank -> exit code (negative: killed by that signal)
    elapsed: float
    timed_out: list[int]
    interrupted: bool = False


class VirtualServer:
    """The fork server of one virtual world (``python -m ncclcheck.launch.virtual``),
    started once: it imports torch once and runs each batch of ranks it is handed (rank 0
    alone, then the rest), so the rest pay no second interpreter and torch import. Used
    as a context manager: a stop signal meanwhile ends the server and its ranks, and
    every process it started is gone when the block ends."""

    def __init__(self, env: dict[str, str], trace_dir: Path) -> None:
        self.trace_dir = trace_dir
        self.interrupted = threading.Event()
        self._batches = 0
        self._log = (trace_dir / LOG_NAME).open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ncclcheck.launch.virtual"],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.PIPE,
            env={**os.environ, **env},
            start_new_session=True,
        )
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> VirtualServer:
        from ncclcheck.launch.stop import STOP_ASKED, STOP_SIGNALS  # the fork server never gets here

        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                    self._previous[sig] = signal.signal(sig, self._stop_on_signal)
        if STOP_ASKED.is_set():
            self._stop_on_signal()
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # no more batches: the server ends
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        _stop(self.proc)
        self._log.close()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _stop_on_signal(self, *_: Any) -> None:
        self.interrupted.set()
        _stop(self.proc)

    def run(
        self,
        command: list[str],
        env: dict[str, str],
        layout: VirtualLayout,
        ranks: list[int],
        rank_timeout: float,  # seconds a rank may go without writing to its trace
        jobs: int,
        on_done: Any = None,
    ) -> VirtualRun:
        """Run ``ranks``, ``jobs`` at a time; returns when the last has ended (or the
        server has). ``command``: the bootstrap's arguments (script or -m module, and the
        script's own)."""
        batch = self._batches
        self._batches += 1
        plan = {
            "command": command,
            "env": env,
            "ranks": [[rank, layout.environment(rank)] for rank in ranks],
            "jobs": jobs,
            "rank_timeout": rank_timeout,
            "results": str(self.trace_dir / f"virtual-exits-{batch}.json"),
            "logs": str(self.trace_dir),
        }
        plan_path = self.trace_dir / f"virtual-plan-{batch}.json"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        start = time.monotonic()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with contextlib.suppress(OSError, ValueError):  # a server gone already: nothing ran
            self.proc.stdin.write(f"{plan_path}\n".encode())
            self.proc.stdin.flush()
        for line in self.proc.stdout:  # "done RANK CODE" as each rank ends, "batch N" at its end
            if on_done is not None and line.startswith(b"done "):
                on_done(int(line.split()[1]))
            elif line.startswith(b"batch "):
                break
        try:
            results = json.loads(Path(plan["results"]).read_text(encoding="utf-8"))  # type: ignore[arg-type]
        except (OSError, ValueError):
            results = {"exits": {}, "timed_out": []}
        return VirtualRun(
            {int(rank): int(code) for rank, code in results["exits"].items()},
            time.monotonic() - start,
            [int(rank) for rank in results["timed_out"]],
            self.interrupted.is_set(),
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """The server and every rank it forked: they share its session."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# -- the fork server -------------------------------------------------------------------


def serve() -> None:
    """Import torch once, then for each plan named on stdin fork its ranks, ``jobs`` at
    a time; before each batch, import what rank 0 noted it imported beyond the server
    (DDP's torch._dynamo), so that no later rank imports it again."""
    # what each rank would import on its own: once, here
    import torch.distributed
    import torch.nn.parallel
    import torch.utils.data  # noqa: F401

    for batch, line in enumerate(sys.stdin):
        plan = json.loads(Path(line.strip()).read_text(encoding="utf-8"))
        os.environ.update(plan["env"])
        preimport.import_noted(plan["logs"])
        _run_batch(plan)
        sys.stdout.write(f"batch {batch}\n")
        sys.stdout.flush()


def _run_batch(plan: dict[str, Any]) -> None:
    ranks: list[tuple[int, dict[str, str]]] = [(int(r), e) for r, e in plan["ranks"]]
    exits: dict[int, int] = {}
    timed_out: list[int] = []
    running: dict[int, tuple[int, float]] = {}  # pid -> (rank, started)

    def reap(block: bool) -> None:
        while running:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            if pid == 0:
                break
            rank, _started = running.pop(pid)
            exits[rank] = os.waitstatus_to_exitcode(status)
            sys.stdout.write(f"done {rank} {exits[rank]}\n")
            sys.stdout.flush()
            block = False

    grown: dict[int, tuple[int, float]] = {}  # rank -> (trace data, when it last grew)
    looked = [0.0]

    def kill_late() -> None:
        now = time.monotonic()
        if now - looked[0] < 0.5:
            return
        looked[0] = now
        for pid, (rank, started) in list(running.items()):
            size = _trace_data(os.path.join(plan["env"]["NCCLCHECK_TRACE_DIR"], f"rank-{rank:05d}.jsonl"))
            last_size, since = grown.get(rank, (-1, started))
            if size != last_size:
                grown[rank] = (size, now)
            elif now - since > float(plan["rank_timeout"]) and rank not in timed_out:
                timed_out.append(rank)
                os.kill(pid, signal.SIGKILL)

    for rank, env in ranks:
        while len(running) >= int(plan["jobs"]):
            kill_late()
            reap(block=False)
            time.sleep(0.02)
        running[_fork_rank(plan, rank, env)] = (rank, time.monotonic())
    while running:
        kill_late()
        reap(block=False)
        time.sleep(0.02)
    Path(plan["results"]).write_text(json.dumps({"exits": exits, "timed_out": timed_out}), encoding="utf-8")


def _trace_data(path: str) -> int:
    """How much a rank has written (its trace file is grown ahead of its data)."""
    from ncclcheck.record.tracefile import data_end

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        return data_end(fd)
    finally:
        os.close(fd)


def _fork_rank(plan: dict[str, Any], rank: int, env: dict[str, str]) -> int:
    from ncclcheck.record.bootstrap import run_forked  # imported before the fork: the child only runs

    pid = os.fork()
    if pid:
        return pid
    # the server's stdin carries its plans: a rank reads nothing there, as under torchrun
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if rank == 0:  # what it imports, the server imports before forking the others
        import atexit

        atexit.register(preimport.note_new_imports, set(sys.modules), plan["logs"])
    run_forked(plan["command"], env, os.path.join(plan["logs"], f"rank-{rank:05d}.log"))


if __name__ == "__main__":
    serve()
