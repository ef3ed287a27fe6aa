"""Shared helpers: run real processes with a bound, and always reap them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ncclcheck.launch.proctree import kill_tree
from ncclcheck.settings import NCCL_DEFAULT_TIMEOUT_S, TOTAL_TIMEOUT_S, WARM_START_ENV

REPO = Path(__file__).resolve().parent.parent
PLAYBOOKS = REPO / "playbooks"
FRAMEWORKS = REPO / "examples" / "frameworks"
SCRIPTS = REPO / "tests" / "scripts"

# Bounds on the processes the tests run. They matter only when something is broken (a
# passing run ends long before them), so none is tighter than the product's own limit for
# the command, and waits are generous: on a loaded machine (the suite's workers, or other
# work beside them) torch's import alone can take 30 s and more.
# preflight: its own limit on the dry run (TOTAL_TIMEOUT_S), and a minute to stop and report
PREFLIGHT_BOUND_S = TOTAL_TIMEOUT_S + 60
# a wait for something to be seen (ranks started, a file written, a hang settled), or for a
# command with no limit of its own that ends by itself (doctor's looks, a usage error)
WAIT_S = 300.0
# The process-group timeout a real job's script is given (REPRO_TIMEOUT_S, where it reads
# it): NCCL's default, so that no collective times out for a rank that is only slow; and the
# bound on such a job: that timeout, and a minute for torchrun to stop the ranks.
JOB_PG_TIMEOUT_S = int(NCCL_DEFAULT_TIMEOUT_S)
JOB_BOUND_S = JOB_PG_TIMEOUT_S + 60


@dataclass
class Completed:
    returncode: int | None  # None: killed at the bound
    output: str
    elapsed: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_bounded(
    argv: list[str], bound_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Completed:
    """Run argv in its own session; at the bound, kill the whole session and report it."""
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    returncode: int | None = None
    try:
        output, _ = proc.communicate(timeout=bound_s)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        # torchrun's ranks live in sessions of their own: kill the whole tree.
        kill_tree(proc.pid)
        output, _ = proc.communicate(timeout=30)
    finally:
        kill_tree(proc.pid)
    return Completed(returncode, output, time.monotonic() - start)


# What torch 2.13 (CPU, gloo) prints when a rank aborts in its C++ teardown at exit, after
# the script's own work is done: seen about once in 10 to 40 runs of scripts that end
# cleanly (with or without destroy_process_group first), more often on a loaded machine.
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_to_its_end(
    argv: list[str], bound_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Completed:
    """Run a script that should end cleanly (a fixed twin) under ``run_bounded``. A run whose
    only fault is gloo's teardown abort is run again, up to three runs in all: the tests
    ask whether the script runs to its end, not how torch tears a process down. A hang, a
    timeout or any other failure is returned at once."""
    result = run_bounded(argv, bound_s, env=env, cwd=cwd)
    for _retry in range(2):
        if result.returncode == 0 or result.timed_out or GLOO_TEARDOWN_ABORT not in result.output:
            break
        result = run_bounded(argv, bound_s, env=env, cwd=cwd)
    return result


# what preflight lists of a path the run did not take (explain/coverage.py): the broken side
# a MODE=fixed twin's file still holds
BROKEN_SIDE_NOT_RUN = (
    "a decision each rank takes on a value of its own",
    "no rank caught an error there",
)


def aligned_but_for_decisions(returncode: int | None, report: dict[str, Any]) -> None:
    """A run of a fixed twin that shares its file with the broken one (MODE=fixed): no error,
    and aligned, or partial only for the broken side (a decision on a rank's own value, a
    handler that swallows an error), which the file still holds and preflight lists as not
    checked (explain/coverage.py)."""
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert not errors, errors
    if report["verdict"] == "partial":
        assert returncode == 5, report
        gaps = report["summary"]["not_run"]
        assert gaps and all(any(said in gap for said in BROKEN_SIDE_NOT_RUN) for gap in gaps), gaps
    else:
        assert (returncode, report["verdict"]) == (0, "aligned"), report


def line_in(path: Path, fragment: str) -> int:
    """The number of the one line of ``path`` that holds ``fragment``."""
    (number,) = [n for n, text in enumerate(path.read_text().splitlines(), 1) if fragment in text]
    return number


def cause_site_ranks(finding: dict[str, Any]) -> tuple[str, str, list[int], list[int]]:
    """What a finding says, as tests compare it: the cause, the site, the ranks it sets
    apart and the ranks absent from the call."""
    return finding["cause"], finding["site"], finding["ranks"], finding["absent_ranks"]


def torchrun_argv(script: Path, nproc: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script),
        *args,
    ]


def ncclcheck(
    *args: str, env: dict[str, str] | None = None, bound_s: float = PREFLIGHT_BOUND_S
) -> tuple[Completed, Any]:
    """``python -m ncclcheck ARGS`` from the repository root, bounded; with the JSON
    document it printed, when it printed one (``--json``), else None."""
    import json

    result = run_bounded([sys.executable, "-m", "ncclcheck", *args], bound_s, env=env, cwd=REPO)
    return result, (json.loads(result.output) if result.output.startswith("{") else None)


def processes_marked(mark: str) -> list[int]:
    """The live processes whose environment carries NCCLCHECK_TEST_MARK=mark: what a
    command started and failed to reap."""
    import psutil

    left = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("NCCLCHECK_TEST_MARK") == mark:
                left.append(proc.pid)
        except psutil.Error:
            continue
    return left


TEST_MARK = "NCCLCHECK_TEST_MARK"


@pytest.fixture(autouse=True)
def mark_processes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every process a test starts inherits a mark of that test: the checks for what a
    command left behind look at this test's processes only, while other tests run the
    same scripts at the same time (pytest-xdist's workers)."""
    import hashlib

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    mark = f"{worker}-{hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12]}"
    monkeypatch.setenv(TEST_MARK, mark)
    return mark


WARM_START = WARM_START_ENV  # preflight's --warm-start, read from the environment


@pytest.fixture(autouse=True)
def warm_start(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """``@pytest.mark.warm_start`` (on a module or a test; ``warm_start(False)`` on a test
    takes it back), unless NCCLCHECK_TEST_WARM_START=0: every preflight the test runs
    forks its ranks from one interpreter that imported torch once (--warm-start), half
    the CPU of torchrun starting an interpreter per rank. For tests whose subject is
    what the ranks do and what preflight makes of it; how torchrun starts, stops and
    reaps ranks is tested without it (the per-playbook tests, test_launchers,
    test_stop_signals, test_outside_waits, ...)."""
    marker = request.node.get_closest_marker("warm_start")
    # NCCLCHECK_TEST_WARM_START=0: every dry run through torchrun, as preflight's default
    wanted = os.environ.get("NCCLCHECK_TEST_WARM_START") != "0"
    warm = wanted and marker is not None and marker.args != (False,)
    if warm:
        monkeypatch.setenv(WARM_START, "1")
    else:
        monkeypatch.delenv(WARM_START, raising=False)
    return warm


def is_this_tests(proc: Any) -> bool:
    """Whether a psutil process carries the running test's mark (mark_processes)."""
    import psutil

    try:
        return bool(proc.environ().get(TEST_MARK) == os.environ.get(TEST_MARK))
    except psutil.Error:
        return False


@pytest.fixture
def signals_not_ignored() -> Iterator[None]:
    """A test that stops a command with a signal runs it as from a terminal. Where pytest
    itself runs with a stop signal ignored (SIGINT in a shell's background job, SIGHUP under
    nohup), what it starts inherits that, and the command keeps ignoring it, as a caller
    who asks that wants: a handler that does nothing keeps pytest as it was, and is reset
    to the default in what it starts."""
    import signal

    stops = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    ignored = [stop for stop in stops if signal.getsignal(stop) is signal.SIG_IGN]
    for stop in ignored:
        signal.signal(stop, lambda *_: None)
    yield
    for stop in ignored:
        signal.signal(stop, signal.SIG_IGN)


@pytest.fixture(scope="session")
def catalogue():  # type: ignore[no-untyped-def]
    from ncclcheck.catalogue import load_catalogue

    return load_catalogue(PLAYBOOKS)


def pytest_configure(config: pytest.Config) -> None:
    """The suite's processes write their temporary files in a folder of this session's
    (each xdist worker has its own), removed at the end: the scripts the tests run make
    checkpoints and trainer folders there, and a test that kills a hung job leaves them."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="ncclcheck-tests-")
    config.stash[_SESSION_TMP] = (folder, os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil
    import tempfile

    if _SESSION_TMP not in config.stash:
        return
    folder, before = config.stash[_SESSION_TMP]
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before
    tempfile.tempdir = None
    shutil.rmtree(folder, ignore_errors=True)


_SESSION_TMP = pytest.StashKey[tuple[str, "str | None"]]()


def _cpu_spent() -> float:
    """This process's CPU and that of every process it started and reaped (torchrun reaps
    its ranks, the CLI its torchrun)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPU_AT_SETUP = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_CPU_AT_SETUP] = _cpu_spent()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """The CPU each test spent, fixtures included: a ``cpu_s`` property in the JUnit XML
    (``PYTEST_ARGS=--junitxml=...``), the measure to cut when the suite grows past its 20
    minutes (README): on two cores the suite's time is its CPU, not its waits. A fixture
    shared by several tests is counted where it is set up and torn down."""
    yield
    if _CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_spent() - item.stash[_CPU_AT_SETUP], 2)))
