"""examples/keep-it-fixed, whose output the README shows: the guard's layers on the
uneven-eval-batches reproducer, on real ranks."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from ncclcheck.settings import TOTAL_TIMEOUT_S

from ..conftest import JOB_BOUND_S, REPO, run_bounded, torchrun_argv

pytestmark = pytest.mark.ranks
EXAMPLE = REPO / "examples" / "keep-it-fixed"
REPRO = REPO / "playbooks" / "uneven-eval-batches" / "repro.py"


def test_aligned_phase_stops_every_rank_with_the_counts() -> None:
    env = {**os.environ, "GUARD": "phase", "PYTHONPATH": str(REPO)}
    result = run_bounded(torchrun_argv(EXAMPLE / "guarded.py", 4), JOB_BOUND_S, env=env, cwd=REPO)
    raised = re.findall(r"\[rank(\d)\]: ncclcheck\.guard\.MisalignedPhase: (.*)", result.output)
    assert sorted(rank for rank, _ in raised) == ["0", "1", "2", "3"], result.output
    assert {message for _, message in raised} == {
        'phase \'eval\' is not aligned across ranks (rank 0: {"steps": 4}; ranks 1-3: {"steps": 3}): '
        "the ranks with more steps would wait forever at a collective the others never make"
    }


def test_the_watchdog_reports_where_every_rank_waits(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GUARD": "watchdog",
        "PYTHONPATH": str(REPO),
        "NCCLCHECK_WATCHDOG_DIR": str(tmp_path),
    }
    result = run_bounded(torchrun_argv(EXAMPLE / "guarded.py", 4), JOB_BOUND_S, env=env, cwd=REPO)
    assert result.returncode not in (0, None)
    # ended by the watchdog's abort (10 s), not by the process group's timeout (600 s)
    assert result.elapsed < 500, result.elapsed
    report = (tmp_path / "rank-00000.txt").read_text()
    assert "rank 0 has waited" in report and "in all_reduce (call #4 on group 0, ranks 0-3)" in report
    assert f"site:   {REPRO.relative_to(REPO)}:35 in mean_across_ranks()" in report
    assert "ranks 1-3: barrier #4 on group 0 at examples/keep-it-fixed/guarded.py:" in report
    assert "likely: rank 0 still in evaluation while ranks 1-3 left it" in report
    for rank in (1, 2, 3):  # every rank wrote its own part before the job stopped
        assert "in barrier (call #4" in (tmp_path / f"rank-{rank:05d}.txt").read_text()


# the example's pytest run: an assert_aligned call (preflight's limit, TOTAL_TIMEOUT_S) and
# two marked tests (the plugin's limit on each, its marker's timeout=300), and a minute
CI_LAYER_BOUND_S = TOTAL_TIMEOUT_S + 2 * 300 + 60


@pytest.mark.timeout(CI_LAYER_BOUND_S + 120)  # above the suite's per-test limit
@pytest.mark.warm_start  # the plugin forks the ranks warm (NCCLCHECK_WARM_START), as a CI job may
def test_the_ci_layer_passes_the_fix_and_flags_the_shards() -> None:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLE)]
    result = run_bounded(argv, CI_LAYER_BOUND_S, cwd=EXAMPLE)
    assert result.returncode == 0, result.output
    assert "2 passed, 1 xfailed" in result.output
