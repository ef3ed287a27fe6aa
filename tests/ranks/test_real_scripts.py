"""doctor on training scripts as people write them (a class-based trainer with the rank
from the environment, accelerate, Lightning Fabric, a plain loop with early stopping),
each with one bug users report, hung under plain torchrun; and each fixed twin, which
runs to its end. Real processes, real py-spy."""

from __future__ import annotations

import sys

import pytest

from ..conftest import JOB_BOUND_S, JOB_PG_TIMEOUT_S, REPO, SCRIPTS, line_in, run_to_its_end
from .test_doctor import doctor_on_hung

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


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_fixed_twin_runs_to_its_end(name: str) -> None:
    fixed = REAL / name.replace(".py", "_fixed.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(fixed)]
    env = {"REPRO_TIMEOUT_S": str(JOB_PG_TIMEOUT_S), "OMP_NUM_THREADS": "1"}
    done = run_to_its_end(argv, JOB_BOUND_S, env=env, cwd=REPO)
    assert done.returncode == 0, (done.returncode, round(done.elapsed), done.output[-3000:])
