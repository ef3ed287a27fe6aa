"""The replay's warm start (launch/replay.py) on real processes: ranks forked from a
server that imported torch see the launch torchrun's ranks see, and nothing is left
behind whether the server is used, closed unused, or its rank fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ncclcheck.catalogue import load_catalogue
from ncclcheck.launch.proctree import kill_tree
from ncclcheck.launch.replay import WarmReplay
from ncclcheck.launch.torchrun import TorchrunOptions, run_dry
from ncclcheck.settings import DryRunSettings

from ..conftest import PLAYBOOKS, PREFLIGHT_BOUND_S, REPO, SCRIPTS, TEST_MARK, WAIT_S, WARM_START
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
    for how in ("torchrun", "warm", "first"):  # first: the server of --warm-start's first run
        out = tmp_path / how / "out"
        out.mkdir(parents=True)
        warm = WarmReplay.start(2, for_the_first_run=how == "first") if how != "torchrun" else None
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
        # unseeded numpy draws differ per rank, forked or not (a fork child would repeat
        # its server's generator: a rank-local draw would never part the ranks)
        draws = [seen[how][rank].pop("numpy_draw") for rank in sorted(seen[how])]
        assert len(set(draws)) == 2, (how, draws)
    for how in ("warm", "first"):
        assert sorted(seen[how]) == [0, 1]
        for rank in (0, 1):
            assert seen[how][rank]["env"] == seen["torchrun"][rank]["env"], (how, rank)
            assert seen[how][rank] == seen["torchrun"][rank], (how, rank)
        assert seen[how][1]["env"]["LOCAL_RANK"] == "1"  # type: ignore[index]
        assert seen[how][0]["total"] == 3.0 and seen[how][0]["name"] == "__main__"


def test_a_server_closed_unused_ends_with_nothing_left() -> None:
    warm = WarmReplay.start(2)
    pid = warm.proc.pid
    time.sleep(0.5)  # importing torch: closed midway
    warm.close()
    assert warm.proc.returncode is not None
    assert gone([pid])
    assert not leftover_ranks("ncclcheck.launch.replay")


def test_a_rank_that_fails_ends_the_others_as_under_torchrun_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(
        "import os, time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('rank 1 broke')\n"
        "time.sleep(120)  # rank 0 would wait for a partner that is gone\n"
    )
    warm = WarmReplay.start(2)
    try:
        launch = run_dry(str(script), [], TWO, SETTINGS, tmp_path / "t", warm=warm)
    finally:
        warm.close()
    log = launch.log_path.read_text()
    assert "RuntimeError: rank 1 broke" in log
    # as torchrun's agent: the failed rank ends the other (SIGTERM), no wait for a hang
    assert not launch.stalled, log[-2000:]
    assert (launch.rank_exits, launch.first_failure) == ({1: 1, 0: -15}, 1), log[-2000:]
    assert gone([warm.proc.pid])
    assert not leftover_ranks("ncclcheck.launch.replay")  # the forked ranks carry the server's name


def test_a_server_gone_before_its_order_leaves_a_run_with_no_rank_not_an_error(tmp_path: Path) -> None:
    """A server that ended before it read its order (seen once on a loaded machine) never
    opened the replay's log: the run ends with no rank and no log, and preflight then
    replays through torchrun (commands/preflight.py), never an internal error."""
    server = WarmReplay.start(2)
    server.close()  # gone, as a server that died would be
    result = run_dry(str(SCRIPTS / "reduce_to_rank0.py"), [], TWO, SETTINGS, tmp_path / "replay", warm=server)
    assert not (tmp_path / "replay" / "torchrun.log").exists()
    assert (result.rank_exits, list((tmp_path / "replay").glob("rank-*.jsonl"))) == ({}, [])


def test_a_crash_under_warm_start_is_named_with_the_exit_codes_torchrun_gives() -> None:
    """--warm-start's first run: the rank the OOM killer took (-9) and the other, ended by
    that death (1, its collective failing) or, where the server's SIGTERM to the survivors
    came first, as torchrun's does on a loaded machine (-15, seen in CI), read from the
    server's lines as from torchrun's failure summary; the playbook's cause, site and
    ranks either way, and nothing left of the server or its ranks."""
    playbook = load_catalogue(PLAYBOOKS).get("rank-crashed")
    nproc = f"--nproc-per-node={playbook.repro.nproc}"
    proc, report = preflight("--warm-start", nproc, str(playbook.repro_path))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["summary"]["launcher"].startswith("--warm-start: the ranks were forked"), report["summary"]
    exits = {state["rank"]: state["exit_code"] for state in report["ranks"]}
    assert exits[1] == -9 and exits[0] in (1, -15), exits
    finding = report["findings"][0]
    site_file = playbook.folder.relative_to(REPO) / playbook.repro.site_file
    site = f"{site_file}:{playbook.repro.site_line(playbook.folder)}"
    assert (finding["cause"], finding["site"]) == ("rank-crashed", site), finding
    assert (finding["ranks"], finding["absent_ranks"]) == (playbook.repro.ranks, playbook.repro.absent_ranks)
    assert not leftover_ranks(str(playbook.repro_path))


@pytest.mark.parametrize(
    ("script", "second_run"),
    [("patience_on_local_loss.py", "forced"), ("eval_decode_error.py", "line_evidence")],
)
def test_every_run_under_warm_start_is_forked(
    monkeypatch: pytest.MonkeyPatch, script: str, second_run: str
) -> None:
    """--warm-start holds for every run preflight makes: the second run that forces a
    decision on one rank (patience_on_local_loss.py's early stop), and the replay for line
    evidence (eval_decode_error.py's swallowed error), fork their ranks from the warm
    server that forked the first run: torchrun is never started, and torch is imported
    by one server, not one per run."""
    monkeypatch.setenv(WARM_START, "1")
    argv = [sys.executable, "-m", "ncclcheck", "preflight", "--json", "--nproc-per-node=2"]
    proc = subprocess.Popen(
        [*argv, str(SCRIPTS / script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    mark, agents, servers = os.environ[TEST_MARK], set(), set()
    deadline = time.monotonic() + PREFLIGHT_BOUND_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            for seen in psutil.process_iter(["pid", "ppid", "cmdline"]):
                command = " ".join(seen.info["cmdline"] or [])
                started = "torch.distributed.run" in command or "ncclcheck.launch.replay" in command
                try:
                    if not started or seen.environ().get(TEST_MARK) != mark:
                        continue
                    if "torch.distributed.run" in command:
                        agents.add(seen.pid)
                    elif seen.info["ppid"] == proc.pid:  # not a run or a rank the server forked
                        servers.add(seen.pid)
                except psutil.Error:
                    continue
            time.sleep(0.1)
        output, _ = proc.communicate(timeout=60)
    finally:
        kill_tree(proc.pid)  # at the bound, or a rank left behind: the test fails below
        if proc.poll() is None:
            proc.wait(timeout=30)
    report = json.loads(output)
    assert report["summary"][second_run], report["summary"]  # the second run was made
    assert report["summary"]["launcher"].startswith("--warm-start"), report["summary"]
    assert agents == set(), "torchrun started a run under --warm-start"
    assert len(servers) == 1, f"{len(servers)} warm servers, each importing torch"
