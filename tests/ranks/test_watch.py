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

from ..conftest import (
    JOB_PG_TIMEOUT_S,
    PLAYBOOKS,
    PREFLIGHT_BOUND_S,
    REPO,
    SCRIPTS,
    WAIT_S,
    is_this_tests,
    line_in,
    ncclcheck,
    torchrun_argv,
)
from .test_doctor import _free_port

pytestmark = pytest.mark.ranks

REPRO = PLAYBOOKS / "rank-conditional-collective" / "repro.py"
QUICK = ["--after", "3", "--every", "1"]


def watch_cli(
    *args: str, env: dict[str, str] | None = None, bound_s: float = PREFLIGHT_BOUND_S
) -> tuple[int, dict, str]:  # type: ignore[type-arg]
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
        env={"REPRO_TIMEOUT_S": str(JOB_PG_TIMEOUT_S)},
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
    # every rank evaluates sample by sample, no collective, for several times --after's 3 s
    # (1000 samples each: 6 s on an idle core) before the metrics are all-reduced
    out = tmp_path / "watch"
    code, report, err = watch_cli(
        *QUICK, "--out", str(out), "--nproc-per-node", "2", str(SCRIPTS / "long_evaluation.py"),
        env={"RUN_S": "10", "EVAL_SAMPLES": "2000"},
    )  # fmt: skip
    assert report == {} and not out.exists(), err[-3000:]  # never called hung
    # the job's own end: 0, or 6 where gloo's teardown race on torch 2.13 aborted a rank
    # (SIGABRT, exit code -6) after its script returned; watch says so, with no hang
    assert code == 0 or (code == 6 and "exitcode: -6" in err and "no hang was seen" in err), err[-3000:]
    assert _no_process_of_this_test_left()


def test_a_running_job_is_watched_by_pid_and_left_running(tmp_path: Path) -> None:
    job = subprocess.Popen(
        torchrun_argv(REPRO, 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "REPRO_TIMEOUT_S": str(JOB_PG_TIMEOUT_S)},
        cwd=REPO,
        start_new_session=True,
    )
    try:
        # at once: torchrun has not started the ranks yet, and watch waits for them
        out = tmp_path / "watch"
        code, report, err = watch_cli(*QUICK, "--out", str(out), "--pid", str(job.pid))
        assert code == 1, err[-3000:]
        assert report["findings"][0]["cause"] == "rank-conditional-collective"
        assert job.poll() is None  # watch only reads a job it did not start
    finally:
        kill_tree(job.pid)
        job.wait(timeout=30)


def _two_node_job(port: int) -> list[subprocess.Popen[bytes]]:
    """One 4-rank job as two torchrun "nodes" of 2 ranks on this machine (the c10d
    rendezvous of a real multi-node launch): rank 0 all-reduces alone, ranks 1-3 wait in
    the barrier after it."""
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=2",
                f"--node-rank={node}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=two-nodes",
                str(REPRO),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "REPRO_TIMEOUT_S": str(JOB_PG_TIMEOUT_S), "OMP_NUM_THREADS": "1"},
            cwd=REPO,
            start_new_session=True,
        )
        for node in (0, 1)
    ]


def _wait_for_ranks(agents: list[subprocess.Popen[bytes]], bound_s: float = 90) -> None:
    """Until every node's two ranks wait in the repro's calls (one look of doctor on each)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        time.sleep(1)
        looks = [ncclcheck("doctor", "--json", "--interval", "0", "--pid", str(a.pid))[1] for a in agents]
        states = [rank.get("state") for look in looks for rank in (look or {}).get("ranks", [])]
        if len(states) == 4 and all(state == "in-collective" for state in states):
            return
    raise AssertionError("the two nodes' ranks did not reach the repro's calls")


def test_one_node_of_two_sets_apart_no_rank_of_the_other_and_two_watches_merge_one_report(
    tmp_path: Path,
) -> None:
    agents = _two_node_job(_free_port())
    shared = tmp_path / "shared"
    args = [*QUICK, "--shared", str(shared), "--merge-wait", "30", "--out", str(tmp_path / "out")]
    watches: list[subprocess.Popen[str]] = []
    try:
        _wait_for_ranks(agents)  # each node's watch finds the ranks its agent started
        # first, doctor alone on each node: node 0 holds rank 0 (in the all_reduce) and
        # rank 1 (in the barrier), the rank test is found there; ranks 2-3 run on the other
        # node, never called crashed
        done, first = ncclcheck("doctor", "--json", "--pid", str(agents[0].pid))
        (finding,) = first["findings"]
        assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
            "rank-conditional-collective",
            [0],
            [1],
        ), done.output[-2000:]
        assert first["summary"]["not_on_this_host"].startswith("ranks 2-3 run on other hosts")
        # node 1's ranks all wait in the barrier: nothing there sets a rank apart
        done, second = ncclcheck("doctor", "--json", "--pid", str(agents[1].pid))
        (finding,) = second["findings"]
        assert (finding["severity"], finding["absent_ranks"]) == ("warning", []), done.output[-2000:]
        assert "ranks 0-1 run on other hosts" in finding["message"]
        assert finding["fix"].startswith("What decides: the stacks of ranks 0-1")
        # then a watch on each node, through one shared folder: one report of the job
        watches = [
            subprocess.Popen(
                [sys.executable, "-m", "ncclcheck", "watch", "--json", *args, "--pid", str(agent.pid)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            for agent in agents
        ]
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and all(w.poll() is None for w in watches):
            time.sleep(0.5)
        reporter = next(w for w in watches if w.poll() is not None)
        out, err = reporter.communicate(timeout=30)
        assert reporter.returncode == 1, err[-3000:]
        report = json.loads(out)
        (finding,) = report["findings"]
        # one diagnosis of the whole job, from both nodes' stacks
        assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
            "rank-conditional-collective",
            [0],
            [1, 2, 3],
        ), report
        assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
        nodes = report["summary"]["nodes"]
        assert len(nodes) == 2 and not any("no node's capture" in line for line in nodes), nodes
        (capture,) = [p for p in shared.iterdir() if p.is_dir()]
        assert len(list(capture.glob("[!.]*-node[01].json"))) == 2
        assert not (shared / ".open-request").exists()
    finally:
        for agent in agents:
            kill_tree(agent.pid)
            agent.wait(timeout=30)
        for w in watches:
            kill_tree(w.pid)
            w.wait(timeout=30)
