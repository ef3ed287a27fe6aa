"""doctor on training scripts as people write them (a class-based trainer with the rank
from the environment, accelerate, Lightning Fabric, a plain loop with early stopping),
each with one bug users report, hung under plain torchrun; and each fixed twin, which
preflight finds aligned and lets run to its end. Real processes, real py-spy."""

from __future__ import annotations

import pytest

from ..conftest import REPO, SCRIPTS, line_in
from .test_doctor import doctor_on_hung
from .test_preflight import leftover_ranks, preflight

pytestmark = [pytest.mark.ranks, pytest.mark.warm_start]  # preflight forks its ranks warm (conftest)

REAL = SCRIPTS / "real"

# script -> (cause, the line holding the site, ranks that did it, ranks that did not)
SHAPES = {
    "trainer_checkpoint_on_local_rank.py": (
        "rank-conditional-collective",
        "dist.barrier()  # every rank waits",
        [0],
        [1],
    ),
    "accelerate_hand_split_validation.py": (
        "uneven-eval-batches",
        "accelerator.gather_for_metrics(",
        [0],
        [1],
    ),
    "fabric_skip_nonfinite_backward.py": ("data-dependent-branch", "    fabric.backward(loss)", [0], [1]),
    # the break that ended the loop on rank 1, under the stopping test on its own loss
    "early_stop_on_local_loss.py": ("unsynchronized-decision", "            break", [1], [0]),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_doctor_names_cause_site_and_ranks_on_a_real_script(name: str) -> None:
    cause, fragment, ranks, absent = SHAPES[name]
    script = REAL / name
    code, report = doctor_on_hung(script, 2)
    assert code == 1, report
    finding = report["findings"][0]
    assert finding["cause"] == cause, finding
    assert finding["site"] == f"tests/scripts/real/{name}:{line_in(script, fragment)}", finding
    assert (finding["ranks"], finding["absent_ranks"]) == (ranks, absent), finding


# a twin whose loop outlasts the dry run's most train passes (50 epochs, stopped early
# on the all-reduced loss): partial, what ran aligned, its end said not checked
PAST_THE_PASS_LIMIT = {"early_stop_on_local_loss.py"}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_fixed_twin_is_aligned_and_runs_to_its_end(name: str) -> None:
    """No false alarm on the fix, and the ground truth under it: with a budget past the
    script's end, preflight lets every rank run to its end, exit 0."""
    fixed = REAL / name.replace(".py", "_fixed.py")
    proc, report = preflight(
        "--nproc-per-node=2", "--train-steps=100000", "--eval-passes=1000", str(fixed), cwd=REPO
    )
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    assert [state["exit_code"] for state in report["ranks"]] == [0, 0], report["ranks"]
    if name in PAST_THE_PASS_LIMIT:
        assert (proc.returncode, report["verdict"]) == (5, "partial"), proc.stderr[-3000:]
        assert report["summary"]["stopped"].startswith("stopped after 10 train passes"), report["summary"]
    else:
        assert (proc.returncode, report["verdict"]) == (0, "aligned"), proc.stderr[-3000:]
        assert report["summary"]["stopped"] == "the script ran to its end on every rank", report["summary"]
    assert not leftover_ranks(str(fixed))
