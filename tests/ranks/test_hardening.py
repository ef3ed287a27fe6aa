"""Hardening: faults during preflight, bad input that is not a script, private files,
and the environment a dry run gives the script. Every fault is reported as what it
was, the traces stay readable, and no process outlives the command."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import uuid
from pathlib import Path

import pytest

from ncclcheck.evidence.traces import load_traces

from ..conftest import PREFLIGHT_BOUND_S, REPO, SCRIPTS, WAIT_S, processes_marked, run_bounded

FAULTS = SCRIPTS / "faults.py"


def line_of(fragment: str) -> int:
    lines = FAULTS.read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if fragment in text)


def preflight(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    mark = uuid.uuid4().hex
    argv = [sys.executable, "-m", "ncclcheck", "preflight", "--json", *args]
    result = run_bounded(argv, PREFLIGHT_BOUND_S, env={**(env or {}), "NCCLCHECK_TEST_MARK": mark}, cwd=REPO)
    assert processes_marked(mark) == [], "processes outlived preflight"
    report = json.loads(result.output[result.output.index("{") :]) if "{" in result.output else None
    return result, report


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("fault", "cause", "fragment", "words"),
    [
        (
            "sigkill",
            "rank-crashed",
            "dist.all_reduce(torch.ones(2))",
            "rank 1 died (SIGKILL) in or right after",
        ),
        ("segfault", "rank-crashed", None, "rank 1 died"),
        (
            "setup-error",
            "rank-crashed",
            'raise RuntimeError("CUDA error',
            "rank 1 died: RuntimeError: CUDA error: invalid device ordinal",
        ),
        # an error of the code's own, not caught: sited where it was raised
        (
            "record-error",
            "rank-exception",
            "raise FileNotFoundError",
            "rank 1 raised at tests/scripts/faults.py:",
        ),
        ("exit0", "rank-early-exit", "sys.exit(0)", "rank 1 left the script early (sys.exit at"),
        (
            "loader",
            "straggler",
            "time.sleep(3600)",
            "still busy outside any collective (in its DataLoader",
        ),
    ],
)
def test_a_fault_is_reported_as_what_it_was(
    tmp_path: Path, fault: str, cause: str, fragment: str | None, words: str
) -> None:
    # the stuck loader keeps rank 0 waiting in all_reduce: a hang once the wait reaches the
    # process group's timeout, made short here (a wait outside collectives is waited for)
    env = {"FAULT": fault, "PG_TIMEOUT_S": "20"}
    result, report = preflight("--trace-dir", str(tmp_path), str(FAULTS), env=env)
    assert result.returncode == 1, result.output
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    assert words in finding["message"], finding["message"]
    if fault == "loader":
        assert "of the job's 20 s collective timeout: the real job fails there" in finding["message"]
    if fragment is not None:
        site = f"tests/scripts/faults.py:{line_of(fragment)}"
        assert site in finding["message"] or site in " ".join(finding["evidence"]) or finding["site"] == site
    if fault == "segfault":
        assert any("SIGSEGV" in line for line in finding["evidence"])
    traces = load_traces(tmp_path)  # intact: every rank's record reads back
    assert sorted(traces) == [0, 1]
    if fault in ("setup-error", "record-error"):  # the site is where the error left
        assert finding["site"] == f"tests/scripts/faults.py:{line_of(fragment)}"
        assert finding["absent_ranks"] == [1]
    else:
        assert all(trace.calls for trace in traces.values())


@pytest.mark.ranks
def test_ranks_that_spin_while_their_records_disagree_are_hung_without_waiting_longer() -> None:
    # Busy CPUs forgive quiet up to 4x the stall timeout; records that already show
    # rank 0 in all_reduce and rank 1 in the barrier do not need the wait.
    result, report = preflight(str(FAULTS), env={"FAULT": "spinning-hang"})
    assert result.returncode == 1, result.output[-3000:]
    assert report["verdict"] == "hang"
    assert "their records disagree" in report["summary"]["stopped"], report["summary"]
    finding = report["findings"][0]
    assert (finding["cause"], finding["ranks"], finding["absent_ranks"]) == (
        "rank-conditional-collective",
        [0],
        [1],
    )


@pytest.mark.ranks
@pytest.mark.parametrize("fault", ["slow-worker", "slow-step"])
def test_a_rank_that_computes_past_the_stall_timeout_is_not_hung(fault: str) -> None:
    # 20 s of work on rank 1 (its DataLoader worker's, or its own) against the 15 s stall
    # timeout, while rank 0 sleeps in all_reduce: slow, then aligned, with the wait said
    result, report = preflight(str(FAULTS), env={"FAULT": fault, "SLOW_S": "20"})
    assert result.returncode == 0, result.output[-3000:]
    assert report["verdict"] == "aligned", report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]


@pytest.mark.ranks
def test_a_taken_rendezvous_port_is_said_plainly() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result, _ = preflight(
            "--master-addr=127.0.0.1", f"--master-port={port}", str(SCRIPTS / "train_only.py")
        )
    assert result.returncode == 2, result.output
    assert f"the rendezvous port {port} is already in use" in result.output
    assert "Traceback" not in result.output


@pytest.mark.ranks
def test_traces_are_private_and_the_script_knows_it_is_a_dry_run(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    result, _ = preflight("--trace-dir", str(folder), str(FAULTS), env={"FAULT": "none"})
    assert result.returncode == 0, result.output
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert files and all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in files)
    assert (folder / "torchrun.log").read_text().count("NCCLCHECK_DRY_RUN=1") == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no trace files (rank-*.jsonl) in it"),
        (b"\x00\x01binary", "not a trace file (no complete first line)"),
        (b"garbage{{{\n{}\n", ":1: not a trace line"),
        (b"", "its 2 trace file(s) are empty"),
    ],
)
def test_from_a_folder_without_good_traces_is_exit_2(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "rank-00000.jsonl").write_bytes(content)
        if not content:
            (tmp_path / "rank-00001.jsonl").write_bytes(content)
    argv = [sys.executable, "-m", "ncclcheck", "preflight", "--from", str(tmp_path)]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_a_trace_cut_mid_line_is_read_up_to_the_cut(tmp_path: Path) -> None:
    hello = {"t": "hello", "rank": 0, "world_size": 1, "host": "h", "pid": 1, "script": "x.py"}
    call = {"t": "call", "n": 1, "seq": 0, "op": "barrier", "group": "0", "stack": [["x.py", 3, "main"]]}
    text = json.dumps(hello) + "\n" + json.dumps(call) + "\n" + json.dumps(call)[:25]
    (tmp_path / "rank-00000.jsonl").write_text(text)
    traces = load_traces(tmp_path)
    assert len(traces[0].calls) == 1


def test_a_py_spy_that_is_not_there_is_exit_2() -> None:
    argv = [sys.executable, "-m", "ncclcheck", "doctor", "--pid", str(os.getpid())]
    result = run_bounded(argv, WAIT_S, env={"NCCLCHECK_PY_SPY": "/no/such/py-spy"}, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "py-spy not found at /no/such/py-spy" in result.output and "Traceback" not in result.output


def test_py_spy_missing_from_path_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ncclcheck.errors import InputError
    from ncclcheck.evidence import stacks

    monkeypatch.delenv("NCCLCHECK_PY_SPY", raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no py-spy beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="py-spy is not installed or not on PATH"):
        stacks.find_py_spy()


@pytest.mark.ranks
def test_sixteen_ranks_on_two_cores_are_diagnosed_right() -> None:
    # 16 ranks start slowly here; a quiet job that still computes is not called hung.
    script = REPO / "playbooks" / "rank-conditional-collective" / "repro.py"
    argv = [sys.executable, "-m", "ncclcheck", "preflight", "--json", "--nproc-per-node=16", str(script)]
    result = run_bounded(argv, PREFLIGHT_BOUND_S, cwd=REPO)
    assert result.returncode == 1, result.output[-3000:]
    finding = json.loads(result.output)["findings"][0]
    assert finding["cause"] == "rank-conditional-collective"
    assert finding["site"] == "playbooks/rank-conditional-collective/repro.py:39"
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], list(range(1, 16)))


def test_probe_with_no_ranks_is_a_usage_error() -> None:
    argv = [sys.executable, "-m", "ncclcheck", "probe", "--nproc-per-node", "0"]
    result = run_bounded(argv, WAIT_S, cwd=REPO)
    assert result.returncode == 2, result.output
    assert "--nproc-per-node must be at least 1, not 0" in result.output
