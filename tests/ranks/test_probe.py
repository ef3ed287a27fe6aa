"""probe on real torchrun ranks with gloo: figures, missing ranks, wrong results, subgroups."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from ..conftest import REPO, WAIT_S, processes_marked

pytestmark = pytest.mark.ranks

QUICK = ["--max-bytes", "1024", "--repeats", "2"]


def probe_bound(checkin_s: float = 20.0, op_s: float = 60.0) -> float:
    """The probe's own bound on its ranks (commands/probe.py: the check-in, each of four
    stages' collectives and a margin, at the options' defaults unless given), and a minute
    to report: a bound that matters only when something is broken."""
    return checkin_s + 4 * op_s + 60 + 60


def probe(
    *args: str, env: dict[str, str] | None = None, bound_s: float = probe_bound()
) -> tuple[subprocess.CompletedProcess[str], dict, float]:  # type: ignore[type-arg]
    mark = uuid.uuid4().hex
    user_tmp = tempfile.mkdtemp(prefix="user-tmp-")  # the probe must leave nothing there
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "probe", "--json", *args],
        capture_output=True,
        text=True,
        timeout=bound_s,
        cwd=REPO,
        env={**os.environ, "NCCLCHECK_TEST_MARK": mark, "TMPDIR": user_tmp, **(env or {})},
        check=False,
    )
    elapsed = time.monotonic() - start
    left = processes_marked(mark)
    assert left == [], f"processes outlived the probe: {left}"
    left_files = os.listdir(user_tmp)
    shutil.rmtree(user_tmp, ignore_errors=True)
    assert left_files == [], f"files the probe left in TMPDIR: {left_files}"
    return done, json.loads(done.stdout) if done.stdout.strip() else {}, elapsed


def test_four_ranks_pass_and_give_the_bandwidth_table() -> None:
    done, report, _ = probe("--nproc-per-node=4", *QUICK)
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["verdict"] == "aligned" and report["findings"] == []
    checks = {row["op"]: row for row in report["summary"]["checks"]}
    assert {"all_reduce(sum)", "all_reduce(max)", "broadcast", "all_gather", "barrier"} <= set(checks)
    assert all(row["ok_on"] == [0, 1, 2, 3] or row["skipped"] for row in checks.values())
    rows = report["summary"]["performance"]
    assert {row["op"] for row in rows} >= {"all_reduce", "all_gather", "broadcast"}
    largest = max((r for r in rows if r["op"] == "all_reduce"), key=lambda r: r["bytes"])
    assert largest["bytes"] == 512 and largest["time_us"] > 0
    # nccl-tests' bus bandwidth for all_reduce: algbw x 2(n-1)/n = 1.5 on 4 ranks
    assert largest["busbw_GBps"] == pytest.approx(largest["algbw_GBps"] * 1.5, rel=0.01)


OP_TIMEOUT_S = 300  # far from the 5 s check-in timeout, whatever the machine's load


@pytest.mark.timeout(probe_bound(5, OP_TIMEOUT_S) + 120)  # above the suite's per-test limit
@pytest.mark.parametrize("fault", ["NCCLCHECK_PROBE_TEST_CRASH_RANK", "NCCLCHECK_PROBE_TEST_STALL_RANK"])
def test_a_rank_that_never_checks_in_is_named(fault: str) -> None:
    args = ["--nproc-per-node=2", "--checkin-timeout=5", f"--op-timeout={OP_TIMEOUT_S}", *QUICK]
    done, report, elapsed = probe(*args, env={fault: "1"}, bound_s=probe_bound(5, OP_TIMEOUT_S))
    assert done.returncode == 1, done.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-crashed"
    assert finding["absent_ranks"] == [1] and finding["ranks"] == [0]
    assert finding["op"] == "check-in", finding
    # ended by the check-in timeout, not by a collective's (the process group's 300 s)
    assert elapsed < OP_TIMEOUT_S - 50, elapsed


def test_a_rank_that_corrupts_its_contribution_is_named() -> None:
    done, report, _ = probe("--nproc-per-node=4", *QUICK, env={"NCCLCHECK_PROBE_TEST_CORRUPT_RANK": "2"})
    assert done.returncode == 1
    named = {f["op"]: f for f in report["findings"]}
    assert named["all_gather"]["ranks"] == [2], named["all_gather"]
    assert "the wrong contribution came from rank 2" in named["all_gather"]["message"]
    assert "all_reduce(sum)" in named


def test_layout_subgroups_are_checked() -> None:
    done, report, _ = probe("--nproc-per-node=4", "--layout", "tp=2,dp=2", *QUICK)
    assert done.returncode == 0, done.stderr[-2000:]
    layout = report["summary"]["layout"]
    assert layout["tp"] == {"groups": [[0, 1], [2, 3]], "ok": True}
    assert layout["dp"] == {"groups": [[0, 2], [1, 3]], "ok": True}


def test_a_layout_that_does_not_cover_the_ranks_is_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ncclcheck", "probe", "--nproc-per-node=4", "--layout", "tp=3"],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2
    assert "covers 3 ranks, but the probe runs 4" in done.stderr and "Traceback" not in done.stderr
