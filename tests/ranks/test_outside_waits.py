"""Ranks that wait on something other than a rank are no hang: rank 0 downloads, reads
a slow pipe, waits on a subprocess or computes while the others wait in a barrier
(tests/scripts/outside_waits). preflight waits for it and warns with the rank, the line
and how long the others waited; doctor on the live job says `waiting`, not `hang`. The
same preparation that then makes a collective on rank 0 alone still fails. Every run
here is at the product's default stall timeout (15 s), which each wait outlasts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ncclcheck.launch.proctree import kill_tree

from ..conftest import PREFLIGHT_BOUND_S, SCRIPTS, WAIT_S, is_this_tests, line_in, ncclcheck

pytestmark = pytest.mark.ranks

PREPARES = SCRIPTS / "outside_waits" / "rank0_prepares.py"
MAIN_PROCESS_FIRST = SCRIPTS / "outside_waits" / "main_process_first.py"
PREPARE_S = "25"  # past the default stall timeout (15 s), when preflight used to call it a hang
BOUND_S = PREFLIGHT_BOUND_S  # at least a dry run's own limit (600 s)


def preflight(script: Path, env: dict[str, str], *options: str) -> tuple[int | None, dict]:  # type: ignore[type-arg]
    result, report = ncclcheck(
        "preflight", "--json", "--nproc-per-node=2", *options, str(script), env=env, bound_s=BOUND_S
    )
    assert report is not None, result.output[-3000:]
    return result.returncode, report


def the_wait(report: dict) -> dict:  # type: ignore[type-arg]
    (warning,) = [f for f in report["findings"] if f["cause"] == "straggler"]
    return warning  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("prepare", "waits_on", "fragment"),
    [
        (
            "download",
            "a blocking call (idle: a sleep, a read, a lock), `time.sleep(PREPARE_S)`",
            "time.sleep(PREPARE_S)",
        ),
        (
            "pipe",
            "a blocking call (idle: a sleep, a read, a lock), `writer.stdout.read()`",
            "writer.stdout.read()",
        ),
        ("subprocess", "a subprocess", 'subprocess.run(["sleep"'),
        ("compute", "compute (on the CPU)", "while time.monotonic() < end:"),
    ],
)
def test_rank0_preparing_while_the_others_wait_in_a_barrier_is_aligned_with_a_warning(
    prepare: str, waits_on: str, fragment: str
) -> None:
    code, report = preflight(PREPARES, {"PREPARE": prepare, "PREPARE_S": PREPARE_S})
    assert (code, report["verdict"]) == (0, "aligned"), report
    warning = the_wait(report)
    barrier = f"tests/scripts/outside_waits/rank0_prepares.py:{line_in(PREPARES, 'the others wait here')}"
    assert (warning["severity"], warning["ranks"], warning["absent_ranks"], warning["site"]) == (
        "warning",
        [1],
        [0],
        barrier,
    ), warning
    message = warning["message"]
    assert message.startswith("rank 0 kept rank 1 waiting "), message
    waited = float(message.split("waiting ", 1)[1].split(" s", 1)[0])
    assert waited >= 15, message  # at least the quiet that made preflight look
    assert f"in barrier at {barrier}" in message, message
    if prepare == "compute":  # a look lands on either line of the loop
        assert "in compute (on the CPU), `" in message and " in fetch(). No hang" in message, message
    else:
        at = f"tests/scripts/outside_waits/rank0_prepares.py:{line_in(PREPARES, fragment)}"
        assert f"in {waits_on} at {at}" in message, message
    assert "No hang: the job's collectives wait 1800 s for a peer" in message, message
    assert "init_process_group" in warning["fix"]


def test_accelerate_main_process_first_is_aligned_with_a_warning() -> None:
    code, report = preflight(MAIN_PROCESS_FIRST, {"PREPARE_S": PREPARE_S})
    assert (code, report["verdict"]) == (0, "aligned"), report
    warning = the_wait(report)
    assert (warning["ranks"], warning["absent_ranks"]) == ([1], [0]), warning
    line = line_in(MAIN_PROCESS_FIRST, "main_process_first()")
    assert warning["site"] == f"tests/scripts/outside_waits/main_process_first.py:{line}", warning
    assert "waited in barrier (accelerate's wait_for_everyone)" in warning["message"], warning


def test_the_same_preparation_with_a_collective_on_rank0_alone_still_fails() -> None:
    code, report = preflight(PREPARES, {"PREPARE": "download", "PREPARE_S": PREPARE_S, "ALSO_REDUCE": "1"})
    assert (code, report["verdict"]) == (1, "hang"), report
    error = report["findings"][0]
    line = line_in(PREPARES, "dist.all_reduce(torch.tensor([64.0]))")
    site = f"tests/scripts/outside_waits/rank0_prepares.py:{line}"
    assert (error["cause"], error["site"], error["ranks"], error["absent_ranks"]) == (
        "rank-conditional-collective",
        site,
        [0],
        [1],
    ), error


def test_a_wait_stopped_at_outside_wait_short_of_the_timeout_is_incomplete_not_a_hang() -> None:
    code, report = preflight(PREPARES, {"PREPARE": "download", "PREPARE_S": "300"}, "--outside-wait=20")
    assert (code, report["verdict"]) == (4, "incomplete"), report
    assert not [f for f in report["findings"] if f["severity"] == "error"], report
    incomplete = report["summary"]["incomplete"]
    assert "rank 1 had waited" in incomplete and "for rank 0, outside every collective" in incomplete
    assert "(--outside-wait 20 s), short of the job's 1800 s collective timeout" in incomplete
    warning = the_wait(report)
    assert "not over when the dry run stopped" in warning["message"], warning


def test_doctor_on_the_live_job_says_waiting_not_hang() -> None:
    """rank 0 in a 300 s sleep (a download), rank 1 in the barrier: doctor's two looks see
    no rank move, and still no hang of the collectives."""
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(PREPARES)],
        env={**os.environ, "PREPARE": "download", "PREPARE_S": "300"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # both ranks started and rank 1 in its barrier
            ranks = [p for p in psutil.Process(job.pid).children() if is_this_tests(p)]
            if len(ranks) == 2 and all(p.status() == psutil.STATUS_SLEEPING for p in ranks):
                result, report = ncclcheck("doctor", "--json", "--pid", str(job.pid), bound_s=WAIT_S)
                if report and any(r["state"] == "in-collective" for r in report["ranks"]):
                    break
            time.sleep(2)
        else:
            pytest.fail("the job's rank 1 never reached its barrier")
        assert (result.returncode, report["verdict"]) == (0, "waiting"), json.dumps(report, indent=1)
        (finding,) = report["findings"]
        assert (finding["cause"], finding["severity"], finding["ranks"], finding["absent_ranks"]) == (
            "straggler",
            "warning",
            [1],
            [0],
        )
        assert (
            f"rank0_prepares.py:{line_in(PREPARES, 'time.sleep(PREPARE_S)')} in fetch()" in finding["message"]
        )
        assert "Not a hang of the collectives" in finding["message"]
        assert finding["fix"].startswith("What decides: whether rank 0's wait ends")
    finally:
        kill_tree(job.pid)
        job.wait(timeout=30)


def test_watch_never_calls_a_job_waiting_on_its_downloading_rank_hung(tmp_path: Path) -> None:
    """No rank moves for several times --after while rank 0 sleeps in its preparation and
    rank 1 waits in the barrier: watch says who holds whom and watches on; the job ends."""
    from .test_watch import watch_cli

    out = tmp_path / "watch"
    code, report, err = watch_cli(
        "--after", "3", "--every", "1", "--out", str(out), "--nproc-per-node", "2", str(PREPARES),
        env={"PREPARE": "download", "PREPARE_S": PREPARE_S}, bound_s=BOUND_S,
    )  # fmt: skip
    assert report == {} and not out.exists(), err[-3000:]  # never called hung, nothing captured
    assert "rank 1 waits in a collective for rank 0, outside every collective in a blocking call" in err
    assert "no hang unless the wait nears the 600 s collective timeout" in err, err[-3000:]
    # the job's own end: 0, or 6 where gloo's teardown race on torch 2.13 aborted a rank
    assert code == 0 or (code == 6 and "exitcode: -6" in err), err[-3000:]


def test_watch_calls_the_same_wait_a_hang_near_the_collective_timeout(tmp_path: Path) -> None:
    from .test_watch import watch_cli

    out = tmp_path / "watch"
    code, report, err = watch_cli(
        "--after", "3", "--every", "1", "--collective-timeout", "20", "--on-hang", "kill",
        "--out", str(out), "--nproc-per-node", "2", str(PREPARES),
        env={"PREPARE": "download", "PREPARE_S": "300"}, bound_s=BOUND_S,
    )  # fmt: skip
    assert (code, report.get("verdict")) == (1, "hang"), err[-3000:]
    (finding,) = report["findings"]
    assert (finding["cause"], finding["severity"], finding["ranks"], finding["absent_ranks"]) == (
        "straggler",
        "error",
        [1],
        [0],
    )
    assert "near the 20 s collective timeout: rank 1 waits in barrier" in finding["message"], finding
    assert len(list(out.iterdir())) == 1  # the capture
