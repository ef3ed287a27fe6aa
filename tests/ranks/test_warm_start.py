"""The warm start (launch/warm.py) on real processes: ranks forked from a server that
imported torch see the launch torchrun's ranks see, a failing rank ends the run as under
torchrun, and nothing is left behind whether the server is used, closed unused, or its
rank fails."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from ncclcheck.launch.torchrun import TorchrunOptions, run_dry
from ncclcheck.launch.warm import WarmStart
from ncclcheck.settings import DryRunSettings

from ..conftest import SCRIPTS, WAIT_S
from .test_preflight import leftover_ranks, preflight

pytestmark = pytest.mark.ranks

TWO = TorchrunOptions(nproc_per_node=2)
# the product's own stall timeout and time limit; no check-in, as preflight's replay has none
SETTINGS = DryRunSettings(probe_timeout=0.0)


def views(folder: Path) -> dict[int, dict[str, object]]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}


def gone(pids: list[int], within: float = WAIT_S) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids):
            return True
        time.sleep(0.1)
    return False


def test_forked_ranks_see_the_launch_torchrun_gives_them(tmp_path: Path) -> None:
    script = str(SCRIPTS / "launch_environment.py")
    seen: dict[str, dict[int, dict[str, object]]] = {}
    for how in ("torchrun", "warm"):
        out = tmp_path / how / "out"
        out.mkdir(parents=True)
        warm = WarmStart.start(2) if how == "warm" else None
        try:
            launch = run_dry(script, [str(out)], TWO, SETTINGS, tmp_path / how, warm=warm)
        finally:
            if warm is not None:
                warm.close()
        assert launch.returncode == 0, launch.log_path.read_text()[-2000:]
        assert sorted(p.name for p in (tmp_path / how).glob("rank-*.jsonl")) == [
            "rank-00000.jsonl",
            "rank-00001.jsonl",
        ]  # both recorded, as dry-run ranks
        seen[how] = views(out)
        for view in seen[how].values():
            assert view.pop("argv") == [str(out)]
    assert sorted(seen["warm"]) == [0, 1]
    for rank in (0, 1):
        assert seen["warm"][rank]["env"] == seen["torchrun"][rank]["env"], rank
        assert seen["warm"][rank] == seen["torchrun"][rank], rank
    assert seen["warm"][1]["env"]["LOCAL_RANK"] == "1"  # type: ignore[index]
    assert seen["warm"][0]["total"] == 3.0 and seen["warm"][0]["name"] == "__main__"


def test_a_server_closed_unused_ends_with_nothing_left() -> None:
    warm = WarmStart.start(2)
    pid = warm.proc.pid
    time.sleep(0.5)  # importing torch: closed midway
    warm.close()
    assert warm.proc.returncode is not None
    assert gone([pid])
    assert not leftover_ranks("ncclcheck.launch.warm")


def test_a_rank_that_fails_ends_the_run_as_under_torchrun_and_leaves_no_process(tmp_path: Path) -> None:
    """torchrun's policy: the rank left waiting for a partner that is gone gets SIGTERM,
    and the log ends with torchrun's summary (each failed rank's exit code, the first
    observed failure), read by the same parser as torchrun's own."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('rank 1 broke')\n"
        "time.sleep(120)  # rank 0 waits for a partner that is gone\n"
    )
    seen = {}
    for how in ("torchrun", "warm"):
        warm = WarmStart.start(2, idle=False) if how == "warm" else None
        try:
            launch = run_dry(str(script), [], TWO, SETTINGS, tmp_path / how, warm=warm)
        finally:
            if warm is not None:
                warm.close()
        log = launch.log_path.read_text()
        assert "RuntimeError: rank 1 broke" in log
        assert not launch.stalled, log[-2000:]
        seen[how] = (launch.returncode, launch.rank_exits, launch.first_failure)
        if warm is not None:
            assert gone([warm.proc.pid])
    assert seen["warm"] == seen["torchrun"] == (1, {0: -15, 1: 1}, 1), seen
    assert not leftover_ranks("ncclcheck.launch.warm")  # the forked ranks carry the server's name


def test_a_server_gone_before_its_order_leaves_a_run_with_no_rank_not_an_error(tmp_path: Path) -> None:
    """A server that ended before it read its order (seen once on a loaded machine) never
    opened the replay's log: the run ends with no rank and no log, and preflight then
    replays through torchrun (commands/preflight.py), never an internal error."""
    server = WarmStart.start(2)
    server.close()  # gone, as a server that died would be
    result = run_dry(str(SCRIPTS / "reduce_to_rank0.py"), [], TWO, SETTINGS, tmp_path / "replay", warm=server)
    assert not (tmp_path / "replay" / "torchrun.log").exists()
    assert (result.rank_exits, list((tmp_path / "replay").glob("rank-*.jsonl"))) == ({}, [])


PARENT = """\
import os, sys
import psutil
import torch.distributed as dist
dist.init_process_group("gloo")
parent = " ".join(psutil.Process(os.getppid()).cmdline())
with open(os.path.join(sys.argv[1], f"parent-{dist.get_rank()}.txt"), "w") as out:
    out.write(parent)
dist.barrier()
dist.destroy_process_group()
"""


def test_preflight_forks_its_ranks_warm_and_runs_torchrun_itself_when_asked(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    for option, parent in (
        ("--warm-start", "ncclcheck.launch.warm"),
        ("--no-warm-start", "torch.distributed.run"),
    ):
        out = tmp_path / option.strip("-")
        out.mkdir()
        proc, report = preflight("--nproc-per-node=2", option, str(script), str(out), cwd=tmp_path)
        assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]
        parents = [(out / f"parent-{rank}.txt").read_text() for rank in (0, 1)]
        assert all(parent in text for text in parents), parents
