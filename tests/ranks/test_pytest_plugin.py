"""The pytest plugin, through pytest's own pytester: marked tests run on real ranks and
fail with ncclcheck's cause and site, without a stray process; assert_aligned runs
preflight on a playbook's scripts."""

from __future__ import annotations

import os
import uuid

import pytest

from ncclcheck.settings import TOTAL_TIMEOUT_S

from ..conftest import PLAYBOOKS, SCRIPTS, WAIT_S, WARM_START, processes_marked

# the plugin's runs fork their ranks warm (NCCLCHECK_WARM_START, conftest), as a CI job may
pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]

# What bounds a pytester run: the plugin's own limit on each dry run it makes, a marked
# test's (the marker's timeout=300) or an assert_aligned call's (preflight's TOTAL_TIMEOUT_S),
# and a minute to start and report. Such a bound matters only when something is broken.
MARKED_TEST_LIMIT_S = 300.0


def bound(marked_tests: int = 0, assert_aligned_calls: int = 0) -> float:
    return marked_tests * MARKED_TEST_LIMIT_S + assert_aligned_calls * TOTAL_TIMEOUT_S + 60


RANK_TESTS = """
import pytest
import torch
import torch.distributed as dist


def mean_metric(value):
    tensor = torch.tensor([value])
    dist.all_reduce(tensor)
    return tensor.item() / dist.get_world_size()


@pytest.mark.ncclcheck(nproc=2)
def test_aligned(rank, world_size, tmp_path):
    assert world_size == 2
    assert mean_metric(float(rank)) == 0.5
    (tmp_path / f"rank-{rank}").write_text("seen")  # the same folder on every rank


@pytest.mark.ncclcheck(nproc=2)
def test_only_rank_zero_reduces(rank):
    if rank == 0:
        mean_metric(1.0)
    dist.barrier()


@pytest.mark.ncclcheck(nproc=2)
@pytest.mark.parametrize("size", [3])
def test_gathers_another_shape_on_rank_one(rank, size):
    gathered = [torch.zeros(size) for _ in range(2)]
    dist.all_gather(gathered, torch.ones(size + rank))


@pytest.mark.ncclcheck(nproc=2)
def test_one_rank_disagrees(rank):
    mean_metric(1.0)
    assert rank == 0, "rank 1 disagrees"


@pytest.fixture
def lock():
    import threading

    return threading.Lock()


@pytest.mark.ncclcheck(nproc=2)
def test_wants_an_unpicklable_fixture(lock):
    pass
"""


@pytest.mark.timeout(bound(marked_tests=4) + 120)  # above the suite's per-test limit
def test_marked_tests_run_on_ranks_and_fail_with_the_cause_and_site(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    mark = uuid.uuid4().hex
    monkeypatch.setenv("NCCLCHECK_TEST_MARK", mark)
    path = pytester.makepyfile(test_on_ranks=RANK_TESTS)
    lines = path.read_text().splitlines()

    def line_of(fragment: str) -> int:
        return next(number for number, text in enumerate(lines, 1) if fragment in text)

    # four of its tests start ranks (the fifth fails before any); how each ended, a finding
    # and not the plugin's time limit, is in what the failures say below
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=bound(marked_tests=4))
    assert processes_marked(mark) == []
    result.assert_outcomes(passed=1, failed=4, errors=0)
    output = result.stdout.str()
    (seen_by_rank_one,) = pytester.path.rglob("rank-1")  # tmp_path: one folder for every rank
    assert (seen_by_rank_one.parent / "rank-0").read_text() == "seen"

    reduces = line_of("dist.all_reduce(tensor)")
    result.stdout.fnmatch_lines(
        [
            "*_ test_only_rank_zero_reduces _*",
            "ncclcheck found rank-conditional-collective (2 ranks)",
            f"error rank-conditional-collective at test_on_ranks.py:{reduces}",
            "*only rank 0 reached all_reduce*under `if rank == 0`*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_gathers_another_shape_on_rank_one?3? _*",
            "error collective-shape-mismatch at test_on_ranks.py:" + str(line_of("dist.all_gather(")),
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_one_rank_disagrees _*",
            "ncclcheck found rank-exception (2 ranks)",
            "*AssertionError: rank 1 disagrees*",
        ]
    )
    # a fixture that cannot travel to the ranks: a usage error, named, and no ranks started
    assert "fixture 'lock' cannot be sent to the ranks" in output
    assert "call chain on rank 0: test_only_rank_zero_reduces()" in output  # the runner is not shown


def test_unknown_marker_options_are_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.ncclcheck(procs=2)
        def test_x():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=WAIT_S)
    assert result.ret != 0
    assert "test_x: unknown ncclcheck marker option(s) ['procs']" in result.stderr.str()
    assert "collected 1 item" in result.stdout.str() and "no tests ran" in result.stdout.str()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ("ranks=[3]", "nproc_per_node, ranks and all_ranks go with world_size=W"),
        ("nproc=2, world_size=64", "ncclcheck(nproc=..., world_size=...): give one of them"),
        (
            "world_size=16, ranks=[16]",
            "ncclcheck(world_size=16): nproc_per_node at least 1 and ranks below 16",
        ),
        ("world_size=0", "ncclcheck(world_size=0): 1 to 16384 ranks"),
    ],
)
def test_virtual_world_options_that_cannot_be_run_are_a_usage_error(
    pytester: pytest.Pytester, options: str, said: str
) -> None:
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.ncclcheck({options})\ndef test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=WAIT_S)
    assert result.ret != 0
    assert said in result.stderr.str()


VIRTUAL_TESTS = """
import pytest
import torch
import torch.distributed as dist

SAMPLES = 1000


@pytest.mark.ncclcheck(world_size=64)
def test_every_rank_reduces_alike(rank, world_size, local_rank):
    assert world_size == dist.get_world_size() == 64
    assert local_rank == rank % 8  # 8 ranks per virtual node by default
    dist.all_reduce(torch.ones(2))


@pytest.mark.ncclcheck(world_size=48, nproc_per_node=8)
def test_a_hand_split_eval_set(rank, world_size):
    # 1,000 samples over 48 ranks: ranks below 1000 % 48 = 40 hold one sample more
    for _ in range(rank, SAMPLES, world_size):
        dist.all_reduce(torch.ones(1))
"""


def test_a_marked_test_runs_as_ranks_of_a_virtual_world(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_virtual=VIRTUAL_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=bound(marked_tests=2))
    output = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert "(ranks of a virtual world of 48)" in output
    # ranks 0-39 hold 21 samples, the last node's (40-47) 20: they part at the 21st
    # all_reduce, and the source names the loop whose iterable is computed from the rank
    assert "ranks 0,7-8,15 made one all_reduce more than ranks 40,47 in the loop" in output, output[-4000:]
    assert "`for _ in range(rank, SAMPLES, world_size)`" in output


@pytest.mark.timeout(bound(assert_aligned_calls=3) + 120)  # above the suite's per-test limit
def test_assert_aligned_fails_on_a_repro_and_passes_on_its_fix(pytester: pytest.Pytester) -> None:
    folder = PLAYBOOKS / "uneven-eval-batches"
    pytester.makepyfile(
        f"""
        import os

        from ncclcheck.pytest_plugin import assert_aligned

        def test_repro():
            assert_aligned({str(folder / "repro.py")!r}, nproc=2)

        def test_fixed():
            report = assert_aligned({str(folder / "fixed.py")!r}, nproc=2)
            assert report.verdict.value == "aligned"
            # NCCLCHECK_WARM_START holds here as for the CLI
            warm = report.summary.get("launcher", "").startswith("--warm-start")
            assert warm == (os.environ.get({WARM_START!r}) == "1"), report.summary

        def test_cut_short():  # its time limit ends the dry run mid-eval: not a pass
            # (a short limit: the time limit is what this test is about)
            assert_aligned({str(SCRIPTS / "long_sync_loop.py")!r}, nproc=2, timeout=8)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=bound(assert_aligned_calls=3))
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*_ test_repro _*",
            "ncclcheck found uneven-eval-batches in *repro.py (2 ranks)",
            "error uneven-eval-batches*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*_ test_cut_short _*",
            "ncclcheck did not finish its dry run in *long_sync_loop.py (2 ranks)",
            "*incomplete: the dry run reached ncclcheck's time limit*",
        ]
    )
    assert os.environ.get("NCCLCHECK_TRACE_DIR") is None
