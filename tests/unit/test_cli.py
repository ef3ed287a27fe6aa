"""The CLI through typer's CliRunner: help, version, playbooks, exit codes, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ncclcheck import __version__
from ncclcheck.cli import app

runner = CliRunner()


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args))


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"ncclcheck {__version__}"


def test_help_lists_every_command_of_the_contract() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in ("preflight", "doctor", "watch", "lint", "probe", "playbooks"):
        assert command in result.stdout


def test_no_arguments_shows_usage() -> None:
    result = invoke()
    assert "Usage: ncclcheck" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = invoke("bogus")
    assert result.exit_code == 2
    assert "No such command 'bogus'" in result.output


@pytest.mark.parametrize("value", ["0", "-3", "some"])
def test_eval_batches_is_a_count_or_all(value: str) -> None:
    result = invoke("preflight", "--eval-batches", value, "playbooks/uneven-eval-batches/repro.py")
    assert result.exit_code == 2
    assert f"Invalid value for --eval-batches: {value!r} is neither a count of batches" in result.output


def test_playbooks_lists_the_twelve_causes() -> None:
    result = invoke("playbooks")
    assert result.exit_code == 0
    assert "12 causes" in result.stdout
    assert "rank-conditional-collective" in result.stdout


def test_playbooks_json_is_one_document() -> None:
    result = invoke("playbooks", "--json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert len(data) == 12
    assert {"id", "title", "signals", "fix", "repro", "fixed"} <= set(data[0])


def test_one_playbook_renders_its_fix_in_three_layers() -> None:
    result = invoke("playbooks", "uneven-eval-batches")
    assert result.exit_code == 0
    for heading in ("Why it happens", "1. direct", "2. structural", "3. CI guard"):
        assert heading in result.stdout
    assert "DistributedSampler" in result.stdout


def test_unknown_playbook_is_exit_2_with_the_known_ids() -> None:
    result = invoke("playbooks", "no-such-cause")
    assert result.exit_code == 2
    assert "no playbook 'no-such-cause'" in result.stderr
    assert "rank-crashed" in result.stderr
    assert "Traceback" not in result.output


def test_an_internal_error_is_exit_3_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ncclcheck.cli.playbooks as module

    def boom(root=None):  # type: ignore[no-untyped-def]
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(module, "load_catalogue", boom)
    result = invoke("playbooks")
    assert result.exit_code == 3
    assert "internal error: ZeroDivisionError: boom" in result.stderr
    assert "report it at" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["playbooks"], 0),  # rich's console
        (["playbooks", "--json"], 0),
        (["lint", "playbooks/rank-conditional-collective/repro.py"], 1),  # line by line
        (["lint", "--json", "playbooks/rank-conditional-collective/repro.py"], 1),
    ],
)
def test_a_reader_that_leaves_early_does_not_change_the_exit_code(argv: list[str], code: int) -> None:
    """`ncclcheck lint . | head`: stdout's reader is gone before the first line; the
    command still ends with its verdict's code and prints no error of its own."""
    import os
    import subprocess
    import sys

    from ..conftest import REPO

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "ncclcheck", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        os.close(write_end)
    assert done.returncode == code, done.stderr
    assert "error" not in done.stderr.replace("1 error,", ""), done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_from_takes_every_path_a_shell_glob_gives_it() -> None:
    from ..conftest import REPO

    logs = REPO / "tests" / "fixtures" / "aftermath"
    done = invoke(
        "doctor", "--json", "--from", str(logs / "py_spy_dumps.txt"), str(logs / "faulthandler_rank1.txt")
    )
    assert done.exit_code == 1, done.output
    read = json.loads(done.stdout)["summary"]["read"]
    assert len(read) == 2 and "py_spy_dumps.txt" in read[0] and "faulthandler_rank1.txt" in read[1]
    stray = invoke("doctor", str(logs / "stopped_early.log"))
    assert stray.exit_code == 2 and "paths go after --from" in stray.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give the training script"),
        (["no/such/train.py"], "no/such/train.py: no such file"),
        (["--pid", "1", "train.py"], "not both"),
        (["--pid", "1", "--on-hang", "kill"], "--on-hang kill ends a job watch started"),
        (["--on-hang", "no-such-notifier", "train.py"], "not report, kill, or a command found on PATH"),
        (["--pid", "999999999"], "no process with pid 999999999"),
    ],
)
def test_watch_refuses_bad_input_in_one_line_with_exit_2(args: list[str], message: str) -> None:
    result = invoke("watch", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_ranks_the_launcher_ended_mid_script_make_the_run_unfinished(tmp_path: Path) -> None:
    """torchrun stops the other ranks when one rank's process fails, here at its exit
    after its script returned (torch 2.13's gloo teardown): the rank stopped mid-script
    did not run to its end, so the run is unfinished, not aligned."""
    from ncclcheck.commands.preflight import _why_unfinished
    from ncclcheck.evidence.traces import RankEnding, RankTrace
    from ncclcheck.launch.torchrun import LaunchResult
    from ncclcheck.record.tracefile import End

    returned = RankTrace(rank=1, exit=RankEnding(End.RETURNED, 0))
    traces = {0: RankTrace(rank=0), 1: returned}
    launch = LaunchResult(tmp_path, tmp_path / "torchrun.log", 1, rank_exits={0: -15, 1: -6})
    said = _why_unfinished(launch, traces)
    assert said == (
        "the launcher ended rank 0 before the script's end after rank 1's process failed at its "
        "exit (exit code -6), its script having returned"
    )
    # a rank that died in its script (no exit line, a signal) is a crash, a finding: not this
    died = LaunchResult(tmp_path, tmp_path / "torchrun.log", 1, rank_exits={0: -15, 1: -9})
    assert _why_unfinished(died, {0: RankTrace(rank=0), 1: RankTrace(rank=1)}) is None
    # ranks ended after their distributed work ended (stopped on purpose, or by the
    # launcher after destroy_process_group) left nothing unchecked
    assert _why_unfinished(launch, {0: RankTrace(rank=0, destroyed=True), 1: returned}) is None
    launch.after_distributed_s = 16.0
    assert _why_unfinished(launch, traces) is None


def test_watch_keeps_nccls_ras_report_where_the_command_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ncclcheck.commands.watch import _ras_report

    tools = tmp_path / "bin"
    tools.mkdir()
    ras = tools / "ncclras"
    ras.write_text("#!/bin/sh\necho 'Job summary'\necho '#0-0 (fa93) MISMATCH'\n")
    ras.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    folder = tmp_path / "hang"
    folder.mkdir()
    _ras_report(folder)
    assert (folder / "ncclras.txt").read_text().startswith("Job summary")
    # a RAS that fails (no NCCL job to ask) leaves no file
    ras.write_text("#!/bin/sh\necho 'cannot connect' >&2\nexit 1\n")
    (folder / "ncclras.txt").unlink()
    _ras_report(folder)
    assert not (folder / "ncclras.txt").exists()


def test_a_rank_ended_by_a_signal_is_said_by_the_signals_name_not_as_ended_from_outside() -> None:
    from ncclcheck.commands.preflight import _exit_said

    assert _exit_said(-6).startswith("SIGABRT (it aborted itself")
    assert _exit_said(-15) == "SIGTERM"
    assert _exit_said(1) == "exit code 1"
