"""watch on real torchrun jobs with gloo and real py-spy: a hang captured and diagnosed as
doctor would, a healthy job never called hung, a running job attached to by pid."""

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

from ..conftest import PLAYBOOKS, REPO, SCRIPTS, is_this_tests, line_in, ncclcheck, torchrun_argv

pytestmark = pytest.mark.ranks

REPRO = PLAYBOOKS / "rank-conditional-collective" / "repro.py"
QUICK = ["--after", "3", "--every", "1"]


def watch_cli(*args: str, env: dict[str, str] | None = None, bound_s: float = 150) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    """``ncclcheck watch --json ARGS``: its exit code, the JSON report on stdout ({} when
    none) and stderr (watch's lines and the job's output); bounded, its tree reaped."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncclcheck", "watch", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = proc.communicate(timeout=bound_s)
    finally:
        kill_tree(proc.pid)
    return proc.returncode, (json.loads(out) if out.strip() else {}), err


def _no_process_of_this_test_left() -> bool:
    me = psutil.Process()
    return not [p for p in psutil.process_iter() if p.pid != me.pid and is_this_tests(p)]


def test_a_hang_is_captured_diagnosed_and_the_job_ended(tmp_path: Path) -> None:
    out = tmp_path / "watch"
    code, report, err = watch_cli(
        *QUICK, "--on-hang", "kill", "--out", str(out), "--nproc-per-node", "2", str(REPRO),
        env={"REPRO_TIMEOUT_S": "120"},
    )  # fmt: skip
    assert code == 1, err[-3000:]
    (finding,) = report["findings"]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"].endswith(f"repro.py:{line_in(REPRO, 'dist.all_reduce(')}")
    (capture,) = out.iterdir()
    names = sorted(p.name for p in capture.iterdir())
    assert names[:4] == ["job-output.log", "report.html", "report.json", "report.txt"], names
    assert names[4].endswith("-node0.json"), names
    assert "error rank-conditional-collective" in (capture / "report.txt").read_text()
    assert json.loads((capture / "report.json").read_text())["findings"][0]["cause"] == finding["cause"]
    # the folder is doctor --from's: the same cause from the dumps alone
    again, from_capture = ncclcheck("doctor", "--json", "--from", str(capture))
    assert from_capture["findings"][0]["cause"] == finding["cause"], again.output[-2000:]
    assert _no_process_of_this_test_left()


def test_a_job_that_waits_on_one_working_rank_is_never_called_hung(tmp_path: Path) -> None:
    # rank 0 evaluates for 10 s while rank 1 waits in a collective: still, but not hung
    out = tmp_path / "watch"
    code, report, err = watch_cli(
        *QUICK, "--out", str(out), "--nproc-per-node", "2", str(SCRIPTS / "long_evaluation.py"),
        env={"RUN_S": "10"},
    )  # fmt: skip
    assert (code, report) == (0, {}), err[-3000:]
    assert "no hang seen" in err
    assert not out.exists()
    assert _no_process_of_this_test_left()


def test_a_running_job_is_watched_by_pid_and_left_running(tmp_path: Path) -> None:
    job = subprocess.Popen(
        torchrun_argv(REPRO, 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "REPRO_TIMEOUT_S": "120"},
        cwd=REPO,
        start_new_session=True,
    )
    try:
        time.sleep(2)  # watch finds the ranks once torchrun has started them
        out = tmp_path / "watch"
        code, report, err = watch_cli(*QUICK, "--out", str(out), "--pid", str(job.pid))
        assert code == 1, err[-3000:]
        assert report["findings"][0]["cause"] == "rank-conditional-collective"
        assert job.poll() is None  # watch only reads a job it did not start
    finally:
        kill_tree(job.pid)
        job.wait(timeout=30)
