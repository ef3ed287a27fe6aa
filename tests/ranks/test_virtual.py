"""preflight --world-size: ranks of a large world on one machine, on torch's fake
process group (launch/virtual.py, record/virtual.py), against real gloo ranks."""

from __future__ import annotations

import pytest

from ..conftest import SCRIPTS, line_in
from .test_preflight import PLAYBOOK_IDS, leftover_ranks, preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)

SPLIT = SCRIPTS / "virtual" / "eval_split_by_hand.py"
# Seen only as ranks that wait: a virtual rank never does. A straggler and a stuck
# transport are timing; the repro of collective-order-mismatch makes the same calls per
# group on every rank, in another order across two groups, a deadlock only where
# each rank blocks in its first one.
TIMING_ONLY = {"straggler", "transport-hang", "collective-order-mismatch"}


def test_an_eval_split_that_is_uneven_only_at_the_production_size_is_found_there() -> None:
    proc, report = preflight("--nproc-per-node=2", str(SPLIT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"  # 10,000 samples over 2 ranks: 5,000 each

    proc, report = preflight("--world-size=48", str(SPLIT))
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert report["world_size"] == 48
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert (
        finding["site"]
        == f"tests/scripts/virtual/eval_split_by_hand.py:{line_in(SPLIT, 'dist.all_reduce(batch)')}"
    )
    ran = {state["rank"] for state in report["ranks"]}
    # rank 0, the last rank, nodes 0, 1 and 5's ends, and where 10,000 % 48 = 16 splits the counts
    assert ran == {0, 7, 8, 15, 16, 40, 47}, ran
    assert set(finding["ranks"]) == {0, 7, 8, 15} and set(finding["absent_ranks"]) == {16, 40, 47}
    assert (
        "rank 16: the first rank with one sample fewer of an eval set of 10000"
        in report["summary"]["virtual"]
    )
    batches = {state["rank"]: state["eval_batches"] for state in report["ranks"]}
    assert batches[15] == 28 and batches[16] == 26  # 14 and 13 batches, two epochs

    proc, report = preflight("--world-size=48", str(SPLIT), env={"MODE": "fixed"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    assert not leftover_ranks(str(SPLIT))


def test_more_ranks_than_eval_samples_is_found_at_the_production_size() -> None:
    few = {"VAL_SAMPLES": "40"}
    proc, report = preflight("--nproc-per-node=2", str(SPLIT), env=few)
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]  # 20 each

    proc, report = preflight("--world-size=64", str(SPLIT), env=few)
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert 39 in finding["ranks"] and 40 in finding["absent_ranks"], finding
    summary = report["summary"]["virtual"]
    assert "rank 39: the last rank with a sample of an eval set of 40" in summary
    assert "rank 40: the first rank with no sample of an eval set of 40" in summary
    batches = {state["rank"]: state["eval_batches"] for state in report["ranks"]}
    assert (batches[39], batches[40]) == (2, 0)  # one batch per epoch against none

    proc, report = preflight("--world-size=64", str(SPLIT), env={**few, "MODE": "fixed"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]


def test_a_leaders_group_built_for_another_node_size_is_found_at_the_production_layout() -> None:
    script = SCRIPTS / "virtual" / "node_leaders.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]  # group [0]

    proc, report = preflight("--world-size=64", "--nproc-per-node=8", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["site"] == (
        f"tests/scripts/virtual/node_leaders.py:{line_in(script, 'dist.all_reduce(grad, group=leaders)')}"
    ), finding
    # ranks 4 and 60 run because rank 0 called on their group: members, not leaders
    assert (finding["ranks"], finding["absent_ranks"]) == ([0, 8, 56], [4, 60]), finding
    assert "rank 4: the second member of the group of ranks 0,4,...,60" in report["summary"]["virtual"]

    proc, report = preflight("--world-size=64", "--nproc-per-node=8", str(script), env={"FIXED": "1"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]


def test_a_data_parallel_broadcast_on_the_first_replica_only_is_found_from_16_ranks() -> None:
    """Tensor-parallel groups of 8, data-parallel groups across them: up to 8 ranks there
    is one replica and the broadcast over a one-member group completes; at 64 ranks of 8
    per node rank 0 broadcasts to ranks 8, ..., 56, which never call it."""
    script = SCRIPTS / "virtual" / "tensor_parallel_eval.py"
    proc, report = preflight("--nproc-per-node=2", str(script))
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]

    proc, report = preflight("--world-size=64", "--nproc-per-node=8", str(script))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "rank-conditional-collective", finding
    assert finding["site"] == (
        f"tests/scripts/virtual/tensor_parallel_eval.py:{line_in(script, 'dist.broadcast(val_loss, src=')}"
    ), finding
    assert (finding["ranks"], finding["absent_ranks"]) == ([0], [8, 56]), finding
    assert "under `if dp_rank == 0`" in finding["message"]
    said = report["summary"]["virtual"]
    assert any(
        "rank 56:" in line and "the last member of the group of ranks 0,8,...,56" in line for line in said
    )

    proc, report = preflight("--world-size=64", "--nproc-per-node=8", str(script), env={"FIXED": "1"})
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]


def test_a_virtual_world_skips_rank_0s_leading_eval_batches_and_still_finds_an_uneven_end() -> None:
    """768,016 samples split by hand over 48 ranks: 1,001 batches on ranks 0-15, 1,000 on
    the others. Rank 0 runs first and its skip (1,001 - 8) is every virtual rank's: ranks
    with 1,000 run 7 batches to its 8, the uneven end as with every batch run."""
    proc, report = preflight("--world-size=48", str(SPLIT), env={"VAL_SAMPLES": "768016"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = report["findings"][0]
    assert finding["cause"] == "uneven-eval-batches", finding
    assert set(finding["ranks"]) == {0, 7, 8, 15} and set(finding["absent_ranks"]) == {16, 40, 47}
    batches = {state["rank"]: state["eval_batches"] for state in report["ranks"]}
    assert (batches[15], batches[16]) == (2 * 1001, 2 * 1000)  # two epochs, the loader's own counts
    assert report["summary"]["eval_fast_forward"] == [
        "val_loader: the first 993 of 1001 batches skipped on every rank (not loaded), the rest run for real"
    ]


@pytest.mark.parametrize(
    ("script", "fixed"),
    [
        ("eval_split_by_hand.py", {"MODE": "fixed"}),
        ("node_leaders.py", {"FIXED": "1"}),
        ("tensor_parallel_eval.py", {"FIXED": "1"}),
    ],
)
def test_the_fixed_world_size_scripts_are_aligned_on_two_real_ranks_too(
    script: str, fixed: dict[str, str]
) -> None:
    """Their fixes are checked at the production size above; here at the CI size."""
    proc, report = preflight("--nproc-per-node=2", str(SCRIPTS / "virtual" / script), env=fixed)
    assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-2000:]


@pytest.mark.parametrize("cause", sorted(set(PLAYBOOK_IDS) - TIMING_ONLY))
def test_every_repro_gives_the_same_finding_virtual_as_real(catalogue, cause: str) -> None:
    playbook = catalogue.get(cause)
    expect = playbook.repro
    nproc = expect.nproc
    proc, report = preflight(f"--world-size={nproc}", f"--nproc-per-node={nproc}", str(playbook.repro_path))
    assert proc.returncode == 1, proc.stderr[-2000:]
    finding = next(f for f in report["findings"] if f["severity"] == "error")
    assert finding["cause"] == cause, finding
    site_file = (playbook.folder / expect.site_file).relative_to(playbook.folder.parent.parent)
    assert finding["site"] == f"{site_file}:{expect.site_line(playbook.folder)}", finding
    assert (finding["ranks"], finding["absent_ranks"]) == (expect.ranks, expect.absent_ranks), finding


@pytest.mark.parametrize("cause", sorted(set(PLAYBOOK_IDS) - TIMING_ONLY))
def test_every_fixed_playbook_is_aligned_in_a_large_world(catalogue, cause: str) -> None:
    """No false divergence from the fake group: collective-shape-mismatch's fix gathers
    the lengths, pads to the longest and gathers again; with each rank's own lengths
    (the fake all_gather's) every rank padded to another shape, until all_gather's
    result became rank 0's on every rank, as an all_reduce's is."""
    fixed = catalogue.get(cause).fixed_path
    proc, report = preflight("--world-size=64", str(fixed))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned", report["findings"]


def test_early_stopping_on_an_all_reduced_loss_is_no_divergence_in_a_large_world(catalogue) -> None:
    fixed = catalogue.get("unsynchronized-decision").fixed_path
    proc, report = preflight("--world-size=256", str(fixed))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["verdict"] == "aligned"
    ran = {state["rank"] for state in report["ranks"]}
    assert {0, 7, 8, 15, 248, 255} <= ran and len(ran) < 16, ran  # the default subset, not 256
    assert not leftover_ranks(str(fixed))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--world-size=4", "--nproc-per-node=8"], "is below --nproc-per-node 8"),
        (["--world-size=100000"], "above the most a virtual world takes"),
        (["--world-size=8", "--ranks=9"], "--ranks 9 is not a rank of a world of 8"),
    ],
)
def test_a_world_that_cannot_be_made_is_refused(args: list[str], said: str) -> None:
    proc, _ = preflight(*args, str(SPLIT))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr


def test_a_script_with_a_store_of_its_own_is_refused() -> None:
    script = SCRIPTS / "virtual" / "own_store.py"
    proc, _ = preflight("--world-size=8", str(script))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "sets up its own process group" in proc.stderr and "Traceback" not in proc.stderr
    assert not leftover_ranks(str(script))
